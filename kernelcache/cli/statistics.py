"""``kernelcache stats``: a report of a root: entries and bytes by extension, target and kernel,
and the counters of every process, as a table, JSON or Prometheus text.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from ..config import DEFAULTS
from ..stats.counters import COUNTERS, TIER_COUNTERS
from ..stats.summary import read_logs, read_summary
from ..store.layout import replace_file
from .common import Context, Subparsers, add_command, count_arg
from .output import (
    EXIT_OK,
    EXIT_PROBLEMS,
    Output,
    UsageError,
    dumps,
    envelope,
    format_table,
    human_duration,
    human_size,
    plural,
    printable,
)


def stats_document(root: str, trust: str = DEFAULTS.trust) -> dict[str, Any]:
    """The ``stats --json`` document of a root (``trust``: whose scan index is read)."""
    from ..maintenance.inventory import summarize

    summary = summarize(root, trust=trust)
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


def _lookups(hits: int, misses: int) -> str:
    rate = f" (hit rate {hits / (hits + misses) * 100:.1f}%)" if hits + misses else ""
    return f"{plural(hits, 'hit')}, {plural(misses, 'miss')}{rate}"


def _stats_human(doc: dict[str, Any], top: int) -> str:
    c = doc["counters"]
    lines = [
        f"Cache root:       {doc['root']}" + ("" if doc["exists"] else " (does not exist yet)")
    ]
    lines.append(f"Entries:          {doc['entries']:,}")
    lines.append(
        f"Size:             {human_size(doc['bytes'])} (artifacts {human_size(doc['artifact_bytes'])},"
        f" metadata {human_size(doc['metadata_bytes'])})"
    )
    cap = doc.get("max_size")
    if cap:
        used = doc["bytes"] / cap * 100
        lines.append(
            f"Size cap:         {human_size(cap)} ({used:.0f}% used; KERNELCACHE_MAX_SIZE)"
        )
    q, t = doc["quarantine"], doc["temp"]
    lines.append(f"Quarantined:      {plural(q['files'], 'file')}, {human_size(q['bytes'])}")
    lines.append(f"Staging files:    {plural(t['files'], 'file')}, {human_size(t['bytes'])}")
    if doc["problems"]:
        lines.append(f"Problems:         {doc['problems']:,} (run: kernelcache verify)")
    lines.append("")
    rate = doc["hit_rate"]
    lines.append(f"Hits:             {c['hits']:,} (one lookup per kernel)")
    lines.append(f"Misses:           {c['misses']:,}")
    lines.append(f"Hit rate:         {'-' if rate is None else f'{rate * 100:.1f}%'}")
    build = f"{c['builds']:,}"
    if doc["mean_build_seconds"] is not None:
        build += (
            f" (total {human_duration(c['build_seconds'])}, mean "
            f"{human_duration(doc['mean_build_seconds'])})"
        )
    lines.append(f"Builds:           {build}")
    saved = doc["compile_seconds_saved"]
    lines.append(
        "Compile time saved: "
        + (
            "-"
            if saved is None
            else f"~{human_duration(saved)} ({plural(c['hits'], 'build')} avoided x mean "
            "build time)"
        )
    )
    companions = _lookups(c["companion_hits"], c["companion_misses"])
    lines.append(f"PTX companions:   {companions}")
    lines.append(f"Memoized values:  {_lookups(c['memo_hits'], c['memo_misses'])}")
    lines.append(
        f"Written:          {plural(c['puts'], 'entry')}, {human_size(c['bytes_written'])}; "
        f"read {human_size(c['bytes_read'])}"
    )
    lines.append(f"Corrupt reads:    {c['corrupt']:,}")
    lines.append(f"Untrusted:        {c['untrusted']:,} (refused by KERNELCACHE_TRUST)")
    lines.append(f"Errors:           {c['errors']:,}")
    lines.append(
        f"Lock waits:       {c['lock_waits']:,} ({c['lock_timeouts']:,} timed out: built privately)"
    )
    remote = " ".join(doc["remote_urls"]) or "(none configured)"
    lines.append(printable(f"Remote:           {remote}"))
    if doc["remote_urls"] or any(c[k] for k in COUNTERS if k.startswith("remote_")):
        lines.append(
            f"  lookups:        {_lookups(c['remote_hits'], c['remote_misses'])}; "
            f"{c['remote_puts']:,} puts, {c['remote_errors']:,} errors, "
            f"{c['unauthenticated']:,} unauthenticated (refused: bad or missing signature)"
        )
    lines.append(f"Processes logged: {doc['processes']:,}")
    tiers = doc["remote_tiers"]
    if tiers:
        rows = [["REMOTE TIER", "HITS", "MISSES", "ERRORS", "TIMEOUTS", "READ", "PUTS", "WRITTEN"]]
        rows[0].append("BACKFILLS")
        for label, c in tiers.items():
            row = [printable(label), *(f"{c[k]:,}" for k in ("hits", "misses", "errors"))]
            row += [f"{c['timeouts']:,}", human_size(c["bytes_read"]), f"{c['puts']:,}"]
            row += [human_size(c["bytes_written"]), f"{c['backfills']:,}"]
            rows.append(row)
        lines += ["", format_table(rows, right=tuple(range(1, 9)))]
    for probe in doc.get("remote") or ():
        state = "answers" if probe["up"] else f"does not answer: {probe['error']}"
        mode = " (read-only)" if probe["read_only"] else ""
        lines.append(
            printable(f"Remote {probe['tier']}{mode}: {state} ({probe['seconds'] * 1000:.1f} ms)")
        )
        usage = probe.get("usage")
        if usage and usage["entries"] is not None:
            more = "" if usage["complete"] else f" or more (the first {usage['entries']:,} keys)"
            lines.append(
                f"  {usage['entries']:,} entries{more}, {human_size(usage['bytes'])}"
                + (
                    f"; the server's database holds {usage['server_keys']:,} keys"
                    if usage["server_keys"] is not None
                    else ""
                )
            )
    for title, key in (("extension", "by_ext"), ("target", "by_target"), ("kernel", "by_kernel")):
        items = list(doc[key].items())
        if not items:
            continue
        shown = items if top <= 0 else items[:top]
        rows = [[title.upper(), "ENTRIES", "SIZE"]]
        rows += [[name, f"{v['entries']:,}", human_size(v["bytes"])] for name, v in shown]
        lines += ["", format_table(rows, right=(1, 2))]
        if len(shown) < len(items):
            lines.append(f"... and {len(items) - len(shown)} more (--top 0 for all)")
    return "\n".join(lines)


#: counters whose Prometheus name puts the unit last, as the convention wants; the old names
#: (``kernelcache_bytes_read_total``, ...) are exported too, marked deprecated, for one release
PROMETHEUS_NAMES = {"bytes_read": "read_bytes", "bytes_written": "written_bytes"}


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
    if doc.get("max_size"):
        help_ = "The size cap of the root (KERNELCACHE_MAX_SIZE)."
        metric("max_size_bytes", "gauge", help_, [("", doc["max_size"])])
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
            f"{PROMETHEUS_NAMES.get(name, name)}_total",
            "counter",
            f"Sum of the {name} counter over all processes.",
            [("", value)],
        )
        if name in PROMETHEUS_NAMES:  # the name before units came last, for one release
            new = f"kernelcache_{PROMETHEUS_NAMES[name]}_total"
            metric(f"{name}_total", "counter", f"Deprecated: use {new}.", [("", value)])
    if doc["hit_rate"] is not None:
        metric(
            "hit_ratio",
            "gauge",
            "hits / (hits + misses), one lookup per kernel.",
            [("", float(doc["hit_rate"]))],
        )
    if doc["compile_seconds_saved"] is not None:
        saved = [("", float(doc["compile_seconds_saved"]))]
        help_ = "Estimated compile time saved: kernel hits x mean build time."
        metric("compile_saved_seconds", "gauge", help_, saved)
        metric(
            "compile_seconds_saved",
            "gauge",
            "Deprecated: use kernelcache_compile_saved_seconds.",
            saved,
        )
    metric("processes", "gauge", "Processes that logged statistics.", [("", doc["processes"])])
    for name in TIER_COUNTERS:
        samples = [
            (f'tier="{_prometheus_escape(label)}"', counts[name])
            for label, counts in doc["remote_tiers"].items()
        ]
        if samples:
            help_ = f"Sum of the {name} counter of each remote tier over all processes."
            metric(
                f"remote_tier_{PROMETHEUS_NAMES.get(name, name)}_total", "counter", help_, samples
            )
            if name in PROMETHEUS_NAMES:
                new = f"kernelcache_remote_tier_{PROMETHEUS_NAMES[name]}_total"
                metric(f"remote_tier_{name}_total", "counter", f"Deprecated: use {new}.", samples)
    for probe in doc.get("remote") or ():
        labels = f'tier="{_prometheus_escape(probe["tier"])}"'
        metric("remote_up", "gauge", "Whether the tier answered.", [(labels, int(probe["up"]))])
    return "\n".join(out) + "\n"


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
    root = context.existing_root(missing_ok=True)  # before the first job: zeros
    doc = stats_document(root, context.trust)
    doc["remote_urls"] = remote_urls(context.settings.remote or "")
    doc["max_size"] = context.settings.max_size or None
    if args.remote:
        doc["remote"] = probe_remotes(context.settings.remote or "", root)
    fmt = "json" if out.json else args.format or "table"
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
    down = [probe for probe in doc.get("remote") or () if not probe["up"]]
    return EXIT_PROBLEMS if down else EXIT_OK
