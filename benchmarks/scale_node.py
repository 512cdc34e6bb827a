"""One node of a simulated job of ``cluster_scale.py``: a process whose ranks are threads, each
with a cache of its own (``kernelcache.Cache`` on the node's root, its own connections to the
tier) lowering the same model (``cluster_model.py``) at the same moment, as the processes of a
node of a real job do. (The bridge's model runs one rank a process, several processes on the
node's root: its compiler is a fork, which a process whose other threads hold locks must not
make.)

How a simulated rank differs from a real one (the benchmark's table says so too): the ranks of
a node share one interpreter (its GIL: their CPU work runs one at a time, and all of the job's
runs on this machine's cores, not on one core or more per rank) and one process's state (its
counters, its one warning per kind, the bridge's memoized identities, the wait budget a spent
lock timeout leaves for the process's next calls); a synthetic compile is a sleep (it holds no
core); their local root is one directory of this machine. What a rank asks of the node's root
(its flocks: one per opened file, so the threads of a process exclude each other as processes
do) and of the tier (its own client and connections) is what a process asks.

``python scale_node.py JSON`` prepares the node described by JSON (its caches; the bridge's
model traced), says ``ready``, reads the job's start (a wall-clock time) from its standard
input, runs, and prints one JSON line: each rank's start, end, compile time, digest and tier
counters, and every remote request the node made from the start (wall time, tier, kind, rank or
-1 for a background thread).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent

_rank = threading.local()


def _kind(tier: str, kind: str, args: tuple[Any, ...], names: dict[str, str]) -> str:
    """A request's kind as the table shows it: a Redis script by its name."""
    if tier == "redis" and kind in ("EVALSHA", "EVAL") and len(args) > 1:
        script = args[1].decode() if isinstance(args[1], bytes) else str(args[1])
        return f"{kind}:{names.get(script, 'script')}"
    return kind


def record_requests() -> list[tuple[float, str, str, int]]:
    """Record, from now on, every remote request of this process: (wall time, tier, kind, the
    rank whose thread made it or -1)."""
    from cluster_model import watch_requests

    from kernelcache.remote.redis.scripts import SCRIPTS, SHAS

    names = {sha: name for name, sha in SHAS.items()}
    names.update({text: name for name, text in SCRIPTS.items()})
    made: list[tuple[float, str, str, int]] = []

    def seen(tier: str, kind: str, args: tuple[Any, ...]) -> None:
        made.append((time.time(), tier, _kind(tier, kind, args, names), getattr(_rank, "n", -1)))

    watch_requests(seen)
    return made


def attribute_workers() -> None:
    """Requests an object-store tier makes in its worker threads (each waited for by the
    thread that asked) are counted as that thread's rank's."""
    from kernelcache.remote import contact

    submit = contact._workers.submit

    def submitted(task: Any) -> None:
        rank = getattr(_rank, "n", -1)

        def run() -> None:
            _rank.n = rank
            try:
                task()
            finally:
                _rank.n = -1

        submit(run)

    contact._workers.submit = submitted  # type: ignore[method-assign]


def time_compiles() -> dict[int, list[float]]:
    """Rank -> the seconds of each build it ran (the outermost: a lowering's build that
    compiles kernels is one), from now on."""
    from kernelcache.cache import builds

    spent: dict[int, list[float]] = {}
    inner = builds._build

    def timed(*args: Any, **kw: Any) -> Any:
        if getattr(_rank, "building", False):
            return inner(*args, **kw)
        _rank.building = True
        started = time.monotonic()
        try:
            return inner(*args, **kw)
        finally:
            _rank.building = False
            spent.setdefault(getattr(_rank, "n", -1), []).append(time.monotonic() - started)

    builds._build = timed
    return spent


def run(cfg: dict[str, Any]) -> dict[str, Any]:
    from cluster_model import keep_warnings, lower_synthetic, lower_triton

    warnings = keep_warnings()

    import kernelcache

    requests = record_requests()
    attribute_workers()
    compiles = time_compiles()
    lower = lower_triton if cfg["model"] == "triton" else lower_synthetic
    caches = [kernelcache.Cache(cfg["root"], [], cfg["url"]) for _ in range(cfg["ranks"])]
    prepared = [lower(cache, cfg, prepare=True) for cache in caches]
    ranks: list[dict[str, Any]] = [{} for _ in caches]
    ready = threading.Barrier(len(caches) + 1)

    def rank(n: int) -> None:
        _rank.n = cfg["first_rank"] + n
        ready.wait()
        time.sleep(max(0.0, cfg["start_at"] - time.time()))
        started = time.time()
        try:
            digest = lower(caches[n], cfg, prepared=prepared[n])
        except BaseException as e:  # a rank's failure is reported, never hidden
            digest = f"failed: {type(e).__name__}: {e}"[:300]
        ranks[n] = {"rank": _rank.n, "started": started, "ended": time.time(), "digest": digest}

    threads = [threading.Thread(target=rank, args=(n,)) for n in range(len(caches))]
    for thread in threads:
        thread.start()
    os.write(1, b"ready\n")  # then the job's start, for every node at once
    cfg["start_at"] = float(sys.stdin.readline())
    cpu = time.process_time()
    ready.wait()
    for thread in threads:
        thread.join()
    cpu = time.process_time() - cpu
    for cache in caches:  # the copies a layered tier queued are the job's requests too
        flush = getattr(cache.remote, "flush", None)
        if callable(flush):
            flush(cfg["flush_s"])
    for n, cache in enumerate(caches):
        mine = compiles.get(ranks[n]["rank"], [])
        ranks[n]["compiles"], ranks[n]["compile_s"] = len(mine), sum(mine)
        ranks[n]["tier"] = _counters(cache.remote)
    counts = kernelcache.process_stats()
    return {
        "node": cfg["node"],
        "ranks": ranks,
        "builds": counts["builds"],
        "cpu_s": round(cpu, 3),
        "requests": [list(r) for r in requests if r[0] >= cfg["start_at"] - 0.05],
        "before_start": sum(r[0] < cfg["start_at"] - 0.05 for r in requests),
        "warnings": sorted(set(warnings))[:4],
    }


def _counters(remote: Any) -> dict[str, dict[str, int]]:
    """A rank's tier counters, by tier kind ("redis", "objstore")."""
    tiers = getattr(remote, "tiers", [remote])
    out: dict[str, dict[str, int]] = {}
    for tier in tiers:
        kind = "objstore" if "ObjectStore" in type(tier).__name__ else "redis"
        out[kind] = dict(getattr(tier, "counters", {}))
    return out


def main() -> None:
    sys.path.insert(0, str(HERE))
    cfg = json.loads(sys.argv[1])
    report = json.dumps(run(cfg))
    os.write(1, (report + "\n").encode())


if __name__ == "__main__":
    main()
