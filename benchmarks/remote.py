"""Remote (Redis) hits against local hits, for 64 KB artifacts, from 1 and 16 processes.

Scenarios, each measured in the same run against the same data:

* ``local``: ``Cache.get`` on a warm local root (the peer every ratio is taken against);
* ``remote-tier``: ``RedisTier.get``: one Redis round trip, header and digest verified;
* ``remote-cache``: ``Cache.get`` on an empty local root: a remote hit, verified again and
  published into the local root (what a process on a fresh node pays once per kernel).

Each process reads every key (``--keys``) ``--rounds`` times, after a barrier; latency is per
call (median and 90th percentile over all processes), throughput is all calls over the wall
time from the barrier to the last process's end. Prints a table, then one JSON line; ``--out``
also writes the JSON to a file.

Usage: ``python benchmarks/remote.py [--url redis://host:6379/0] [--procs 1,16] [--out F]``.
Without ``--url`` a redis-server is started in a temporary directory (tests/redis_server.py).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import kernelcache
from kernelcache.remote import open_remote

EXT = "cubin"


def key_of(i: int) -> str:
    return f"{i:064x}"


def worker(
    scenario: str,
    url: str,
    warm_root: str,
    scratch: str,
    keys: int,
    rounds: int,
    barrier: Any,
    results: Any,
) -> None:
    tier = open_remote(url) if scenario == "remote-tier" else None
    local = kernelcache.Cache(warm_root, readonly_roots=[], remote="")
    names = [key_of(i) for i in range(keys)]
    latencies: list[int] = []
    barrier.wait()
    started = time.perf_counter()
    for r in range(rounds):
        if scenario == "remote-cache":
            root = os.path.join(scratch, f"{os.getpid()}-{r}")
            cache = kernelcache.Cache(root, readonly_roots=[], remote=url)
        for key in names:
            t0 = time.perf_counter_ns()
            if scenario == "local":
                art = local.get(key, EXT)
                ok = art is not None and art.source == "local"
            elif scenario == "remote-tier":
                ok = tier.get(key, EXT) is not None
            else:
                art = cache.get(key, EXT)
                ok = art is not None and art.source == "remote"
            latencies.append(time.perf_counter_ns() - t0)
            if not ok:
                raise SystemExit(f"{scenario}: {key} was not a hit")
    results.put((latencies, started, time.perf_counter()))


def run(scenario: str, procs: int, args: argparse.Namespace, url: str, warm: str) -> dict:
    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(procs)
    results = ctx.Queue()
    rounds = args.rounds if scenario != "remote-cache" else max(1, args.rounds // 4)
    if procs > 1:
        rounds = max(1, rounds // 4)
    with tempfile.TemporaryDirectory(prefix="kc-bench-") as scratch:
        workers = [
            ctx.Process(
                target=worker,
                args=(scenario, url, warm, scratch, args.keys, rounds, barrier, results),
            )
            for _ in range(procs)
        ]
        for w in workers:
            w.start()
        collected = [results.get(timeout=600) for _ in workers]
        for w in workers:
            w.join()
            if w.exitcode != 0:
                raise SystemExit(f"a {scenario} worker failed (exit code {w.exitcode})")
    latencies = sorted(ns for lat, _, _ in collected for ns in lat)
    wall = max(end for _, _, end in collected) - min(start for _, start, _ in collected)
    ops = len(latencies)
    return {
        "scenario": scenario,
        "procs": procs,
        "ops": ops,
        "median_us": statistics.median(latencies) / 1000,
        "p90_us": latencies[int(0.9 * (ops - 1))] / 1000,
        "ops_per_s": ops / wall,
        "mb_per_s": ops * args.size / wall / 1e6,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="an existing Redis server (default: start one)")
    parser.add_argument("--size", type=int, default=64 * 1024, help="artifact bytes (64 KiB)")
    parser.add_argument("--keys", type=int, default=128, help="distinct artifacts (128)")
    parser.add_argument("--rounds", type=int, default=8, help="reads of every key (8)")
    parser.add_argument("--procs", default="1,16", help="process counts (1,16)")
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args(argv)
    procs = [int(p) for p in args.procs.split(",")]
    namespace = f"kcbench{uuid.uuid4().hex[:8]}"

    with tempfile.TemporaryDirectory(prefix="kc-bench-") as tmp:
        server = None
        base = args.url
        if base is None:
            from redis_server import RedisServer

            server = RedisServer(Path(tmp) / "redis").start()
            base = server.url
        url = f"{base}{'&' if '?' in base else '?'}namespace={namespace}&timeout=5"
        try:
            warm = os.path.join(tmp, "warm")
            writer = kernelcache.Cache(warm, readonly_roots=[], remote=url)
            for i in range(args.keys):
                data = (key_of(i).encode() * (args.size // 64 + 1))[: args.size]
                writer.put(key_of(i), EXT, data, {"name": "bench_kernel", "target": "cuda:90"})
            if writer.remote.counters.get("puts") != args.keys:
                raise SystemExit(f"could not fill {writer.remote!r}: {writer.remote.counters}")
            rows = [
                run(scenario, p, args, url, warm)
                for p in procs
                for scenario in ("local", "remote-tier", "remote-cache")
            ]
            client = writer.remote._client
            for name in client.scan_iter(match=f"{namespace}:*", count=1000):
                client.delete(name)
        finally:
            if server is not None:
                server.stop()

    def row(scenario: str, p: int) -> dict:
        return next(r for r in rows if r["scenario"] == scenario and r["procs"] == p)

    print(
        f"{'scenario':<14} {'procs':>5} {'ops':>7} {'median us':>10} {'p90 us':>9} "
        f"{'ops/s':>10} {'MB/s':>8} {'median vs local':>16}"
    )
    for r in rows:
        ratio = r["median_us"] / row("local", r["procs"])["median_us"]
        print(
            f"{r['scenario']:<14} {r['procs']:>5} {r['ops']:>7} {r['median_us']:>10.1f} "
            f"{r['p90_us']:>9.1f} {r['ops_per_s']:>10.0f} {r['mb_per_s']:>8.1f} {ratio:>15.1f}x"
        )
    ratios = {}
    for p in procs:
        local = row("local", p)
        for scenario in ("remote-tier", "remote-cache"):
            r = row(scenario, p)
            ratios[f"{scenario}_median_vs_local_{p}p"] = round(
                r["median_us"] / local["median_us"], 2
            )
            ratios[f"{scenario}_throughput_vs_local_{p}p"] = round(
                r["ops_per_s"] / local["ops_per_s"], 3
            )
    summary = {
        "benchmark": "remote",
        "artifact_bytes": args.size,
        "keys": args.keys,
        "cpus": os.cpu_count(),
        "server": "given" if args.url else "local redis-server",
        "results": [
            {k: round(v, 2) if isinstance(v, float) else v for k, v in r.items()} for r in rows
        ],
        "ratios": ratios,
    }
    line = json.dumps(summary, sort_keys=True)
    print(line)
    if args.out:
        Path(args.out).write_text(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
