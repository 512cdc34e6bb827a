"""The ``kernelcache`` command's parser, its built-in commands, and the plugin loader.

See the package docstring for the conventions every command follows.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from .._version import __version__
from ..config import ConfigError, settings
from ..errors import CacheError
from ..jsonio import load_json
from ..keys import KEY_PATTERN, META_EXT
from ..stats import COUNTERS, read_logs
from ..store import Artifact, Store
from .output import (
    EXIT_OK,
    EXIT_PROBLEMS,
    EXIT_USAGE,
    SCHEMA,
    CommandFailed,
    Output,
    UsageError,
    dumps,
    fail,
)

if TYPE_CHECKING:
    from ..prune import Result

logger = logging.getLogger(__name__)

# -- parsing sizes and ages ---------------------------------------------------------------
_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 1 << 10,
    "kib": 1 << 10,
    "ki": 1 << 10,
    "kb": 10**3,
    "m": 1 << 20,
    "mib": 1 << 20,
    "mi": 1 << 20,
    "mb": 10**6,
    "g": 1 << 30,
    "gib": 1 << 30,
    "gi": 1 << 30,
    "gb": 10**9,
    "t": 1 << 40,
    "tib": 1 << 40,
    "ti": 1 << 40,
    "tb": 10**12,
}
_SIZE = re.compile(r"([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)")
_AGE_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_AGE_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)([smhdw])")


def parse_size(text: str) -> int:
    """``10G``, ``500M``, ``1.5GiB``, ``2TB``, ``4096`` -> bytes.

    K, M, G, T (and KiB, MiB, ...) are powers of 1024, like ``du -h``; KB, MB, GB, TB are
    powers of 1000. Units are case-insensitive.

    Raises:
        UsageError: anything else, with what is accepted.
    """
    match = _SIZE.fullmatch(text.strip())
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _SIZE_UNITS:
        raise UsageError(
            f"invalid size {text!r}: use a number with an optional unit, e.g. 500M, 10G, "
            "1.5GiB, 2TB (K/M/G/T and KiB/MiB/GiB/TiB are powers of 1024; KB/MB/GB/TB of 1000)"
        )
    return int(float(match.group(1)) * _SIZE_UNITS[unit])


def parse_age(text: str) -> float:
    """``30d``, ``12h``, ``90m``, ``45s``, ``2w``, ``1d12h`` -> seconds.

    Raises:
        UsageError: anything else (a bare number is refused: say which unit).
    """
    compact = text.strip().lower()
    parts = _AGE_PART.findall(compact)
    if not compact or "".join(n + u for n, u in parts) != compact:
        raise UsageError(
            f"invalid age {text!r}: use a number with a unit s, m, h, d or w "
            "(seconds, minutes, hours, days, weeks), e.g. 30d, 12h, 90m, 1d12h"
        )
    return sum(float(n) * _AGE_UNITS[u] for n, u in parts)


def _size_arg(text: str) -> int:
    try:
        return parse_size(text)
    except UsageError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _age_arg(text: str) -> float:
    try:
        return parse_age(text)
    except UsageError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


# -- formatting ---------------------------------------------------------------------------
def human_size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def human_age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = max(seconds, 0.0)
    for limit, unit, div in ((120, "s", 1), (7200, "m", 60), (172800, "h", 3600)):
        if seconds < limit:
            return f"{seconds / div:.0f}{unit} ago"
    return f"{seconds / 86400:.0f}d ago"


def human_duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.1f}s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def _table(rows: Sequence[Sequence[str]], right: Sequence[int] = ()) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for row in rows:
        cells = [
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def _label(value: str | None) -> str:
    return "(none)" if value is None else value


# -- the root -----------------------------------------------------------------------------
def root_of(args: argparse.Namespace) -> str:
    if args.root:
        return os.path.abspath(os.path.expanduser(args.root))
    from ..cache import default_root

    return os.path.abspath(default_root())


def _lock_settings() -> tuple[str, float]:
    cfg = settings()
    return cfg.lock_mode, cfg.lock_stale


def _writer(root: str, lock_timeout: float = 0.0) -> Store:
    """A writable store for this root; per-key locks are tried once unless told otherwise."""
    mode, stale = _lock_settings()
    return Store(root, lock_mode=mode, lock_stale=stale, lock_timeout=lock_timeout)


def _base(command: str, root: str) -> dict[str, Any]:
    return {"schema": SCHEMA, "command": command, "root": root}


# -- stats --------------------------------------------------------------------------------
def stats_document(root: str) -> dict[str, Any]:
    """The ``stats --json`` document of a root."""
    from ..prune import read_summary
    from ..scan import summarize

    summary = summarize(root)
    totals, logs, log_problems = read_logs(root)
    folded = read_summary(root)
    processes = logs - 1 + folded["logs"] if folded else logs
    counters: dict[str, float] = {
        k: (round(v, 3) if k.endswith("seconds") else int(v)) for k, v in totals.items()
    }
    lookups = counters["hits"] + counters["misses"]
    mean_build = counters["build_seconds"] / counters["builds"] if counters["builds"] else None
    saved = counters["hits"] * mean_build if mean_build is not None else None
    artifact_bytes = summary.artifact_bytes
    metadata_bytes = summary.metadata_bytes

    def groups(column: str) -> dict[str, dict[str, int]]:
        return {
            _label(v): {"entries": n, "bytes": b} for v, (n, b) in summary.groups[column].items()
        }

    return {
        **_base("stats", root),
        "exists": summary.exists,
        "entries": summary.entries,
        "bytes": artifact_bytes + metadata_bytes,
        "artifact_bytes": artifact_bytes,
        "metadata_bytes": metadata_bytes,
        "by_ext": groups("ext"),
        "by_target": groups("target"),
        "by_kernel": groups("kernel"),
        "quarantine": {
            "files": len(summary.quarantine),
            "bytes": sum(f.size for f in summary.quarantine),
        },
        "temp": {"files": len(summary.temp), "bytes": sum(f.size for f in summary.temp)},
        "problems": summary.problems,
        "counters": counters,
        "hit_rate": counters["hits"] / lookups if lookups else None,
        "mean_build_seconds": round(mean_build, 6) if mean_build is not None else None,
        "compile_seconds_saved": round(saved, 3) if saved is not None else None,
        "processes": processes,
        "log_problems": log_problems,
    }


def _stats_human(doc: dict[str, Any], top: int) -> str:
    c = doc["counters"]
    lines = [f"Cache root:       {doc['root']}" + ("" if doc["exists"] else " (does not exist)")]
    lines.append(f"Entries:          {doc['entries']:,}")
    lines.append(
        f"Size:             {human_size(doc['bytes'])} (artifacts {human_size(doc['artifact_bytes'])},"
        f" metadata {human_size(doc['metadata_bytes'])})"
    )
    q, t = doc["quarantine"], doc["temp"]
    lines.append(f"Quarantined:      {q['files']:,} files, {human_size(q['bytes'])}")
    lines.append(f"Staging files:    {t['files']:,} files, {human_size(t['bytes'])}")
    if doc["problems"]:
        lines.append(f"Problems:         {doc['problems']:,} (run: kernelcache verify)")
    lines.append("")
    rate = doc["hit_rate"]
    lines.append(f"Hits:             {c['hits']:,}")
    lines.append(f"Misses:           {c['misses']:,}")
    lines.append(f"Hit rate:         {'-' if rate is None else f'{rate * 100:.1f}%'}")
    build = f"{c['builds']:,}"
    if doc["mean_build_seconds"] is not None:
        build += (
            f" (total {human_duration(c['build_seconds'])}, mean "
            f"{human_duration(doc['mean_build_seconds'])})"
        )
    lines.append(f"Builds:           {build}")
    lines.append(f"Corrupt reads:    {c['corrupt']:,}")
    lines.append(f"Errors:           {c['errors']:,}")
    saved = doc["compile_seconds_saved"]
    lines.append(
        "Compile time saved: "
        + ("-" if saved is None else f"~{human_duration(saved)} (hits x mean build time)")
    )
    lines.append(f"Processes logged: {doc['processes']:,}")
    for title, key in (("extension", "by_ext"), ("target", "by_target"), ("kernel", "by_kernel")):
        items = list(doc[key].items())
        if not items:
            continue
        shown = items if top <= 0 else items[:top]
        rows = [[title.upper(), "ENTRIES", "SIZE"]]
        rows += [[name, f"{v['entries']:,}", human_size(v["bytes"])] for name, v in shown]
        lines += ["", _table(rows, right=(1, 2))]
        if len(shown) < len(items):
            lines.append(f"... and {len(items) - len(shown)} more (--top 0 for all)")
    return "\n".join(lines)


def _prometheus_escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def prometheus_text(doc: dict[str, Any]) -> str:
    """The stats document in the Prometheus text exposition format (textfile collector)."""
    root = _prometheus_escape(doc["root"])
    out: list[str] = []

    def metric(name: str, kind: str, help_: str, samples: list[tuple[str, float]]) -> None:
        out.append(f"# HELP kernelcache_{name} {help_}")
        out.append(f"# TYPE kernelcache_{name} {kind}")
        for labels, value in samples:
            extra = f",{labels}" if labels else ""
            text = repr(float(value)) if isinstance(value, float) else str(value)
            out.append(f'kernelcache_{name}{{root="{root}"{extra}}} {text}')

    metric("entries", "gauge", "Entries in the cache root.", [("", doc["entries"])])
    metric("bytes", "gauge", "Bytes of artifacts and metadata.", [("", doc["bytes"])])
    for column, label in (("by_ext", "ext"), ("by_target", "target")):
        rows = doc[column].items()
        metric(
            f"entries_{column}",
            "gauge",
            f"Entries per {label}.",
            [(f'{label}="{_prometheus_escape(k)}"', v["entries"]) for k, v in rows],
        )
        metric(
            f"bytes_{column}",
            "gauge",
            f"Bytes per {label}.",
            [(f'{label}="{_prometheus_escape(k)}"', v["bytes"]) for k, v in rows],
        )
    metric(
        "quarantine_files", "gauge", "Files in .quarantine/.", [("", doc["quarantine"]["files"])]
    )
    metric("temp_files", "gauge", "Staging files in .tmp/.", [("", doc["temp"]["files"])])
    metric("problems", "gauge", "Problems found by a quick scan.", [("", doc["problems"])])
    for name in COUNTERS:
        value = doc["counters"][name]
        metric(
            f"{name}_total",
            "counter",
            f"Sum of the {name} counter over all processes.",
            [("", value)],
        )
    if doc["hit_rate"] is not None:
        metric("hit_ratio", "gauge", "hits / (hits + misses).", [("", float(doc["hit_rate"]))])
    if doc["compile_seconds_saved"] is not None:
        metric(
            "compile_seconds_saved",
            "gauge",
            "Estimated compile time saved: hits x mean build time.",
            [("", float(doc["compile_seconds_saved"]))],
        )
    metric("processes", "gauge", "Processes that logged statistics.", [("", doc["processes"])])
    return "\n".join(out) + "\n"


def _write_atomic(path: str, text: str) -> None:
    """Write a file so that readers (a textfile collector) see the old or new text, whole."""
    from ..fsio import replace_file

    directory, name = os.path.split(os.path.abspath(path))
    try:
        dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            replace_file(dfd, name, text.encode())
        finally:
            os.close(dfd)
    except OSError as e:
        raise CommandFailed(f"cannot write {path}: {e.strerror}") from e


def cmd_stats(args: argparse.Namespace, out: Output) -> int:
    root = root_of(args)
    doc = stats_document(root)
    fmt = "json" if out.json else args.format
    if fmt == "prometheus":
        text = prometheus_text(doc)
    elif fmt == "json":
        text = dumps(doc) + "\n"
    else:
        text = _stats_human(doc, args.top) + "\n"
    if args.output:
        _write_atomic(args.output, text)
    else:
        sys.stdout.write(text)
    return EXIT_OK


# -- ls / show ----------------------------------------------------------------------------
_SORTS: dict[str, tuple[Callable[[Any], Any], bool]] = {
    "name": (lambda e: (e.kernel or "", e.target or "", e.key), False),
    "size": (lambda e: (e.size, e.key), True),  # largest artifact first
    "age": (lambda e: (e.created or 0.0, e.key), False),  # oldest first
    "last-used": (lambda e: (e.last_used or 0.0, e.key), False),  # least recently used first
}


def cmd_ls(args: argparse.Namespace, out: Output) -> int:
    from ..prune import select
    from ..scan import scan

    root = root_of(args)
    scanned = scan(root, last_used=True)
    entries = select(scanned.entries, args.kernel or (), args.target or ())
    sort_key, descending = _SORTS[args.sort]
    entries.sort(key=sort_key, reverse=descending != args.reverse)
    if args.limit is not None:
        entries = entries[: args.limit]
    now = time.time()

    def human() -> str:
        if not entries:
            return "(no entries)" if scanned.exists else f"(no entries: {root} does not exist)"
        rows = [["KEY", "EXT", "SIZE", "KERNEL", "TARGET", "LAST USED", "CREATED"]]
        for e in entries:
            rows.append(
                [
                    e.key[:16],
                    e.ext,
                    human_size(e.size),
                    _label(e.kernel),
                    _label(e.target),
                    human_age(now - e.last_used if e.last_used else None),
                    human_age(now - e.created if e.created else None),
                ]
            )
        total = sum(e.nbytes for e in entries)
        return _table(rows, right=(2,)) + f"\n{len(entries):,} entries, {human_size(total)}"

    doc = {
        **_base("ls", root),
        "exists": scanned.exists,
        "count": len(entries),
        "bytes": sum(e.nbytes for e in entries),
        "entries": [{**e.to_json(), "path": os.path.join(root, e.filename)} for e in entries],
    }
    out.emit(doc, human)
    return EXIT_OK


def _resolve_key(root: str, text: str) -> str:
    """A full key, or a unique prefix (at least 6 hex digits) of one."""
    text = text.strip().lower()
    if KEY_PATTERN.fullmatch(text):
        return text
    if not re.fullmatch(r"[0-9a-f]{6,128}", text):
        raise UsageError(
            f"invalid key {text!r}: give a key (32-128 hex digits) or a prefix of at least 6"
        )
    try:
        names = os.listdir(root)
    except OSError:
        names = []
    found = sorted(
        {n.split(".", 1)[0] for n in names if n.startswith(text) and n.endswith("." + META_EXT)}
    )
    if len(found) > 1:
        raise UsageError(
            f"key prefix {text!r} is ambiguous: {', '.join(found[:5])}"
            + (" ..." if len(found) > 5 else "")
        )
    if not found:
        raise CommandFailed(f"no entry with key prefix {text!r} under {root}")
    return found[0]


def _raw_metadata(root: str, key: str) -> dict[str, Any] | None:
    from ..fsio import READ_FLAGS

    try:
        fd = os.open(os.path.join(root, f"{key}.{META_EXT}"), READ_FLAGS)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        raw = f.read(1 << 20)
    try:
        doc = load_json(raw)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def cmd_show(args: argparse.Namespace, out: Output) -> int:
    root = root_of(args)
    key = _resolve_key(root, args.key)
    result = Store(root, readonly=True, trust=settings().trust).read(key)
    if result is None:
        raise CommandFailed(f"no entry {key} under {root}")
    meta = dict(result.meta) if isinstance(result, Artifact) else _raw_metadata(root, key)
    ext = result.ext if isinstance(result, Artifact) else (meta or {}).get("ext")
    path = os.path.join(root, f"{key}.{ext}") if isinstance(ext, str) else None
    try:
        last_used: float | None = os.stat(
            os.path.join(root, f"{key}.{META_EXT}"), follow_symlinks=False
        ).st_mtime
    except OSError:
        last_used = None
    ok = isinstance(result, Artifact)
    doc = {
        **_base("show", root),
        "key": key,
        "ext": ext,
        "path": path,
        "size": len(result.data) if isinstance(result, Artifact) else None,
        "last_used": last_used,
        "status": "ok" if ok else "corrupt",
        "problem": None if ok else result.reason,  # type: ignore[union-attr]
        "metadata": meta,
    }

    def human() -> str:
        lines = [f"key:        {key}", f"path:       {path}"]
        if ok:
            lines.append(f"size:       {doc['size']:,} bytes ({human_size(doc['size'])})")
            lines.append("status:     ok (size and digest verified)")
        else:
            lines.append(f"status:     CORRUPT: {doc['problem']} (kernelcache verify --repair)")
        if last_used is not None:
            lines.append(
                f"last used:  {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(last_used))}"
                f" ({human_age(time.time() - last_used)})"
            )
        created = (meta or {}).get("created")
        if isinstance(created, (int, float)):
            lines.append(
                f"created:    {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(created))}"
                f" ({human_age(time.time() - created)})"
            )
        lines.append("metadata:")
        for k, v in sorted((meta or {}).items()):
            lines.append(f"  {k}: {json.dumps(v) if isinstance(v, (dict, list)) else v}")
        return "\n".join(lines)

    out.emit(doc, human)
    return EXIT_OK if ok else EXIT_PROBLEMS


# -- verify / prune -----------------------------------------------------------------------
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
        lines.append(f"  failed: {o.action.path}: {o.detail}")
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


def _check_writable(root: str) -> None:
    if os.path.isdir(root) and not os.access(root, os.W_OK):
        raise CommandFailed(
            f"{root} is not writable by this user (or is on a read-only filesystem); "
            "nothing was changed"
        )


def cmd_verify(args: argparse.Namespace, out: Output) -> int:
    from ..prune import execute, plan_repair
    from ..scan import scan, verify

    root = root_of(args)
    _, stale = _lock_settings()
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
        _check_writable(root)
        plan = plan_repair(checked)
        with out.progress("repairing", len(plan.actions)) as tick:
            result = execute(_writer(root), plan, progress=tick)
        remaining = len(plan.left) + sum(
            1 for o in result.outcomes if o.status in ("in-use", "failed")
        )
    doc = {
        **_base("verify", root),
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
        if not checked.exists:
            lines[0] = f"{root} does not exist: nothing to verify."
        if issues:
            lines.append(f"Problems ({len(issues):,}):")
            rows = [[i.kind, i.path, i.detail] for i in issues]
            lines += ["  " + line for line in _table(rows).splitlines()]
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

    root = root_of(args)
    _, stale = _lock_settings()
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
        _check_writable(root)
        with out.progress("pruning", len(plan.actions)) as tick:
            result = execute(_writer(root), plan, progress=tick)
    criteria = {
        "max_size": args.max_size,
        "older_than": args.older_than,
        "kernel": args.kernel or [],
        "target": args.target or [],
        "quarantine_age": args.quarantine_age,
    }
    doc = lambda: {  # noqa: E731 - built only for --json
        **_base("prune", root),
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
                lines += ["  " + line for line in _table(rows, right=(2,)).splitlines()]
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


# -- export / import ----------------------------------------------------------------------
def cmd_export(args: argparse.Namespace, out: Output) -> int:
    from ..bundle import BundleError, export_bundle
    from ..prune import select
    from ..scan import scan

    root = root_of(args)
    scanned = scan(root)
    entries = select(scanned.entries, args.kernel or (), args.target or ())
    entries.sort(key=lambda e: e.key)
    try:
        with out.progress("exporting", len(entries)) as tick:
            result = export_bundle(
                root,
                entries,
                args.file,
                compression=args.compression,
                level=args.level,
                force=args.force,
                progress=tick,
                trust=settings().trust,
            )
    except BundleError as e:
        raise CommandFailed(str(e)) from None
    doc = {
        **_base("export", root),
        "file": os.path.abspath(result.path),
        "entries": result.entries,
        "bytes": result.bytes,
        "compression": result.compression,
        "skipped": [{"key": k, "reason": r} for k, r in result.skipped],
        "compatibility": result.compatibility,
    }

    def human() -> str:
        lines = [
            f"Exported {result.entries:,} entries ({human_size(result.bytes)}) to {result.path}"
            f" ({'zstd' if result.compression == 'zstd' else 'uncompressed tar'})."
        ]
        for key, reason in result.skipped:
            lines.append(f"  skipped {key}: {reason}")
        return "\n".join(lines)

    out.emit(doc, human)
    return EXIT_PROBLEMS if result.skipped else EXIT_OK


def cmd_import(args: argparse.Namespace, out: Output) -> int:
    from ..bundle import BundleError, import_bundle

    root = root_of(args)
    if not args.dry_run:
        _check_writable(root)
    store = _writer(root, lock_timeout=settings().lock_timeout)
    try:
        with out.progress("importing", None) as tick:
            result = import_bundle(
                store,
                args.file,
                max_member_size=args.max_member_size,
                dry_run=args.dry_run,
                progress=tick,
            )
    except BundleError as e:
        done = (
            f"{e.imported} verified entries were imported before that"
            if e.imported
            else "nothing was imported"
        )
        raise CommandFailed(f"import of {args.file} rejected: {e}; {done}") from None
    except CacheError as e:
        raise CommandFailed(str(e)) from None
    doc = {
        **_base("import", root),
        "file": os.path.abspath(args.file),
        "dry_run": result.dry_run,
        "entries": result.entries,
        "imported": result.imported,
        "present": result.present,
        "bytes": result.bytes,
        "conflicts": [{"key": k, "reason": r} for k, r in result.conflicts],
        "compatibility": result.compatibility,
    }

    def human() -> str:
        verb = "Would import" if result.dry_run else "Imported"
        lines = [
            f"Verified {result.entries:,} entries of {args.file}.",
            f"{verb} {result.imported:,} entries ({human_size(result.bytes)}); "
            f"{result.present:,} already present.",
        ]
        compat = result.compatibility
        if compat.get("targets"):
            lines.append(f"Targets: {', '.join(compat['targets'])}")
        producers = compat.get("producers") or {}
        if producers:
            lines.append(
                "Producers: "
                + "; ".join(
                    f"{k} {', '.join(v)}" for k, v in producers.items() if isinstance(v, list)
                )
            )
        for key, reason in result.conflicts:
            lines.append(f"  conflict {key}: {reason}")
        return "\n".join(lines)

    out.emit(doc, human)
    return EXIT_PROBLEMS if result.conflicts else EXIT_OK


# -- doctor -------------------------------------------------------------------------------
def cmd_doctor(args: argparse.Namespace, out: Output) -> int:
    from ..doctor import diagnose

    root = root_of(args)
    report = diagnose(root)
    doc = {
        **_base("doctor", root),
        **report.info,
        "checks": [c.to_json() for c in report.checks],
        "ok": report.ok,
    }

    def human() -> str:
        info = report.info
        fs = info.get("filesystem") or {}
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
                f"Locks:        {info['lock_mode']} (configured: {info.get('lock_mode_configured', '?')})"
            )
        lines.append(f"kernelcache:  {info['kernelcache']} on Python {info['python']}")
        for name, version in info["versions"].items():
            lines.append(f"  {name + ':':13} {version or '-'}")
        env = info["environment"]
        lines.append("Environment:  " + ("(no KERNELCACHE_* variables set)" if not env else ""))
        for name, value in env.items():
            lines.append(f"  {name}={value}")
        lines.append("Checks:")
        for c in report.checks:
            lines.append(f"  [{c.status:4}] {c.name}: {c.detail}")
        return "\n".join(lines)

    out.emit(doc, human)
    return EXIT_OK if report.ok else EXIT_PROBLEMS


# -- the parser ---------------------------------------------------------------------------
#: the entry-point group through which other packages add subcommands
COMMANDS_GROUP = "kernelcache.commands"


def _common_options() -> argparse.ArgumentParser:
    """--root, --json and -v, accepted before and after the command name."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--root",
        metavar="DIR",
        default=argparse.SUPPRESS,
        help="cache root (default: $KERNELCACHE_DIR, else the user cache directory)",
    )
    common.add_argument(
        "--json",
        action="store_true",
        default=argparse.SUPPRESS,
        help="print one JSON document (fields documented in the README)",
    )
    common.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=argparse.SUPPRESS,
        help="log more; -vv for debug messages and tracebacks",
    )
    return common


