"""``kernelcache stats``: a report of a root: entries and bytes by extension, target, kind and
kernel, and the counters of every process, as a table, JSON or Prometheus text (how the table
and the text read: :mod:`.stats_text`).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from ..config import DEFAULTS
from ..stats.summary import read_logs, read_summary
from ..store.layout import replace_file
from .common import ROOT, Context, Subparsers, add_command, count_arg
from .output import (
    EXIT_OK,
    EXIT_PROBLEMS,
    Output,
    UsageError,
    dumps,
    envelope,
    printable,
)
from .stats_text import prometheus_text, stats_human

#: from how many metadata files to read (the scan index lacks them) ``stats`` says it first
INDEXING_NOTICE = 2000


def stats_document(
    root: str, trust: str = DEFAULTS.trust, out: Output | None = None
) -> dict[str, Any]:
    """The ``stats --json`` document of a root (``trust``: whose scan index is read). With
    ``out``, reading many metadata files the scan index lacks (a first run on a large root) is
    said first, on standard error, and its progress shown."""
    from ..maintenance.inventory import summarize

    if out is None:
        summary = summarize(root, trust=trust)
    else:
        with out.progress("indexing", None) as tick:

            def announce(n: int) -> None:
                tick.set_total(n)
                if n >= INDEXING_NOTICE:
                    sys.stderr.write(
                        f"kernelcache: reading the metadata of {n:,} entries that the scan "
                        f"index of {root} does not hold yet (once: later runs read the index)\n"
                    )
                    sys.stderr.flush()

            summary = summarize(root, trust=trust, progress=tick, announce=announce)
    tiers: dict[str, dict[str, float]] = {}
    totals, logs, log_problems = read_logs(root, tiers)
    folded = read_summary(root)
    processes = logs - 1 + folded["logs"] if folded else logs
    counters: dict[str, float] = {
        k: (round(v, 3) if k.endswith("seconds") else int(v)) for k, v in totals.items()
    }
    lookups = counters["hits"] + counters["misses"]  # one per kernel (companions apart)
    mean_build = counters["build_seconds"] / counters["builds"] if counters["builds"] else None
    # each kernel hit is a build avoided (a companion or memoized value is not a build)
    saved = counters["hits"] * mean_build if mean_build is not None else None
    artifact_bytes = summary.artifact_bytes
    metadata_bytes = summary.metadata_bytes

    def groups(column: str, none: str = "(none)") -> dict[str, dict[str, int]]:
        return {
            none if v is None else v: {"entries": n, "bytes": b}
            for v, (n, b) in summary.groups[column].items()
        }

    return {
        **envelope("stats", root),
        "exists": summary.exists,
        "entries": summary.entries,
        "bytes": artifact_bytes + metadata_bytes,
        "artifact_bytes": artifact_bytes,
        "metadata_bytes": metadata_bytes,
        "by_ext": groups("ext"),
        "by_target": groups("target"),
        "by_kernel": groups("kernel"),
        "by_kind": groups("kind", none="kernel"),
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
        "remote_tiers": {
            label: {k: int(v) for k, v in counts.items()} for label, counts in sorted(tiers.items())
        },
    }


def remote_urls(spec: str) -> list[str]:
    """The tiers of ``spec`` (``$KERNELCACHE_REMOTE``) as shown: URLs without passwords."""
    from ..remote import redact, split_urls

    return [redact(url) for url in split_urls(spec)]


def probe_remotes(spec: str, root: str) -> list[dict[str, Any]]:
    """Ask each tier of ``spec`` (``$KERNELCACHE_REMOTE``) whether it answers: one bounded
    request each (see :func:`kernelcache.remote.probe`)."""
    from ..remote import probe, split_urls

    return [probe(url, stats_root=root) for url in split_urls(spec)]


def require_clients(spec: str) -> None:
    """Check that the client of each built-in tier of ``spec`` is installed.

    Raises:
        MissingDependency: one is not (the message says how to install it).
    """
    from ..optional import require
    from ..remote import client_of, redact, split_urls

    for url in split_urls(spec):
        module = client_of(url)
        if module is not None:
            require(module, f"stats --remote ({redact(url)})")


def _write_atomic(path: str, text: str) -> None:
    """Write a file so that readers (a textfile collector) see the old or new text, whole."""
    directory, name = os.path.split(os.path.abspath(path))
    try:
        dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            replace_file(dfd, name, text.encode())
        finally:
            os.close(dfd)
    except OSError as e:
        raise UsageError(f"cannot write {path}: {e.strerror}") from e


def register(subparsers: Subparsers) -> None:
    p = add_command(
        subparsers,
        "stats",
        "entries and bytes by extension, target and kernel; hit rate and counters",
        uses=ROOT,
    )
    p.add_argument(
        "--format",
        choices=("table", "json", "prometheus"),
        default=None,
        help="output format (default: table; --json means json, and conflicts with the others)",
    )
    p.add_argument(
        "--top",
        type=count_arg,
        default=10,
        metavar="N",
        help="rows per breakdown in the table (0: all)",
    )
    p.add_argument(
        "--all",
        action="store_true",
        help="also the counters of companion and memoized entries, and entries by extension, "
        "target and kind (the table shows kernels first)",
    )
    p.add_argument(
        "--remote",
        action="store_true",
        help="also ask each tier of KERNELCACHE_REMOTE whether it answers, how fast, and "
        "(Redis) how many entries and bytes it holds (the first 100,000 keys at most)",
    )
    p.add_argument(
        "-o",
        "--output",
        metavar="FILE",
        help="write to FILE atomically (e.g. a node exporter textfile)",
    )
    p.add_argument(
        "-z",
        "--zero",
        action="store_true",
        help="zero the counters of the root (remove every statistics log); entries stay",
    )
    p.set_defaults(func=cmd_stats)


def cmd_zero(context: Context, out: Output) -> int:
    """``stats --zero``: remove the statistics logs of the root (see :func:`zero_logs`)."""
    from ..stats.summary import zero_logs

    root = context.existing_root()
    context.refuse_readonly(root, "stats --zero")
    context.require_writable()
    removed, left, error = zero_logs(context.store().locker)
    problems = [*left, *([error] if error else [])]

    def human() -> str:
        lines = [f"Statistics zeroed under {root} ({removed:,} logs removed)."]
        lines += [f"  not removed: {printable(p)}" for p in problems]
        return "\n".join(lines)

    out.emit({**envelope("stats", root), "zeroed": removed, "problems": problems}, human)
    return EXIT_PROBLEMS if problems else EXIT_OK


def cmd_stats(args: argparse.Namespace, out: Output) -> int:
    if out.json and args.format not in (None, "json"):
        raise UsageError(f"--json and --format {args.format} conflict: give one of them")
    context: Context = args.context
    if args.zero:
        return cmd_zero(context, out)
    if args.remote:
        require_clients(context.settings.remote or "")
    root = context.existing_root(missing_ok=True)  # before the first job: zeros
    doc = stats_document(root, context.trust, out)
    doc["remote_urls"] = remote_urls(context.settings.remote or "")
    doc["max_size"] = context.settings.max_size or None
    doc["max_size_from"] = context.origin("KERNELCACHE_MAX_SIZE") if doc["max_size"] else None
    if args.remote:
        doc["remote"] = probe_remotes(context.settings.remote or "", root)
    fmt = "json" if out.json else args.format or "table"
    if fmt == "prometheus":
        text = prometheus_text(doc)
    elif fmt == "json":
        text = dumps(doc) + "\n"
    else:
        text = stats_human(doc, args.top, args.all) + "\n"
    if args.output:
        _write_atomic(args.output, text)
    else:
        sys.stdout.write(text)
    down = [probe for probe in doc.get("remote") or () if not probe["up"]]
    return EXIT_PROBLEMS if down else EXIT_OK
