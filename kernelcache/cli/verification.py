"""``kernelcache verify [--repair]``: check every entry of a root, and repair what can be.

What it prints for people is a summary whatever the damage: the problems counted by kind and
the first :data:`SHOWN` of them (``-v``: every one, ``--json``: every one, always), what the
repair did by kind of action, and what the quarantine holds afterwards (its files and bytes:
quarantined entries are moved there, not freed) with how to empty it.
"""

from __future__ import annotations

import argparse
from collections import Counter
from typing import TYPE_CHECKING

from .common import CHANGES, Context, Subparsers, add_command
from .maintenance import outcomes_human, result_json
from .output import (
    EXIT_OK,
    EXIT_PROBLEMS,
    Output,
    envelope,
    format_table,
    human_size,
    plural,
)

if TYPE_CHECKING:
    from ..maintenance.prune import Result
    from ..maintenance.records import AuxFile, Issue

#: the problems (and failed repairs) listed without ``-v``
SHOWN = 10
#: the kinds of problem that are an entry's (its metadata and artifact): counted with the
#: entries checked, beside those found ok; the other kinds are files of the root
ENTRY_PROBLEMS = ("corrupt", "outdated", "untrusted")
#: how each kind of repair action reads in the summary
_DONE = {
    "quarantine-entry": "corrupt entries moved to .quarantine/",
    "delete-entry": "outdated entries deleted",
    "remove-orphan": "orphan files removed",
    "remove-temp": "stale staging files removed",
    "remove-lock": "stale lock files removed",
}


def register(subparsers: Subparsers) -> None:
    p = add_command(
        subparsers,
        "verify",
        "check every entry's size, digest and metadata; find orphans, stale staging files and locks",
        uses=CHANGES,
    )
    p.add_argument(
        "--repair",
        action="store_true",
        help="quarantine corrupt entries; remove orphans, stale staging files and stale locks",
    )
    p.set_defaults(func=cmd_verify)


def _listed(rows: list[list[str]], verbose: bool, what: str) -> list[str]:
    """``rows`` as an indented table: all of them with ``verbose``, else the first
    :data:`SHOWN` and how to see the rest."""
    shown = rows if verbose else rows[:SHOWN]
    lines = ["  " + line for line in format_table(shown).splitlines()] if shown else []
    if len(shown) < len(rows):
        lines.append(f"  ... and {len(rows) - len(shown):,} more {what} (-v lists every one)")
    return lines


def _moved_bytes(before: set[str], after: tuple[AuxFile, ...]) -> int:
    """The bytes of the files a repair moved to the quarantine: those of ``after`` (the
    quarantine's files now) not in ``before`` (their paths then), less the notes saying why.
    Measured, never taken from a scan: an entry whose metadata cannot be read has an artifact
    the scan did not size."""
    return sum(f.size for f in after if f.path not in before and not f.path.endswith(".reason"))


def _repair_human(result: Result, moved: int, verbose: bool) -> list[str]:
    """What the repair did, by kind of action (``moved``: bytes moved to the quarantine); its
    failures; every outcome with ``verbose``."""
    done = Counter(o.action.kind for o in result.outcomes if o.status == "done")
    parts = [f"{n:,} {_DONE.get(kind, kind)}" for kind, n in sorted(done.items())]
    lines = [f"Repaired: {', '.join(parts) if parts else 'nothing'}."]
    if moved:
        lines[-1] += f" Moved {human_size(moved)} to the quarantine"
        lines[-1] += f"; freed {human_size(result.freed_bytes)}."
    elif result.freed_bytes:
        lines[-1] += f" Freed {human_size(result.freed_bytes)}."
    rest = outcomes_human(result, "")[1:]  # skipped, kept, failed: said as prune says them
    failed = [line for line in rest if line.startswith("  failed: ")]
    lines += [line for line in rest if not line.startswith("  failed: ")]
    if failed:
        lines += failed if verbose else failed[:SHOWN]
        if not verbose and len(failed) > SHOWN:
            lines.append(f"  ... and {len(failed) - SHOWN:,} more failures (-v lists every one)")
    if verbose:
        rows = [[o.action.kind, o.action.path, o.status] for o in result.outcomes]
        lines += ["  " + line for line in format_table(rows).splitlines()] if rows else []
    return lines


