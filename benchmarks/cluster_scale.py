"""Jobs of many machines at scale, simulated on this one and modelled for 64 nodes: 4x2, 8x2,
16x4 and 32x8 ranks (nodes x ranks per node), each node a process whose ranks are threads
(``scale_node.py`` says how such a rank differs from a real one; the bridge's model runs a
process per rank), every node its own cache
root, all sharing a real 3-primary Redis Cluster, an S3 server (moto, a process of its own), or
both in layers (the cluster in front). Every rank lowers the same model (``cluster_model.py``:
the synthetic one, 13 variants compiled in --compile-s each, or the real bridge lowering 8
Triton calls for cuda:90).

Per job: the makespan, compiles against the ideal (each variant once for the job), the remote
requests by tier and kind (per node and per rank: those a rank's thread made, and those of the
node's background threads), the peak requests per second at the tier (the most in any second of
the job) and in the second after its first request, the value bytes read and written, the longest wait of a
rank (its time in the job less its own compiles), a digest of what each rank lowered, and the
Redis Cluster's memory and connections. Jobs: a cold one (fresh roots, an empty tier), a warm
one (fresh roots, the tier as the cold one left it), a killed primary (one of 3, kill -9 before
a cold job) and a stopped bucket (SIGSTOP before a cold job).

A model (``scale_model.py``) fitted on the cold jobs of 4x2, 8x2 and 16x4 predicts 32x8 and
64x8 (makespan, requests, peak load, Redis memory), checked against the measured 32x8. And the
slow tier: one ``get_or_create`` against an S3 server behind a proxy process that answers each
request 0.8 s late, at a 1 s timeout.

Usage::

    python benchmarks/cluster_scale.py [--quick] [--shapes 4x2,8x2,16x4,32x8]
        [--tiers cluster,s3,layered] [--model synthetic|triton] [--json OUT] [--plot PNG]

``--quick`` (at most 10 minutes on 2 cores): the layered tier's cold and warm jobs at every
shape, its killed primary and stopped bucket at 4x2, the slow tier. ``--json OUT`` writes
``{"measured": {shape: J}, "predicted": {"32x8": J, "64x8": J}, "slow_tier": {"lookup_s",
"timeout_s"}}``; every J has ``makespan_s``, ``compiles``, ``ideal``, ``requests`` (all remote
requests of the job), and measured ones ``digests`` (one per rank) and ``jobs`` (every job of
that shape). Prints a table, the model's check and one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from contextlib import ExitStack
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
SHAPES = {"4x2": (4, 2), "8x2": (8, 2), "16x4": (16, 4), "32x8": (32, 8)}
TIERS = ("cluster", "s3", "layered")
#: the jobs of a shape and tier: (scenario, the fault made before it, the tiers it concerns)
JOBS = {
    "cold": (None, TIERS),
    "warm": (None, TIERS),
    "killed-primary": ("killed-primary", ("cluster", "layered")),
    "stopped-bucket": ("stopped-s3", ("s3", "layered")),
}
#: the tier and job every shape is judged by (the recommended layout: a cluster over a bucket)
HEADLINE = ("layered", "synthetic", "cold")
#: object-store request prices, dollars per 1,000 (S3 Standard: PUT, COPY, POST, LIST one
#: price; GET, HEAD another; DELETE free)
PRICES = {"PUT": 0.005, "LIST": 0.005, "COPY": 0.005, "GET": 0.0004, "HEAD": 0.0004}
SLOW_DELAY, SLOW_TIMEOUT = 0.8, 1.0


def checkout_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KERNELCACHE_")}
    return {**env, "PYTHONPATH": str(REPO)}


def run_job(
    url: str, directory: Path, shape: str, model: str, args: argparse.Namespace
) -> dict[str, Any]:
    """One job of ``shape`` against ``url``: node processes (for the bridge's model, a process
    per rank: its compiler is a fork, which a process whose other threads hold locks must not
    make), started together once all are ready; what each reported, summed up
    (:func:`summary`). A job that fails ends every process it started."""
    nodes, per_node = SHAPES[shape]
    apart = model == "triton"
    procs = []
    for node in range(nodes):
        for first in range(0, per_node, 1 if apart else per_node):
            cfg = {
                "node": node,
                "first_rank": node * per_node + first,
                "ranks": 1 if apart else per_node,
                "root": str(directory / f"node{node}"),
                "url": url,
                "model": model,
                "compile_s": args.compile_s,
                "flush_s": 10.0,
            }
            procs.append(
                subprocess.Popen(
                    [sys.executable, str(HERE / "scale_node.py"), json.dumps(cfg)],
                    env=checkout_env(),
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            )
    try:
        return summary(started(procs, args.job_timeout), nodes)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=30)


def started(procs: list[subprocess.Popen[str]], timeout: float) -> list[dict[str, Any]]:
    """What each of ``procs`` reported, once all said ready and were told to start."""
    for p in procs:
        assert p.stdout is not None
        if p.stdout.readline().strip() != "ready":
            p.kill()
            raise SystemExit(f"a node failed to start:\n{p.communicate()[1][-3000:]}")
    start_at = time.time() + 0.3
    for p in procs:
        assert p.stdin is not None
        p.stdin.write(f"{start_at}\n")
        p.stdin.flush()
    reports = []
    for p in procs:
        out, err = p.communicate(timeout=timeout)
        if p.returncode != 0 or not out.strip():
            raise SystemExit(f"a node failed ({p.returncode}):\n{err[-3000:]}")
        reports.append(json.loads(out.strip().splitlines()[-1]))
    return reports


def summary(reports: list[dict[str, Any]], nodes: int) -> dict[str, Any]:
    """A job's numbers from its nodes' reports."""
    ranks = sorted((r for n in reports for r in n["ranks"]), key=lambda r: r["rank"])
    made = [r for n in reports for r in n["requests"]]
    by_kind: dict[str, Counter[str]] = {"redis": Counter(), "objstore": Counter()}
    per_node: dict[str, list[int]] = {"redis": [0] * nodes, "objstore": [0] * nodes}
    for n in reports:
        for _, tier, kind, _ in n["requests"]:
            by_kind[tier][kind] += 1
            per_node[tier][n["node"]] += 1
    per_rank = Counter(rank for *_, rank in made if rank >= 0)
    bytes_moved = Counter()
    for r in ranks:
        for tier, counters in r["tier"].items():
            bytes_moved[tier] += counters.get("bytes_read", 0) + counters.get("bytes_written", 0)
    s3_cost = sum(PRICES.get(kind, 0.0) * n for kind, n in by_kind["objstore"].items())
    return {
        "makespan_s": round(max(r["ended"] for r in ranks) - min(r["started"] for r in ranks), 3),
        "compiles": int(sum(n["builds"] for n in reports)),
        "cpu_s": round(sum(n["cpu_s"] for n in reports), 2),
        "requests": len(made),
        "requests_by_tier": {t: sum(c.values()) for t, c in by_kind.items()},
        "requests_by_kind": {t: dict(sorted(c.items())) for t, c in by_kind.items()},
        "requests_per_node_max": {t: max(v) for t, v in per_node.items()},
        "requests_per_rank_max": max(per_rank.values(), default=0),
        "requests_background": sum(1 for *_, rank in made if rank < 0),
        "peak_rps": peak_rate([t for t, *_ in made]),
        "first_second": first_second([t for t, *_ in made]),
        "bytes": dict(bytes_moved),
        "max_wait_s": round(max(r["ended"] - r["started"] - r["compile_s"] for r in ranks), 3),
        "digests": [r["digest"] for r in ranks],
        "s3_dollars_per_1000_jobs": round(s3_cost, 4),
        "warnings": sorted({w for n in reports for w in n["warnings"]})[:4],
    }


def first_second(times: list[float]) -> int:
    """The requests in the second after the job's first one: the burst the tier meets at the
    job's start."""
    return sum(1 for t in times if t < min(times) + 1.0) if times else 0