def add_command(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser], name: str, help_: str
) -> argparse.ArgumentParser:
    """Add a subcommand that takes the global options (--root, --json, -v) too.

    The caller adds its arguments and sets ``func(args, out) -> exit code`` with
    ``set_defaults``; ``args.root`` (resolve it with :func:`root_of`), ``args.json`` and
    ``args.verbose`` are always present.
    """
    return subparsers.add_parser(name, parents=[_common_options()], help=help_, description=help_)


def _load_plugins(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Let installed packages add their subcommands (entry-point group ``kernelcache.commands``).

    A plugin that cannot be loaded is skipped with a warning: it must not take the operator's
    own commands down with it.
    """
    from importlib.metadata import entry_points

    for ep in sorted(entry_points(group=COMMANDS_GROUP), key=lambda e: e.name):
        try:
            ep.load()(subparsers)
        except Exception as e:  # a broken plugin is reported, never fatal to the command
            logger.warning(
                "kernelcache: skipping the command plugin %s (%s): %s", ep.name, ep.value, e
            )


def build_parser() -> argparse.ArgumentParser:
    common = _common_options()
    parser = argparse.ArgumentParser(
        prog="kernelcache",
        description="Inspect, verify, prune, export and import a kernelcache root.",
        parents=[common],
        epilog="Exit codes: 0 ok, 1 problems found or an operation failed, 2 usage error.",
    )
    parser.add_argument("--version", action="version", version=f"kernelcache {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def command(name: str, help_: str) -> argparse.ArgumentParser:
        return add_command(sub, name, help_)

    def filters(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--kernel", action="append", metavar="NAME", help="only this kernel name (repeatable)"
        )
        p.add_argument(
            "--target",
            action="append",
            metavar="T",
            help="only this target, e.g. cuda:90 (repeatable)",
        )

    p = command("stats", "entries and bytes by extension, target and kernel; hit rate and counters")
    p.add_argument(
        "--format",
        choices=("table", "json", "prometheus"),
        default="table",
        help="output format (--json means json)",
    )
    p.add_argument(
        "--top", type=int, default=10, metavar="N", help="rows per breakdown in the table (0: all)"
    )
    p.add_argument(
        "-o",
        "--output",
        metavar="FILE",
        help="write to FILE atomically (e.g. a node exporter textfile)",
    )
    p.set_defaults(func=cmd_stats)

    p = command("ls", "list entries and their metadata")
    filters(p)
    p.add_argument(
        "--sort",
        choices=tuple(_SORTS),
        default="name",
        help="name (kernel, target, key); size (largest first); age (oldest first); last-used (least recent first)",
    )
    p.add_argument("--reverse", action="store_true", help="reverse the order")
    p.add_argument("--limit", type=int, metavar="N", help="show at most N entries")
    p.set_defaults(func=cmd_ls)

    p = command("show", "one entry: metadata, path, verified status")
    p.add_argument("key", metavar="KEY", help="a key or a unique prefix of at least 6 hex digits")
    p.set_defaults(func=cmd_show)

    p = command(
        "verify",
        "check every entry's size, digest and metadata; find orphans, stale staging files and locks",
    )
    p.add_argument(
        "--repair",
        action="store_true",
        help="quarantine corrupt entries; remove orphans, stale staging files and stale locks",
    )
    p.set_defaults(func=cmd_verify)

    p = command(
        "prune",
        "plan, then remove entries by size cap (least recently used first) or age; clean up",
    )
    p.add_argument(
        "--max-size",
        type=_size_arg,
        metavar="SIZE",
        help="keep at most SIZE bytes of (matching) entries, e.g. 10G",
    )
    p.add_argument(
        "--older-than",
        type=_age_arg,
        metavar="AGE",
        help="remove (matching) entries not used for AGE, e.g. 30d",
    )
    filters(p)
    p.add_argument(
        "--quarantine-age",
        type=_age_arg,
        default=7 * 86400.0,
        metavar="AGE",
        help="remove quarantined files older than AGE (default 7d)",
    )
    p.add_argument("--dry-run", action="store_true", help="print the plan, change nothing")
    p.add_argument("--list", action="store_true", help="list every planned action")
    p.set_defaults(func=cmd_prune)

    p = command("export", "write entries to a bundle (tar, or tar+zstd)")
    p.add_argument("file", metavar="FILE")
    filters(p)
    p.add_argument(
        "--compression",
        choices=("auto", "none", "zstd"),
        default="auto",
        help="auto: zstd when FILE ends in .zst/.zstd/.tzst",
    )
    p.add_argument("--level", type=int, default=3, help="zstd level (default 3)")
    p.add_argument("--force", action="store_true", help="overwrite FILE")
    p.set_defaults(func=cmd_export)

    p = command("import", "verify a bundle completely, then add its entries")
    p.add_argument("file", metavar="FILE")
    p.add_argument(
        "--max-member-size",
        type=_size_arg,
        default=256 << 20,
        metavar="SIZE",
        help="refuse artifacts larger than SIZE (default 256M)",
    )
    p.add_argument("--dry-run", action="store_true", help="verify only; write nothing")
    p.set_defaults(func=cmd_import)

    p = command(
        "doctor", "the root, its filesystem, free space, permissions, locks, versions, environment"
    )
    p.set_defaults(func=cmd_doctor)

    _load_plugins(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    args.json = getattr(args, "json", False)
    args.root = getattr(args, "root", None)
    args.verbose = getattr(args, "verbose", 0)
    logging.basicConfig(
        level=logging.WARNING - 10 * min(args.verbose, 2),
        format="kernelcache: %(levelname)s: %(message)s",
    )
    out = Output(args.json)
    try:
        return int(args.func(args, out))
    except UsageError as e:
        return fail(str(e), EXIT_USAGE, args.command, args.json)
    except ConfigError as e:
        return fail(f"{e} (fix the environment variable)", EXIT_USAGE, args.command, args.json)
    except CommandFailed as e:
        return fail(str(e), EXIT_PROBLEMS, args.command, args.json)
    except BrokenPipeError:
        # The reader went away (`kernelcache ls | head`): stop quietly.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK
    except KeyboardInterrupt:
        sys.stderr.write("kernelcache: interrupted\n")
        return 130
    except Exception as e:  # pragma: no cover - the message beats a traceback for operators
        if args.verbose > 1:
            raise
        from ..bundle import MissingDependency  # the one optional-package error commands raise

        if isinstance(e, MissingDependency):
            return fail(str(e), EXIT_USAGE, args.command, args.json)
        return fail(
            f"{e.__class__.__name__}: {e} (rerun with -v for a traceback)",
            EXIT_PROBLEMS,
            args.command,
            args.json,
        )


def run() -> NoReturn:
    sys.exit(main())
