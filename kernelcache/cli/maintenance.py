"""``kernelcache verify``, ``prune`` and ``doctor``: check a root, remove what should go (plan
first, then execute), and diagnose the root and its environment.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from ..config import settings
from .common import check_writable, existing_root, lock_settings, root_of, writer
from .output import (
    EXIT_OK,
    EXIT_PROBLEMS,
    Output,
    envelope,
    format_table,
    human_size,
    printable,
)

if TYPE_CHECKING:
    from ..prune import Result


def _outcomes_human(result: Result, verb: str) -> list[str]:
    lines = []
    counts = result.counts
    freed = human_size(result.freed_bytes)
    lines.append(f"{verb}: {counts.get('done', 0):,} done, {freed} freed")
    for status, what in (
        ("in-use", "in use by another process (skipped; try again later)"),
        ("used-since-plan", "used since the plan was made (kept)"),
        ("gone", "already gone or repaired meanwhile"),
        ("failed", "failed"),
    ):
        if counts.get(status):
            lines.append(f"  {counts[status]:,} {what}")
    for o in result.with_status("failed"):
        lines.append(f"  failed: {printable(o.action.path)}: {printable(o.detail)}")
    if result.plan.fold_logs or result.fold_error:
        lines.append(f"  statistics logs folded: {result.folded_logs}")
        if result.fold_error:
            lines.append(f"  could not fold statistics logs: {result.fold_error}")
    return lines


def _result_json(result: Result) -> dict[str, Any]:
    return {
        "outcomes": [o.to_json() for o in result.outcomes],
        "counts": result.counts,
        "freed_bytes": result.freed_bytes,
        "folded_logs": result.folded_logs,
        "fold_error": result.fold_error,
    }


def cmd_verify(args: argparse.Namespace, out: Output) -> int:
    from ..prune import execute, plan_repair
    from ..scan import scan, verify

    root = existing_root(args)
    _, stale = lock_settings()
    base = scan(root, last_used=True, locks=True, lock_stale=stale)
    with out.progress("verifying", len(base.entries)) as tick:
        checked = verify(root, base, progress=tick, trust=settings().trust)
    issues = checked.issues
    counts: dict[str, int] = {}
    for issue in issues:
        counts[issue.kind] = counts.get(issue.kind, 0) + 1
    result = None
    remaining = len(issues)
    if args.repair and issues:
        check_writable(root)
        plan = plan_repair(checked)
        with out.progress("repairing", len(plan.actions)) as tick:
            result = execute(writer(root), plan, progress=tick)
        remaining = len(plan.left) + sum(
            1 for o in result.outcomes if o.status in ("in-use", "failed")
        )
    doc = {
        **envelope("verify", root),
        "exists": checked.exists,
        "entries_checked": len(base.entries),
        "entries_ok": len(checked.entries),
        "problems": [i.to_json() for i in issues],
        "counts": counts,
        "repair": _result_json(result) if result is not None else None,
        "clean": remaining == 0,
    }

    def human() -> str:
        lines = [
            f"Checked {len(base.entries):,} entries under {root}: {len(checked.entries):,} ok."
        ]
        if issues:
            lines.append(f"Problems ({len(issues):,}):")
            rows = [[i.kind, i.path, i.detail] for i in issues]
            lines += ["  " + line for line in format_table(rows).splitlines()]
            if result is None:
                lines.append(
                    "Run `kernelcache verify --repair` to quarantine corrupt entries and remove "
                    "orphans, stale staging files and stale locks (foreign files are left alone)."
                )
        else:
            lines.append("No problems found.")
        if result is not None:
            lines += _outcomes_human(result, "Repair")
        return "\n".join(lines)

    out.emit(doc, human)
    return EXIT_OK if remaining == 0 else EXIT_PROBLEMS


_ACTION_WORDS = {
    "delete-entry": "delete {n:,} entries ({b}), least recently used first",
    "quarantine-entry": "quarantine {n:,} corrupt entries",
    "remove-orphan": "remove {n:,} orphan artifact files ({b})",
    "remove-temp": "remove {n:,} stale staging files ({b})",
    "remove-quarantined": "remove {n:,} old quarantined files ({b})",
    "remove-lock": "remove {n:,} stale lock files",
}


def cmd_prune(args: argparse.Namespace, out: Output) -> int:
    from ..prune import execute, plan_prune
    from ..scan import scan

    root = existing_root(args)
    _, stale = lock_settings()
    scanned = scan(root, last_used=True, locks=True, lock_stale=stale)
    plan = plan_prune(
        scanned,
        max_size=args.max_size,
        older_than=args.older_than,
        kernels=args.kernel or (),
        targets=args.target or (),
        quarantine_age=args.quarantine_age,
    )
    result = None
    if not args.dry_run and (plan.actions or plan.fold_logs):
        check_writable(root)
        doomed = plan.summary.get("delete-entry")
        if doomed and args.max_size is None and args.older_than is None:
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
            result = execute(writer(root), plan, progress=tick)
    criteria = {
        "max_size": args.max_size,
        "older_than": args.older_than,
        "kernel": args.kernel or [],
        "target": args.target or [],
        "quarantine_age": args.quarantine_age,
    }
    doc = lambda: {  # noqa: E731 - built only for --json
        **envelope("prune", root),
        "dry_run": args.dry_run,
        "criteria": criteria,
        "plan": {
            "actions": [  # (Action.to_json, inlined: plans can hold 100,000 actions)
                {"action": kind, "path": path, "key": key, "size": size, "reason": reason}
                for kind, path, size, reason, key, _ in plan.actions
            ],
            "summary": plan.summary,
            "bytes_to_free": plan.bytes_to_free,
            "kept_entries": plan.kept_entries,
            "kept_bytes": plan.kept_bytes,
            "fold_logs": len(plan.fold_logs),
        },
        "left": [i.to_json() for i in plan.left],
        "result": _result_json(result) if result is not None else None,
    }

    def human() -> str:
        lines = [f"Plan for {root}:"]
        for kind, v in plan.summary.items():
            lines.append("  " + _ACTION_WORDS[kind].format(n=v["count"], b=human_size(v["bytes"])))
        if plan.fold_logs:
            lines.append(f"  fold {len(plan.fold_logs):,} statistics logs of finished processes")
        if not plan.actions and not plan.fold_logs:
            lines.append("  nothing to do")
        lines.append(f"Keeps {plan.kept_entries:,} entries ({human_size(plan.kept_bytes)}).")
        if args.list:
            rows = [[a.kind, a.path, human_size(a.size), a.reason] for a in plan.actions]
            if rows:
                lines += ["  " + line for line in format_table(rows, right=(2,)).splitlines()]
        if plan.left:
            lines.append(f"{len(plan.left):,} other problems left alone (see kernelcache verify).")
        if args.dry_run:
            lines.append("Dry run: nothing was changed.")
        elif result is not None:
            lines += _outcomes_human(result, "Pruned")
        return "\n".join(lines)

    out.emit(doc, human)
    failed = result is not None and (result.counts.get("failed") or result.fold_error)
    return EXIT_PROBLEMS if failed else EXIT_OK


def cmd_doctor(args: argparse.Namespace, out: Output) -> int:
    from ..doctor import diagnose
    from ..errors import ConfigError

    try:
        root: str | None = root_of(args)
    except ConfigError:
        root = None  # KERNELCACHE_DIR cannot be used: reported with every other setting
    report = diagnose(root)
    doc = {
        **envelope("doctor", root),
        **report.info,
        "checks": [c.to_json() for c in report.checks],
        "ok": report.ok,
    }

    def human() -> str:
        info = report.info
        fs = info.get("filesystem") or {}
        if root is None:
            lines = ["Cache root:   (none: KERNELCACHE_DIR cannot be used)"]
        else:
            lines = [f"Cache root:   {root}" + ("" if info["exists"] else " (does not exist)")]
        if fs:
            lines.append(f"Filesystem:   {fs['type']} ({fs['source']} on {fs['mount_point']})")
        if info.get("free_bytes") is not None:
            lines.append(
                f"Free space:   {human_size(info['free_bytes'])} of {human_size(info['total_bytes'])}"
                + (
                    f", {info['free_inodes']:,} inodes"
                    if info.get("free_inodes") is not None
                    else ""
                )
            )
        perm = info.get("permissions")
        if perm:
            lines.append(
                f"Permissions:  {perm['mode']} {perm['owner']}:{perm['group']}"
                f"{' setgid' if perm['setgid'] else ''}"
                f"{'' if perm['writable'] else ' (not writable)'}; umask {info['umask']}"
            )
        if info.get("lock_mode"):
            lines.append(
                f"Locks:        {info['lock_mode']} "
                f"(configured: {info.get('lock_mode_configured') or '?'})"
            )
        lines.append(f"kernelcache:  {info['kernelcache']} on Python {info['python']}")
        for name, version in info["versions"].items():
            lines.append(f"  {name + ':':13} {version or '-'}")
        lines.append("Checks:")
        for c in report.checks:
            lines.append(printable(f"  [{c.status:4}] {c.name}: {c.detail}"))
        return "\n".join(lines)

    out.emit(doc, human)
    return EXIT_OK if report.ok else EXIT_PROBLEMS
