"""How ``kernelcache stats`` reads: the table for people (:func:`stats_human`) and the
Prometheus text exposition format (:func:`prometheus_text`), both from the stats document.

Invariant: the table leads with kernels (entries without a ``kind``), the count ``warm`` and
``ls`` give; what packages keep beside them (companions, memoized values, ...) is counted on the
next line and broken down on request (``--all``); the JSON document and the Prometheus text
carry everything.
"""

from __future__ import annotations

from typing import Any

from ..stats.counters import COUNTERS, TIER_COUNTERS
from .configuring import where_set
from .output import format_table, human_duration, human_size, plural, printable

#: what the table calls entries without a ``kind`` (``by_kind``'s name for them)
KERNEL = "kernel"


def _lookups(hits: int, misses: int) -> str:
    rate = f" (hit rate {hits / (hits + misses) * 100:.1f}%)" if hits + misses else ""
    return f"{plural(hits, 'hit')}, {plural(misses, 'miss')}{rate}"


def _entries(doc: dict[str, Any]) -> list[str]:
    """The lines that count entries: kernels first, then every entry with its kinds."""
    kernels = doc["by_kind"].get(KERNEL, {"entries": 0})["entries"]
    others = [(k, v["entries"]) for k, v in doc["by_kind"].items() if k != KERNEL]
    lines = [f"Kernels:          {kernels:,}", f"Entries:          {doc['entries']:,}"]
    if others:
        kinds = ", ".join(f"{n:,} {printable(k)}" for k, n in others)
        lines[-1] += f" ({plural(kernels, KERNEL)}, {kinds})"
    return lines


def _remote_lookups(c: dict[str, Any], tiers: dict[str, dict[str, int]]) -> list[str]:
    """The remote lookups of every entry (kernels, companions, memoized values), and how they
    relate to the tiers' own counters below: a lookup no tier was asked (skipped) is a miss
    here and a ``skipped`` there, never a tier's miss."""
    hits, misses = c["remote_hits"], c["remote_misses"]
    line = f"  lookups:        {_lookups(hits, misses)}, of every entry (kernels and the rest)"
    skipped = sum(t.get("skipped", 0) for t in tiers.values())
    if len(tiers) == 1 and skipped:  # one tier: every lookup is its hit, miss, error or skip
        line += f"; {skipped:,} not sent to the tier (skipped: see SKIPPED below)"
    return [line]


def stats_human(doc: dict[str, Any], top: int, every: bool = False) -> str:
    """The ``stats`` table of ``doc``: kernels, counters, the kernels by name (and by extension
    and target where every entry is a kernel); ``every`` (``--all``) adds the counters of
    companion and memoized entries and the breakdowns of every entry by extension, target and
    kind."""
    c = doc["counters"]
    lines = [
        f"Cache root:       {doc['root']}" + ("" if doc["exists"] else " (does not exist yet)")
    ]
    lines += _entries(doc)
    lines.append(
        f"Size:             {human_size(doc['bytes'])} (artifacts {human_size(doc['artifact_bytes'])},"
        f" metadata {human_size(doc['metadata_bytes'])})"
    )
    cap = doc.get("max_size")
    if cap:
        used = doc["bytes"] / cap * 100
        named = where_set("KERNELCACHE_MAX_SIZE", doc.get("max_size_from") or "environment")
        lines.append(f"Size cap:         {human_size(cap)} ({used:.0f}% used; {named})")
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
    if every:
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
        lines += _remote_lookups(c, doc["remote_tiers"])
        lines.append(
            f"  entries:        {c['remote_puts']:,} puts, {c['remote_errors']:,} errors, "
            f"{c['unauthenticated']:,} unauthenticated (refused: bad or missing signature)"
        )
    lines.append(f"Processes logged: {doc['processes']:,}")
    tiers = doc["remote_tiers"]
    if tiers:
        rows = [["REMOTE TIER", "HITS", "MISSES", "SKIPPED", "ERRORS", "TIMEOUTS", "READ", "PUTS"]]
        rows[0] += ["WRITTEN", "BACKFILLS"]
        for label, c in tiers.items():
            counts = ("hits", "misses", "skipped", "errors")
            row = [printable(label), *(f"{c.get(k, 0):,}" for k in counts)]
            row += [f"{c['timeouts']:,}", human_size(c["bytes_read"]), f"{c['puts']:,}"]
            row += [human_size(c["bytes_written"]), f"{c['backfills']:,}"]
            rows.append(row)
        lines += ["", format_table(rows, right=tuple(range(1, 10)))]
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
    kernels_only = set(doc["by_kind"]) <= {KERNEL}  # then every breakdown counts kernels
    tables = [("extension", "by_ext"), ("target", "by_target")] * (every or kernels_only)
    tables += [("kind", "by_kind")] * every
    for title, key in [*tables, ("kernel", "by_kernel")]:
        items = list(doc[key].items())
        if not items:
            continue
        shown = items if top <= 0 else items[:top]
        rows = [[title.upper(), "ENTRIES", "SIZE"]]
        rows += [[name, f"{v['entries']:,}", human_size(v["bytes"])] for name, v in shown]
        lines += ["", format_table(rows, right=(1, 2))]
        if len(shown) < len(items):
            lines.append(f"... and {len(items) - len(shown)} more (--top 0 for all)")
    if not every and doc["entries"] > doc["by_kind"].get(KERNEL, {"entries": 0})["entries"]:
        lines += ["", "(stats --all: the other entries' counters, and entries by extension, "]
        lines[-1] += "target and kind)"
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
