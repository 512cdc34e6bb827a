"""Remote hits per tier (Redis, Redis Cluster, an S3-compatible store) against local hits, and a
job's start through each tier, all measured in the same run.

For each tier and artifact size (64 KiB, 1 MiB), from one process:

* ``local``: ``Cache.get`` on a warm local root (the peer every ratio is taken against);
* ``tier``: the tier's ``get``: one read, header, digests (and size bound) checked;
* ``cache``: ``Cache.get`` on an empty local root: a remote hit, checked again and published
  into the root (what a process on a fresh node pays once per kernel).

Then a job start: 4 processes on 2 fresh roots (2 per root, as 2 nodes of 2 processes) call
``get_or_create_many`` for every key, the tier holding them all; against the same job on warm
roots (every key a local hit). Prints a table, then one JSON line; ``--out`` writes the JSON.

Usage: ``python benchmarks/remote.py [--tiers redis,cluster,s3] [--keys 32] [--out F]``. The
servers are started on this machine (loopback): redis-server, a 3-node Redis Cluster, and
moto's S3-compatible server in a process of its own.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from contextlib import ExitStack
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "helpers"))

from common import emit_summary

import kernelcache
from kernelcache.remote import open_remote

EXT = "bin"  # (opaque bytes: a .cubin must be a whole NVIDIA ELF file)
META = {"name": "bench_kernel", "target": "cuda:90"}
SIZES = {"64K": 64 << 10, "1M": 1 << 20}


def key_of(i: int, size: int) -> str:
    return f"{size:016x}{i:048x}"


def payload(key: str, size: int) -> bytes:
    return (key.encode() * (size // 64 + 1))[:size]


def start_moto(stack: ExitStack) -> tuple[str, subprocess.Popen[bytes]]:
    """moto's S3 server in a process of its own (ended with ``stack``); the URL of a bucket
    in it (prefix ``run``) and the process. Sets the test credentials in this process's
    environment (the children inherit them)."""
    from object_store import S3_ENV
    from redis_server import free_port

    os.environ.update(S3_ENV)
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    stack.callback(process.wait, 10)
    stack.callback(process.terminate)
    endpoint = f"http://127.0.0.1:{port}"
    import boto3

    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    deadline = time.monotonic() + 30
    while True:
        try:
            client.create_bucket(Bucket="kc-bench")
            break
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    return f"s3://kc-bench/run?endpoint={endpoint}&region=us-east-1", process


def start_tiers(names: list[str], tmp: Path, stack: ExitStack) -> dict[str, str]:
    from redis_server import RedisClusterServers, RedisServer

    urls = {}
    namespace = f"namespace=kcbench{uuid.uuid4().hex[:8]}&timeout=5"
    if "redis" in names:
        server = stack.enter_context(RedisServer(tmp / "redis"))
        urls["redis"] = f"{server.url}?{namespace}"
    if "cluster" in names:
        cluster = stack.enter_context(RedisClusterServers(tmp / "cluster"))
        urls["cluster"] = f"{cluster.url}?{namespace}"
    if "s3" in names:
        urls["s3"] = start_moto(stack)[0]
    return urls


def timed(fn: Any, calls: list[tuple[str, ...]]) -> list[float]:
    out = []
    for args in calls:
        t0 = time.perf_counter_ns()
        if fn(*args) is None:
            raise SystemExit(f"not a hit: {args}")
        out.append((time.perf_counter_ns() - t0) / 1000)
    return out


def latencies(url: str, size: int, keys: int, rounds: int, tmp: Path) -> dict[str, float]:
    """Median microseconds of a local hit, a tier read and a remote hit via ``Cache.get``."""
    names = [key_of(i, size) for i in range(keys)]
    warm = kernelcache.Cache(tmp / f"warm-{size}", (), url)
    for key in names:
        warm.put(key, EXT, payload(key, size), META)
    local = kernelcache.Cache(warm.root, (), "")
    tier = open_remote(url)
    calls = [(key, EXT) for key in names]
    result = {
        "local": timed(local.get, calls * rounds),
        "tier": timed(tier.get, calls * rounds),
        "cache": [],
    }
    for r in range(rounds):
        fresh = kernelcache.Cache(tmp / f"fresh-{size}-{r}", (), url)
        result["cache"] += timed(fresh.get, calls)
    return {name: statistics.median(values) for name, values in result.items()}


def _job_process(url: str, root: str, keys: list[str], size: int, barrier: Any, q: Any) -> None:
    cache = kernelcache.Cache(root, (), url)
    items = [
        kernelcache.BuildItem(k, EXT, lambda k=k: (payload(k, size), META))  # type: ignore[misc]
        for k in keys
    ]
    barrier.wait()
    started = time.perf_counter()
    arts = cache.get_or_create_many(items)
    q.put((started, time.perf_counter(), sum(a.source == "remote" for a in arts)))


def job_start(url: str, size: int, keys: int, roots: list[str]) -> dict[str, float]:
    """Wall seconds for 4 processes on 2 roots to get every key (2 processes per root)."""
    ctx = mp.get_context("spawn")  # obstore cannot make requests in a forked child
    barrier, q = ctx.Barrier(4), ctx.Queue()
    names = [key_of(i, size) for i in range(keys)]
    procs = [
        ctx.Process(target=_job_process, args=(url, roots[i % 2], names, size, barrier, q))
        for i in range(4)
    ]
    for p in procs:
        p.start()
    done = [q.get(timeout=600) for _ in procs]
    for p in procs:
        p.join()
    wall = max(end for _, end, _ in done) - min(start for start, _, _ in done)
    return {"seconds": wall, "remote_hits": sum(n for _, _, n in done)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiers", default="redis,cluster,s3", help="redis,cluster,s3")
    parser.add_argument("--keys", type=int, default=32, help="distinct artifacts per size (32)")
    parser.add_argument("--rounds", type=int, default=4, help="reads of every key (4)")
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    args = parser.parse_args(argv)
    names = args.tiers.split(",")
    rows: list[dict[str, Any]] = []
    jobs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="kc-bench-") as tmp_name, ExitStack() as stack:
        tmp = Path(tmp_name)
        urls = start_tiers(names, tmp, stack)
        for name in names:
            for label, size in SIZES.items():
                medians = latencies(urls[name], size, args.keys, args.rounds, tmp / name)
                rows.append(
                    {"tier": name, "size": label, **{f"{k}_us": v for k, v in medians.items()}}
                )
            size = SIZES["64K"]
            warm_roots = [str(tmp / name / f"job-warm-{i}") for i in range(2)]
            cold = job_start(
                urls[name], size, args.keys, [str(tmp / name / f"job-{i}") for i in range(2)]
            )
            job_start(urls[name], size, args.keys, warm_roots)  # fills the roots
            warm = job_start("", size, args.keys, warm_roots)
            jobs.append({"tier": name, "cold_roots": cold, "warm_roots": warm})
    print(
        f"{'tier':<8} {'size':>5} {'local us':>9} {'tier us':>9} {'cache us':>9} "
        f"{'tier/local':>10} {'cache/local':>11}"
    )
    for r in rows:
        local, tier, cache = r["local_us"], r["tier_us"], r["cache_us"]
        print(
            f"{r['tier']:<8} {r['size']:>5} {local:>9.0f} {tier:>9.0f} {cache:>9.0f} "
            f"{tier / local:>9.1f}x {cache / local:>10.1f}x"
        )
    print(
        f"\n{'job start: 4 processes, 2 roots':<34} {'keys':>5} {'cold roots s':>12} "
        f"{'warm roots s':>12} {'ratio':>6}"
    )
    for j in jobs:
        cold, warm = j["cold_roots"]["seconds"], j["warm_roots"]["seconds"]
        print(f"{j['tier']:<34} {args.keys:>5} {cold:>12.3f} {warm:>12.3f} {cold / warm:>5.1f}x")
    summary = {
        "benchmark": "remote",
        "cpus": os.cpu_count(),
        "keys": args.keys,
        "rounds": args.rounds,
        "latency_median_us": [
            {k: round(v, 1) if isinstance(v, float) else v for k, v in r.items()} for r in rows
        ],
        "job_start": jobs,
    }
    emit_summary(summary, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