def _quarantine_line(files: tuple[AuxFile, ...]) -> str:
    from ..maintenance.prune import QUARANTINE_AGE

    held = sum(f.size for f in files)
    return (
        f"Quarantine: {plural(len(files), 'file')}, {human_size(held)} in .quarantine/, kept "
        f"{QUARANTINE_AGE / 86400:g} days for inspection (`kernelcache prune` removes older "
        "ones; `kernelcache prune --quarantine-age 0s` empties it now)."
    )


def cmd_verify(args: argparse.Namespace, out: Output) -> int:
    from ..maintenance.execute import execute
    from ..maintenance.prune import plan_repair
    from ..maintenance.scan import files_in, scan_store
    from ..maintenance.verify import verify
    from ..store.layout import QUARANTINE_DIR

    context: Context = args.context
    store = context.existing_store()
    root = store.root
    if args.repair:
        context.refuse_readonly(root, "verify --repair")
    base = scan_store(store)
    with out.progress("verifying", len(base.entries), changes=False) as tick:
        checked = verify(store, base, progress=tick)
    issues: list[Issue] = list(checked.issues)
    counts = dict(Counter(i.kind for i in issues))
    # a file the cache does not know is reported, and left alone: it is not the cache's damage
    foreign = counts.get("foreign", 0)
    # every entry checked: those found ok and those found wrong, by the scan or the read
    bad_entries = {kind: n for kind, n in counts.items() if kind in ENTRY_PROBLEMS}
    entries = len(checked.entries) + sum(bad_entries.values())
    result = None
    moved = 0  # bytes of entries moved to the quarantine, as its files measure them
    remaining = len(issues) - foreign
    if args.repair and remaining:
        context.require_writable(store)
        plan = plan_repair(checked)
        before = {f.path for f in files_in(store, QUARANTINE_DIR)}
        with out.progress("repairing", len(plan.actions)) as tick:
            result = execute(store, plan, progress=tick)
        moved = _moved_bytes(before, files_in(store, QUARANTINE_DIR))
        remaining = sum(1 for i in plan.left if i.kind != "foreign") + sum(
            1 for o in result.outcomes if o.status in ("in-use", "failed")
        )
    quarantine = files_in(store, QUARANTINE_DIR) if result is not None else base.quarantine
    doc = {
        **envelope("verify", root),
        "exists": checked.exists,
        "entries_checked": entries,
        "entries_ok": len(checked.entries),
        "problems": [i.to_json() for i in issues],
        "counts": counts,
        "repair": None if result is None else {**result_json(result), "quarantined_bytes": moved},
        "quarantine": {"files": len(quarantine), "bytes": sum(f.size for f in quarantine)},
        "clean": remaining == 0,
    }

    def human() -> str:
        verbose = args.verbose > 0
        found = [f"{len(checked.entries):,} ok"]
        found += [f"{n:,} {kind}" for kind, n in sorted(bad_entries.items())]
        lines = [
            f"Checked {plural(entries, 'entry')} under {root} (each one's metadata, size and "
            f"digest): {', '.join(found)}."
        ]
        if issues:
            by_kind = ", ".join(f"{n:,} {kind}" for kind, n in sorted(counts.items()))
            lines.append(f"Problems ({len(issues):,}): {by_kind}")
            lines += _listed([[i.kind, i.path, i.detail] for i in issues], verbose, "problems")
            if result is None and len(issues) > foreign:
                lines.append(
                    "Run `kernelcache verify --repair` to quarantine corrupt entries and remove "
                    "orphans, stale staging files and stale locks (foreign files are left alone)."
                )
            if foreign:
                lines.append(
                    f"{plural(foreign, 'foreign file')}: not the cache's; left alone (remove "
                    "what you do not need; the cache neither reads nor removes them)."
                )
        else:
            lines.append("No problems found.")
        if result is not None:
            lines += _repair_human(result, moved, verbose)
        if quarantine:
            lines.append(_quarantine_line(quarantine))
        return "\n".join(lines)

    out.emit(doc, human)
    return EXIT_OK if remaining == 0 else EXIT_PROBLEMS
