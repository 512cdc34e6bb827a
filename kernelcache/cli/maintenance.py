"""``kernelcache prune`` and ``clear``: remove what should go from a root (plan first, then
execute; ``verify`` is :mod:`.verification`).

``clear`` removes every entry of the writable root, as ``prune`` removes entries (each under its
key's lock); it asks first when standard input is a terminal (``--yes`` does not), and, like
``pip cache purge``, does not ask when it is not (scripts and CI). A ``prune`` whose criteria
would delete every kernel of the root (what it keeps of other kinds counts for nothing) asks
on a terminal and does nothing elsewhere without ``--yes``. Neither removes anything from a
root named read-only (``KERNELCACHE_READONLY_DIRS``).
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from ..capacity.usage import discard_usage
from ..store.layout import STATS_DIR
from .common import (
    CHANGES,
    Context,
    Subparsers,
    add_command,
    add_filters,
    age_arg,
    confirm_everything,
    size_arg,
)
from .output import (
    EXIT_OK,
    EXIT_PROBLEMS,
    NothingDone,
    Output,
    envelope,
    format_table,
    human_age,
    human_size,
    plural,
    printable,
)

if TYPE_CHECKING:
    from ..maintenance.prune import Plan, Result


def register(subparsers: Subparsers) -> None:
    p = add_command(
        subparsers,
        "prune",
        "plan, then remove entries by size cap (least recently used first) or age; clean up",
        uses=CHANGES,
    )
    p.add_argument(
        "--max-size",
        type=size_arg,
        metavar="SIZE",
        help="keep at most SIZE bytes of (matching) entries, e.g. 10G; 0 means no size cap, "
        "as in KERNELCACHE_MAX_SIZE",
    )
    p.add_argument(
        "--older-than",
        type=age_arg,
        metavar="AGE",
        help="remove (matching) entries not used for AGE, e.g. 30d",
    )
    add_filters(
        p,
        "; without --max-size or --older-than, every matching entry is deleted (a summary is "
        "printed first)",
    )
    p.add_argument(
        "--quarantine-age",
        type=age_arg,
        default=7 * 86400.0,
        metavar="AGE",
        help="remove quarantined files older than AGE (default 7d)",
    )
    p.add_argument("--dry-run", action="store_true", help="print the plan, change nothing")
    p.add_argument("--list", action="store_true", help="list every planned action")
    p.add_argument(
        "-y",
        "--yes",
        action="store_true",
        help="do it even when the plan deletes every kernel of the root (without it, such a "
        "prune asks on a terminal and does nothing elsewhere)",
    )
    p.set_defaults(func=cmd_prune)

    p = add_command(
        subparsers,
        "clear",
        "remove every entry of the root (never of read-only roots); asks first on a terminal",
        uses=CHANGES,
    )
    p.add_argument("--dry-run", action="store_true", help="say what would go, change nothing")
    p.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation")
    p.set_defaults(func=cmd_clear)


def outcomes_human(result: Result, verb: str) -> list[str]:
    lines = []
    counts = result.counts
    freed = human_size(result.freed_bytes)
    lines.append(f"{verb}: {counts.get('done', 0):,} done, {freed} freed")
    for status, what in (
        ("in-use", "in use by another process (skipped; try again later)"),
        ("used-since-plan", "used since the plan was made (kept)"),
        ("changed", "no longer what the plan selected, by their own metadata (kept)"),
        ("gone", "already gone or repaired meanwhile"),
        ("failed", "failed"),
    ):
        if counts.get(status):
            lines.append(f"  {counts[status]:,} {what}")
    for o in result.with_status("failed"):
        lines.append(f"  failed: {printable(o.action.path)}: {printable(o.detail)}")
    if result.plan.logs_to_fold or result.fold_error:
        lines.append(f"  statistics logs folded: {result.folded_logs}")
        if result.fold_error:
            lines.append(f"  could not fold statistics logs: {result.fold_error}")
    return lines


def result_json(result: Result) -> dict[str, Any]:
    return {
        "outcomes": [o.to_json() for o in result.outcomes],
        "counts": result.counts,
        "freed_bytes": result.freed_bytes,
        "quarantined_bytes": result.quarantined_bytes,
        "folded_logs": result.folded_logs,
        "fold_error": result.fold_error,
    }


def _plan_json(plan: Plan, result: Result | None) -> dict[str, Any]:
    """The ``plan``, ``left`` and ``result`` fields of ``prune`` and ``clear``."""
    return {
        "plan": {
            "actions": [  # (Action.to_json, inlined: a plan may hold an action per entry)
                {"action": kind, "path": path, "key": key, "size": size, "reason": reason}
                for kind, path, size, reason, key, _ in plan.actions
            ],
            "summary": plan.summary,
            "bytes_to_free": plan.bytes_to_free,
            "kept_entries": plan.kept_entries,
            "kept_bytes": plan.kept_bytes,
            "kept_kernels": plan.kept_kernels,
            "fold_logs": len(plan.logs_to_fold),
        },
        "left": [i.to_json() for i in plan.left],
        "result": result_json(result) if result is not None else None,
    }


_ACTION_WORDS = {
    "delete-entry": "delete {n:,} entries ({b}), least recently used first",
    "quarantine-entry": "quarantine {n:,} corrupt entries",
    "remove-orphan": "remove {n:,} orphan artifact files ({b})",
    "remove-temp": "remove {n:,} stale staging files ({b})",
    "remove-quarantined": "remove {n:,} old quarantined files ({b})",
    "remove-lock": "remove {n:,} stale lock files",
}


def cmd_prune(args: argparse.Namespace, out: Output) -> int:
    from ..maintenance.execute import execute
    from ..maintenance.prune import plan_prune, unmatched
    from ..maintenance.scan import in_directory, scan_store

    context: Context = args.context
    store = context.existing_store()
    root = store.root
    if not args.dry_run:
        context.refuse_readonly(root, "prune")
    scanned = scan_store(store)
    max_size = args.max_size or None  # one meaning of a size cap everywhere: 0 is no cap
    plan = plan_prune(
        scanned,
        max_size=max_size,
        older_than=args.older_than,
        kernels=args.kernel or (),
        targets=args.target or (),
        quarantine_age=args.quarantine_age,
    )
    missed = unmatched(scanned.table, args.kernel or (), args.target or ())

    def plan_text() -> str:
        lines = [f"Plan for {root}:"]
        if args.max_size == 0:
            lines.append("  --max-size 0: no size cap (as KERNELCACHE_MAX_SIZE=0)")
        lines += [f"  no entry matches {printable(f)}" for f in missed]
        for kind, v in plan.summary.items():
            lines.append("  " + _ACTION_WORDS[kind].format(n=v["count"], b=human_size(v["bytes"])))
        if plan.logs_to_fold:
            lines.append(
                f"  fold {plural(len(plan.logs_to_fold), 'statistics log')} of finished processes"
            )
        if not plan.actions and not plan.logs_to_fold:
            lines.append("  nothing to do")
        lines.append(f"Keeps {plural(plan.kept_entries, 'entry')} ({human_size(plan.kept_bytes)}).")
        if args.list:
            rows = [[a.kind, a.path, human_size(a.size), a.reason] for a in plan.actions]
            if rows:
                lines += ["  " + line for line in format_table(rows, right=(2,)).splitlines()]
        if plan.left:
            lines.append(f"{len(plan.left):,} other problems left alone (see kernelcache verify).")
        return "\n".join(lines)

    result = None
    if not args.dry_run and (plan.actions or plan.logs_to_fold):
        context.require_writable(store)
        if not out.json:  # the plan first, then the work (and its progress), then the outcome
            sys.stdout.write(plan_text() + "\n")
            sys.stdout.flush()
        doomed = plan.summary.get("delete-entry")
        asked = max_size is not None or args.older_than is not None or args.kernel or args.target
        if doomed and asked and _empties(plan) and not args.yes:
            confirm_everything("prune", _everything(root, plan), _hint(args, max_size))
        if doomed and max_size is None and args.older_than is None:
            # a filter and no limit: every match goes; say so before doing it
            which = " ".join(
                [
                    *(f"--kernel {k}" for k in args.kernel or ()),
                    *(f"--target {t}" for t in args.target or ()),
                ]
            )
            sys.stderr.write(
                f"kernelcache: no --max-size or --older-than: deleting all {doomed['count']:,} "
                f"entries ({human_size(doomed['bytes'])}) that match {printable(which)}\n"
            )
            sys.stderr.flush()
        with out.progress("pruning", len(plan.actions)) as tick:
            result = execute(store, plan, progress=tick)
        if result.freed_bytes:  # a size cap's running total: the next capped put measures
            in_directory(store, STATS_DIR, discard_usage, None)
    criteria = {
        "max_size": max_size,
        "older_than": args.older_than,
        "kernel": args.kernel or [],
        "target": args.target or [],
        "quarantine_age": args.quarantine_age,
    }
    doc = lambda: {  # noqa: E731 - built only for --json
        **envelope("prune", root),
        "dry_run": args.dry_run,
        "criteria": criteria,
        "unmatched": missed,
        **_plan_json(plan, result),
    }

    def human() -> str:
        if result is not None:  # the plan was printed before the work
            return "\n".join(outcomes_human(result, "Pruned"))
        lines = [plan_text()]
        if args.dry_run:
            lines.append("Dry run: nothing was changed.")
        return "\n".join(lines)

    out.emit(doc, human)
    failed = result is not None and (result.counts.get("failed") or result.fold_error)
    return EXIT_PROBLEMS if failed else EXIT_OK


def _hint(args: argparse.Namespace, max_size: int | None) -> str:
    """What a prune refused for deleting everything says last: what each option given selects,
    and what to give instead."""
    why = []
    if args.older_than is not None:
        age = human_age(args.older_than).removesuffix(" ago")
        why.append(
            f"--older-than {age} selects every entry not used for {age}: give a longer AGE to "
            "keep the recent ones, e.g. 30d"
        )
    if max_size is not None:
        why.append(
            f"--max-size {human_size(max_size)} keeps only what fits in it: give a larger SIZE; "
            "--max-size 0 means no size cap"
        )
    if not why:  # filters alone
        why.append("--kernel and --target select every kernel of the root: name fewer")
    return f" ({'; '.join(why)})"


def _empties(plan: Plan) -> bool:
    """Whether ``plan`` deletes every entry of the root, or every kernel (entries without a
    ``kind``; what it keeps of a package's other entries counts for nothing)."""
    return not plan.kept_entries or bool(plan.deleted_kernels and not plan.kept_kernels)


def _everything(root: str, plan: Plan) -> str:
    """What ``plan``, which :func:`_empties` the root, deletes, in words."""
    doomed = plan.summary["delete-entry"]
    size = human_size(doomed["bytes"])
    if not plan.kept_entries:
        return f"every entry of {root} ({doomed['count']:,}, {size})"
    return (
        f"every kernel of {root} ({plural(plan.deleted_kernels, 'kernel')} in "
        f"{plural(doomed['count'], 'entry')}, {size}; the {plural(plan.kept_entries, 'entry')} "
        "it keeps are no kernels)"
    )


def cmd_clear(args: argparse.Namespace, out: Output) -> int:
    from ..maintenance.execute import execute
    from ..maintenance.prune import plan_prune
    from ..maintenance.scan import in_directory, scan_store

    context: Context = args.context
    store = context.existing_store()
    root = store.root
    context.refuse_readonly(root, "clear")
    plan = plan_prune(scan_store(store), everything=True, quarantine_age=0.0)
    doomed = plan.summary.get("delete-entry", {"count": 0, "bytes": 0})
    others = len(plan.actions) - doomed["count"]
    what = f"{doomed['count']:,} entries ({human_size(doomed['bytes'])})" + (
        f" and {others:,} other files" if others else ""
    )
    result = None
    if not args.dry_run and (plan.actions or plan.logs_to_fold):
        context.require_writable(store)
        if plan.actions and not args.yes and sys.stdin.isatty():
            sys.stderr.write(f"Remove {what} from {root}? [y/N] ")
            sys.stderr.flush()
            if sys.stdin.readline().strip().lower() not in ("y", "yes"):
                raise NothingDone("not confirmed: nothing was removed")
        with out.progress("clearing", len(plan.actions)) as tick:
            result = execute(store, plan, progress=tick)
        in_directory(store, STATS_DIR, discard_usage, None)

    def human() -> str:
        if args.dry_run:
            lines = [f"Would remove {what} from {root}." if plan.actions else "Nothing to remove."]
            lines.append("Dry run: nothing was changed.")
        elif result is None:
            lines = [f"Nothing to remove under {root}."]
        else:
            lines = outcomes_human(result, f"Cleared {root}")
        if plan.left:
            lines.append(f"{len(plan.left):,} other problems left alone (see kernelcache verify).")
        return "\n".join(lines)

    out.emit(
        lambda: {**envelope("clear", root), "dry_run": args.dry_run, **_plan_json(plan, result)},
        human,
    )
    failed = result is not None and (result.counts.get("failed") or result.fold_error)
    return EXIT_PROBLEMS if failed else EXIT_OK