def peak_rate(times: list[float], window: float = 1.0, step: float = 0.1) -> int:
    """The most requests in any ``window`` seconds (sliding by ``step``)."""
    if not times:
        return 0
    first = min(times)
    bins = Counter(int((t - first) / step) for t in times)
    width = round(window / step)
    return max(sum(bins.get(b + i, 0) for i in range(width)) for b in range(max(bins) + 1))


def redis_state(servers: Any) -> dict[str, int]:
    """The cluster's running primaries, summed: memory used (now, and its peak), clients
    connected, connections received and commands processed."""
    total: Counter[str] = Counter()
    cluster = servers.cluster
    if cluster is None:
        return {}
    for node in cluster.nodes:
        if node.process is None or node.process.poll() is not None:
            continue
        try:
            info = node.client().info()
        except OSError:
            continue
        for field in ("used_memory", "used_memory_peak", "connected_clients"):
            total[field] += int(info.get(field, 0))
        total["cpu_ms"] += round(1000 * (info["used_cpu_sys"] + info["used_cpu_user"]))
        total["connections"] += int(info.get("total_connections_received", 0))
        total["commands"] += int(info.get("total_commands_processed", 0))
    return dict(total)


def cpu_of(pid: int) -> float:
    """The CPU seconds process ``pid`` has used (user and system), from ``/proc``."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def jobs_of(
    shape: str, tier: str, model: str, jobs: list[str], servers: Any, tmp: Path, args: Any
) -> list[dict[str, Any]]:
    """The ``jobs`` of one shape, tier and model (:data:`JOBS`), each a row."""
    rows = []
    name = url = ""
    for scenario in [s for s in jobs if tier in JOBS[s][1]]:
        fault = JOBS[scenario][0]
        if scenario != "warm":  # a warm job runs on what the cold one left
            name = f"{shape}-{tier}-{model}-{scenario}".replace("x", "by")
            if tier == "s3":
                servers.close_cluster()
            else:
                servers.fresh_cluster(name, 0)
            urls = servers.urls(tier, name).split()
            url = " ".join(f"{u}&timeout={args.timeout:g}s" for u in urls)
        before = redis_state(servers)
        made = servers.before(fault) if fault else {}
        load, moto = os.getloadavg()[0], cpu_of(servers.moto.pid)
        try:
            job = run_job(url, tmp / f"{name}-{scenario}", shape, model, args)
        finally:
            if fault:
                servers.undo(fault)
        after = redis_state(servers)
        base = before.get("used_memory", 0)
        job["redis"] = {
            "entries_bytes": after.get("used_memory", 0) - base,
            "peak_bytes": after.get("used_memory_peak", 0) - base,
            "connections": after.get("connections", 0) - before.get("connections", 0),
            "commands": after.get("commands", 0) - before.get("commands", 0),
        }
        redis_cpu = (after.get("cpu_ms", 0) - before.get("cpu_ms", 0)) / 1000
        job["server_cpu_s"] = round(redis_cpu + cpu_of(servers.moto.pid) - moto, 2)
        job["job_cpu_s"] = round(job["cpu_s"] + job["server_cpu_s"], 2)
        if made:
            job["evidence"] = made
        row = {"shape": shape, "tier": tier, "model": model, "job": scenario, "load": load}
        rows.append({**row, **job})
        print_row(rows[-1])
    return rows


HEADER = (
    f"{'shape':>5} {'tier':<8} {'model':<9} {'job':<14} {'span s':>6} {'builds':>6} {'same':>4} "
    f"{'requests':>8} {'redis':>6} {'s3':>5} {'/node':>6} {'/rank':>5} {'bg':>5} "
    f"{'peak/s':>6} {'1st s':>5} {'MB':>6} {'wait s':>6} {'redis MB':>8} {'cpu s':>6} "
    f"{'load':>5}"
)


def print_row(row: dict[str, Any]) -> None:
    tiers = row["requests_by_tier"]
    per_node = max(row["requests_per_node_max"].values())
    same = len(set(row["digests"])) == 1 and not row["digests"][0].startswith("failed")
    moved = sum(row["bytes"].values()) / 1e6
    memory = row["redis"]["peak_bytes"] / 1e6
    print(
        f"{row['shape']:>5} {row['tier']:<8} {row['model']:<9} {row['job']:<14} "
        f"{row['makespan_s']:>6.1f} {row['compiles']:>6} {'yes' if same else 'NO':>4} "
        f"{row['requests']:>8} {tiers['redis']:>6} {tiers['objstore']:>5} {per_node:>6} "
        f"{row['requests_per_rank_max']:>5} {row['requests_background']:>5} "
        f"{row['peak_rps']:>6} {row['first_second']:>5} {moved:>6.1f} {row['max_wait_s']:>6.1f} "
        f"{memory:>8.2f} {row['cpu_s']:>6.1f} {row['load']:>5.1f}",
        flush=True,
    )


def slow_tier(stack: ExitStack, tmp: Path) -> dict[str, float]:
    """One ``get_or_create`` of a missing key against an S3 server (moto) behind a proxy
    process that answers each request :data:`SLOW_DELAY` s late, at a :data:`SLOW_TIMEOUT`
    timeout: its seconds, and the timeout."""
    from object_store import MotoProcess, s3_env
    from remote_proxy import slow_proxy

    import kernelcache

    stack.enter_context(s3_env())
    moto = stack.enter_context(MotoProcess())
    moto.bucket("kc-slow")
    port = int(moto.endpoint.rsplit(":", 1)[1])
    with slow_proxy(port, SLOW_DELAY) as slow:
        url = f"s3://kc-slow/kc?endpoint=http://127.0.0.1:{slow}&region=us-east-1"
        cache = kernelcache.Cache(tmp / "slow", (), f"{url}&timeout={SLOW_TIMEOUT:g}s")
        started = time.monotonic()
        cache.get_or_create("0" * 32, "bin", lambda: (b"built", {"name": "k"}))
        took = time.monotonic() - started
    alone = kernelcache.Cache(tmp / "alone", (), "")  # the peer: the same call, no tier
    started = time.monotonic()
    alone.get_or_create("0" * 32, "bin", lambda: (b"built", {"name": "k"}))
    local = time.monotonic() - started
    print(
        f"\nslow tier: every request answered {SLOW_DELAY:g} s late at a {SLOW_TIMEOUT:g} s "
        f"timeout: one get_or_create {took:.3f} s ({took / SLOW_TIMEOUT:.2f} timeouts; the same "
        f"call with no tier {local:.3f} s); its tier's counters {cache.remote.counters}"
    )
    return {"lookup_s": round(took, 3), "timeout_s": SLOW_TIMEOUT}


def plan(args: argparse.Namespace) -> list[tuple[str, str, str, list[str]]]:
    """The jobs to run: (shape, tier, model, jobs), in order."""
    shapes = args.shapes.split(",")
    if args.quick:
        todo = [(s, "layered", "synthetic", ["cold", "warm"]) for s in shapes]
        todo[0] = (shapes[0], "layered", "synthetic", list(JOBS))
        return [*todo, (shapes[0], "layered", "triton", ["cold", "warm"])]
    jobs = args.jobs.split(",")
    todo = [(s, t, "synthetic", jobs) for s in shapes for t in args.tiers.split(",")]
    bridge = [s for s in args.bridge_shapes.split(",") if s]
    return todo + [(s, t, "triton", ["cold", "warm"]) for s in bridge for t in TIERS]


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, str(REPO))
    sys.path.insert(0, str(REPO / "tests" / "helpers"))
    from cluster_faults import Servers
    from cluster_model import IDEAL
    from scale_model import document, print_model

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="at most 10 minutes on 2 cores")
    parser.add_argument("--shapes", default=",".join(SHAPES), help=",".join(SHAPES))
    parser.add_argument("--tiers", default=",".join(TIERS), help=",".join(TIERS))
    parser.add_argument("--jobs", default=",".join(JOBS), help=",".join(JOBS))
    parser.add_argument(
        "--bridge-shapes", default="4x2,8x2", help="shapes the bridge's model runs at (4x2,8x2)"
    )
    parser.add_argument("--compile-s", type=float, default=0.5, help="a synthetic compile")
    parser.add_argument(
        "--timeout", type=float, default=5.0, help="each tier's timeout, s (5: see the doc)"
    )
    parser.add_argument("--job-timeout", type=float, default=900.0)
    parser.add_argument("--json", type=Path, help="write the document here")
    parser.add_argument("--plot", type=Path, help="write the model's curves here (PNG)")
    args = parser.parse_args(argv)
    for given, known in ((args.shapes + "," + args.bridge_shapes, SHAPES), (args.jobs, JOBS)):
        unknown = set(given.split(",")) - set(known) - {""}
        if unknown:
            raise SystemExit(f"unknown: {', '.join(sorted(unknown))}; known: {', '.join(known)}")
    print(f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}; ideal: {IDEAL} compiles a job")
    print("a rank is a thread of its node's process (scale_node.py); load: the 1-minute load")
    print("average as the job started; same: every rank lowered the same thing")
    print(HEADER, flush=True)
    rows: list[dict[str, Any]] = []
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="kc-scale-") as name, ExitStack() as stack:
        tmp = Path(name)
        servers = Servers(stack, tmp)
        stack.callback(servers.close_cluster)
        for shape, tier, model, jobs in plan(args):
            rows += jobs_of(shape, tier, model, jobs, servers, tmp, args)
        servers.close_cluster()
        servers.moto.send_signal(signal.SIGTERM)
        slow = slow_tier(stack, tmp)
    doc = document(rows, HEADLINE, IDEAL, slow, os.cpu_count() or 1)
    print_model(doc)
    print(f"\n{time.monotonic() - started:.0f} s, load {os.getloadavg()[0]:.1f}")
    if args.plot:
        from scale_model import plot

        plot(doc, args.plot)
    print(json.dumps(doc, sort_keys=True))
    if args.json:
        args.json.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
