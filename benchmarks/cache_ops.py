"""Latency of a verified hit and of a put, against Triton's and JAX's own caches, in one run.

For 4 KiB, 64 KiB and 1 MiB artifacts:

* kernelcache: ``Cache.get`` (shared lock, metadata parse, size + xxh3-128 check) and ``Cache.put``
  (staging, exclusive lock, two renames);
* Triton's ``FileCacheManager``: ``get_group`` of the kernel's group file, then reading the
  binary it names (what ``triton.compile`` does on a hit); ``put`` of the binary + ``put_group``;
* JAX's ``LRUCache`` (the persistent compilation cache's store): ``get``/``put``, once unbounded
  (``max_size=-1``: no lock, no eviction) and once bounded (global file lock + atime files).

Neither peer verifies content on read. The floor of a hit, measured on the same files: a bare
read of kernelcache's artifact file, once as Python code usually reads a file (``open(path,
"rb").read()``, as Triton's cache does) and once with the fewest calls Python has (``os.open``,
``os.read``, ``os.close``); the table prints each ``get`` against both.

Then the cost of a put under a size cap (``KERNELCACHE_MAX_SIZE``): into a root of 10,000
entries (of 4 KiB, and of 64 KiB) and of 100,000 entries of 4 KiB, puts of new entries with the
cap set to the root's size (so every put is over it, and eviction passes run every fifth of the
cap), against the same puts into a root filled alike without a cap, in alternating runs, each
run ending when the eviction pass it started ends; amortized: the total time of all the puts,
passes included where they did not run beside the puts, over their number. At a cap, each put
also pays for an eviction: one delete under the entry's lock (as ``prune``), and its share of
the pass's listing; passes run in a helper process beside the puts (see
:mod:`kernelcache.capacity.size_cap`), so the table also shows the CPU time per put, the helper's
included: the work a cap costs the machine, where the first figure is what it costs the job.

Then how far a burst takes a root past its cap: writer processes that each put their entries
as fast as they can into one capped root (by default 4 writers of 150 entries of 32,000 bytes,
19 MB over a 1 MiB cap), against the same writers pacing their puts (a sleep between two), in
alternating runs; a thread samples the root's entries (as an eviction pass lists them) every
millisecond: the peak over the cap, the slowest put (what waiting for passes cost a writer) and
the root over the cap once the writers are done. ``--before REF`` also runs the burst with
kernelcache of a git ref or directory.

Then what checking an artifact's structure (:mod:`kernelcache.formats`: a whole ELF file, whole
PTX text) would add to each verified read: ``Cache.get`` of 4 KiB and 64 KiB cubins (ELF of 16
sections) and PTX, alone and followed by the check, on a hit whose metadata the process
remembers and on the first read of an entry, in alternating rounds (``--no-whole`` skips it).

Prints a table and ends with one JSON line; ``--out`` also writes the JSON to a file.

    python benchmarks/cache_ops.py [--reads 3000] [--capped 10000:4K,100000:4K]
        [--burst 4:150:32000:1M] [--before REF] [--out results.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "helpers"))

from artifact_images import LAUNCH, elf_image
from common import REPO, export

import kernelcache
from kernelcache import units
from kernelcache.capacity.usage import entries_of

SIZES = {"4KiB": 4 << 10, "64KiB": 64 << 10, "1MiB": 1 << 20}
KEYS = 64


def _cubin(size: int, seed: int) -> bytes:
    """A whole cubin of ``size`` bytes (an ELF image for NVIDIA CUDA) holding random bytes: what
    kernelcache stores under ``.cubin`` (it refuses anything else)."""
    return elf_image(random.Random(seed).randbytes(size - len(elf_image(sections=0))), sections=0)


def _key(i: int, tag: str) -> str:
    import hashlib

    return hashlib.sha256(f"{tag}-{i}".encode()).hexdigest()


def _time_each(op: Callable[[int], object], n: int, rng: random.Random) -> list[float]:
    samples = []
    for _ in range(n):
        i = rng.randrange(KEYS)
        t0 = time.perf_counter_ns()
        op(i)
        samples.append((time.perf_counter_ns() - t0) / 1000)
    return samples


class Ours:
    name = "kernelcache"

    def __init__(self, root: str) -> None:
        self.cache = kernelcache.Cache(root, readonly_roots=(), remote="")

    def put(self, key: str, data: bytes) -> None:
        self.cache.put(key, "cubin", data, LAUNCH)

    def get(self, key: str) -> bytes:
        art = self.cache.get(key, "cubin")
        assert art is not None
        return art.data


class TritonFileCache:
    name = "triton FileCacheManager"

    def __init__(self, root: str) -> None:
        os.environ["TRITON_CACHE_DIR"] = root
        from triton.runtime.cache import FileCacheManager

        self.cls = FileCacheManager

    def put(self, key: str, data: bytes) -> None:
        mgr = self.cls(key)
        meta = json.dumps({"name": "kernel", "num_warps": 4, "shared": 0})
        paths = {
            "kernel.cubin": mgr.put(data, "kernel.cubin", binary=True),
            "kernel.json": mgr.put(meta, "kernel.json", binary=False),
        }
        mgr.put_group("kernel.json", paths)

    def get(self, key: str) -> bytes:
        group = self.cls(key).get_group("kernel.json")
        assert group is not None
        with open(group["kernel.cubin"], "rb") as f:
            return f.read()


class JaxLRU:
    def __init__(self, root: str, max_size: int) -> None:
        from jax._src.lru_cache import LRUCache

        self.name = "jax LRUCache " + ("unbounded" if max_size < 0 else "bounded")
        self.cache = LRUCache(root, max_size=max_size)

    def put(self, key: str, data: bytes) -> None:
        self.cache.put(key, data)

    def get(self, key: str) -> bytes:
        value = self.cache.get(key)
        assert value is not None
        return value


def _bare_reads(cache: Ours, key: str) -> dict[str, Callable[[], bytes]]:
    """The floor of a hit on ``key``: its artifact file read with no lock, metadata or check."""
    art = cache.cache.get(key, "cubin")
    assert art is not None and art.path is not None
    path, size = art.path, len(art.data)

    def python_open() -> bytes:
        with open(path, "rb") as f:
            return f.read()

    def os_read() -> bytes:
        fd = os.open(path, os.O_RDONLY)
        try:
            return os.read(fd, size + 1)
        finally:
            os.close(fd)

    return {"bare read: open().read()": python_open, "bare read: os.read": os_read}


def bench(reads: int, seed: int = 0) -> dict:
    results: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        for label, size in SIZES.items():
            payloads = [_cubin(size, i) for i in range(KEYS)]
            impls = [
                Ours(os.path.join(tmp, f"kc-{label}")),
                TritonFileCache(os.path.join(tmp, f"triton-{label}")),
                JaxLRU(os.path.join(tmp, f"jax-{label}"), -1),
                JaxLRU(os.path.join(tmp, f"jaxb-{label}"), 1 << 34),
            ]
            for impl in impls:
                tag = f"{label}-{impl.name}"
                puts = []
                for i in range(KEYS):
                    t0 = time.perf_counter_ns()
                    impl.put(_key(i, tag), payloads[i])
                    puts.append((time.perf_counter_ns() - t0) / 1000)
                for i in range(KEYS):  # warm the page cache, check the bytes once
                    assert impl.get(_key(i, tag)) == payloads[i]
                gets = _time_each(
                    lambda i, impl=impl, tag=tag: impl.get(_key(i, tag)), reads, random.Random(seed)
                )
                results.setdefault(label, {})[impl.name] = {
                    "get_median_us": statistics.median(gets),
                    "get_p90_us": statistics.quantiles(gets, n=10)[-1],
                    "put_median_us": statistics.median(puts),
                }
                if isinstance(impl, Ours):
                    keys = [_key(i, tag) for i in range(KEYS)]
                    bare = [_bare_reads(impl, k) for k in keys]
                    for name in bare[0]:
                        samples = _time_each(
                            lambda i, name=name, bare=bare: bare[i][name](),
                            reads,
                            random.Random(seed),
                        )
                        results[label][name] = {
                            "get_median_us": statistics.median(samples),
                            "get_p90_us": statistics.quantiles(samples, n=10)[-1],
                        }
    return results


def _fill(root: str, n: int, size: int, tag: str) -> None:
    """``n`` entries of ``size`` bytes under ``root``, last used in order (oldest first)."""
    from kernelcache.store import Store

    store = Store(root)
    data = _cubin(size, n)
    start = time.time() - n
    for i in range(n):
        key = _key(i, tag)
        store.put(key, "cubin", data, LAUNCH)
        os.utime(store.meta_path(key), (start + i, start + i))


def bench_capped(n: int, puts: int, size: int = 4 << 10, runs: int = 4) -> dict:
    """Amortized put under a size cap at ``n`` entries, against puts without one: two roots
    filled alike, the puts made in ``runs`` alternating runs per root (so that the machine's
    background load and the file system's writeback fall on both alike). Each run ends by
    waiting for the eviction pass it started, so every pass is counted whole: its wall time
    where it did not overlap the puts, and its CPU time (helper processes' included)."""
    from kernelcache.maintenance.scan import scan

    with tempfile.TemporaryDirectory() as tmp:
        roots = {label: os.path.join(tmp, label) for label in ("capped", "uncapped")}
        for root in roots.values():
            _fill(root, n, size, f"fill-{n}")
        cap = scan(roots["capped"]).nbytes
        data = _cubin(size, 1)
        caches = {
            label: kernelcache.Cache(
                root, readonly_roots=(), remote="", max_size=cap if label == "capped" else 0
            )
            for label, root in roots.items()
        }
        samples: dict[str, list[float]] = {label: [] for label in caches}
        walls = dict.fromkeys(caches, 0.0)
        cpus = dict.fromkeys(caches, 0.0)
        per_run = -(-puts // runs)
        for run in range(runs):
            order = list(caches.items()) if run % 2 == 0 else list(caches.items())[::-1]
            for label, cache in order:
                cpu = _cpu_seconds(cache)
                t_all = time.perf_counter()
                for i in range(run * per_run, min(puts, (run + 1) * per_run)):
                    t0 = time.perf_counter_ns()
                    cache.put(_key(i, f"{label}-{n}"), "cubin", data, LAUNCH)
                    samples[label].append((time.perf_counter_ns() - t0) / 1000)
                if cache.capacity is not None:
                    cache.capacity.wait()  # the pass this run started is the capped's
                walls[label] += time.perf_counter() - t_all
                cpus[label] += _cpu_seconds(cache) - cpu
        out: dict = {"entries": n, "entry_bytes": size, "puts": puts, "max_size": cap}
        for label, cache in caches.items():
            capacity = cache.capacity
            passes = capacity.passes if capacity is not None else 0
            out[label] = {
                "put_mean_us": round(walls[label] / puts * 1e6, 1),
                "cpu_per_put_us": round(cpus[label] / puts * 1e6, 1),
                "put_median_us": round(statistics.median(samples[label]), 1),
                "put_max_ms": round(max(samples[label]) / 1000, 1),
                "passes": passes,
                "pass_mean_ms": (
                    round(capacity.pass_seconds / passes * 1000, 1)
                    if capacity is not None and passes
                    else None
                ),
                "entries_after": len(scan(roots[label]).table),
            }
        out["ratio"] = round(out["capped"]["put_mean_us"] / out["uncapped"]["put_mean_us"], 2)
        out["cpu_ratio"] = round(
            out["capped"]["cpu_per_put_us"] / out["uncapped"]["cpu_per_put_us"], 2
        )
    return out


def _cpu_seconds(cache: kernelcache.Cache) -> float:
    """CPU seconds of this process and of the helper processes that ran its eviction passes."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    helpers = cache.capacity.helper_cpu_seconds if cache.capacity is not None else 0.0
    return me.ru_utime + me.ru_stime + helpers


#: one writer of a burst: puts its entries once told to go (a line on stdin), ``pace`` seconds
#: apart; prints its seconds and its slowest put's
BURST_WRITER = """
import hashlib, os, sys, time
import kernelcache
tag, count, size, pace = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
cache = kernelcache.Cache(readonly_roots=(), remote="")
blobs = [os.urandom(size) for _ in range(count)]
sys.stdin.readline()
slowest, started = 0.0, time.perf_counter()
for i, blob in enumerate(blobs):
    t0 = time.perf_counter()
    cache.put(hashlib.sha256(f"{tag}-{i}".encode()).hexdigest(), "bin", blob, {"name": tag})
    slowest = max(slowest, time.perf_counter() - t0)
    if pace:
        time.sleep(pace)
print(time.perf_counter() - started, slowest, flush=True)
"""


def _burst_run(
    tree: Path, root: str, writers: int, count: int, size: int, cap: int, pace: float
) -> dict:
    """One run of ``writers`` processes (kernelcache from ``tree``) putting into ``root``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KERNELCACHE_")}
    env.update(PYTHONPATH=str(tree), KERNELCACHE_DIR=root, KERNELCACHE_MAX_SIZE=f"{cap}B")
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", BURST_WRITER, f"{n}-{pace}", str(count), str(size), str(pace)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            cwd="/",
        )
        for n in range(writers)
    ]
    os.makedirs(root, exist_ok=True)
    peak, stop = 0, threading.Event()

    def sample() -> None:
        nonlocal peak
        while not stop.wait(0.001):
            peak = max(peak, sum(e.nbytes for e in entries_of(root)))

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        for proc in procs:  # all at once
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        reports = [proc.communicate(timeout=600)[0].split() for proc in procs]
    finally:
        stop.set()
        sampler.join()
    assert all(proc.returncode == 0 for proc in procs), "a writer failed"
    return {
        "peak_over_cap": round(peak / cap, 2),
        "seconds": round(max(float(r[0]) for r in reports), 3),
        "slowest_put_ms": round(max(float(r[1]) for r in reports) * 1000, 1),
        "after_over_cap": round(sum(e.nbytes for e in entries_of(root)) / cap, 2),
    }


def bench_burst(spec: str, pace: float, runs: int, before: Path | None) -> dict:
    """Peak of a root over its cap under a burst of writers, against paced writers (and the
    burst with an older kernelcache, ``before``), in ``runs`` alternating runs each."""
    writers, count, size, cap = spec.split(":")
    shape = (int(writers), int(count), units.parse_size(size), units.parse_size(cap))
    modes = {"burst": (REPO, 0.0), "paced": (REPO, pace)}
    if before is not None:
        modes["burst, before"] = (before, 0.0)
    rows: dict[str, list[dict]] = {mode: [] for mode in modes}
    with tempfile.TemporaryDirectory() as tmp:
        for run in range(runs):
            for mode, (tree, wait) in modes.items() if run % 2 == 0 else reversed(modes.items()):
                root = os.path.join(tmp, f"{mode}-{run}".replace(", ", "-"))
                rows[mode].append(_burst_run(tree, root, *shape, wait))
    out: dict = dict(
        zip(("writers", "entries_each", "entry_bytes", "max_size"), shape, strict=True)
    )
    out["pace_s"] = pace
    for mode, each in rows.items():
        out[mode] = {
            "peak_over_cap_max": max(r["peak_over_cap"] for r in each),
            "peak_over_cap_median": statistics.median(r["peak_over_cap"] for r in each),
            "slowest_put_ms": max(r["slowest_put_ms"] for r in each),
            "seconds_median": statistics.median(r["seconds"] for r in each),
            "after_over_cap_max": max(r["after_over_cap"] for r in each),
            "runs": each,
        }
    return out


def _print_burst(burst: dict) -> None:
    print()
    print(
        f"{burst['writers']} writers x {burst['entries_each']} entries of"
        f" {burst['entry_bytes']:,} bytes over a cap of {burst['max_size']:,} bytes"
        f" (paced: {burst['pace_s'] * 1000:.0f} ms between puts)"
    )
    head = (
        f"{'writers':<14} {'peak/cap max':>12} {'median':>7} {'after/cap':>9}"
        f" {'slowest put':>11} {'seconds':>8}"
    )
    print(head)
    print("-" * len(head))
    for mode in ("burst", "paced", "burst, before"):
        r = burst.get(mode)
        if r is not None:
            print(
                f"{mode:<14} {r['peak_over_cap_max']:>11.2f}x {r['peak_over_cap_median']:>6.2f}x"
                f" {r['after_over_cap_max']:>8.2f}x {r['slowest_put_ms']:>9.1f}ms"
                f" {r['seconds_median']:>8.3f}"
            )


def _ptx_text(size: int) -> bytes:
    """Whole PTX text of ``size`` bytes: one kernel of many instructions, as LLVM writes them
    (each with the comment of its source line)."""
    head = b".version 8.7\n.target sm_90a\n.address_size 64\n\n.visible .entry k(\n)\n{\n"
    line = b"\tadd.s32 \t%r2, %r1, 1;                // kernels.py:18:4\n"
    tail = b"\tret;\n}\n"
    text = head + line * ((size - len(head) - len(tail) - 3) // len(line)) + tail
    return text + b"//" + b"-" * (size - len(text) - 3) + b"\n"


def bench_whole(reads: int, seed: int = 0) -> dict:
    """What the structural check of an artifact's format (:mod:`kernelcache.formats`) would
    add to a verified ``Cache.get``, against the get alone, for cubins (ELF with 16 sections)
    and PTX of 4 KiB and 64 KiB: on a hit whose metadata this process remembers, and on the
    first read of an entry (metadata read from disk), in alternating rounds."""
    from artifact_images import elf_image

    from kernelcache.formats import artifact_problem

    rounds = 10
    out: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        for label in ("4KiB", "64KiB"):
            size = SIZES[label]
            pad = size - len(elf_image(sections=16))
            datas = {
                "cubin": [
                    elf_image(random.Random(i).randbytes(pad), sections=16) for i in range(KEYS)
                ],
                "ptx": [_ptx_text(size)] * KEYS,
            }
            for ext, payloads in datas.items():
                cache = kernelcache.Cache(
                    os.path.join(tmp, f"whole-{label}-{ext}"), readonly_roots=(), remote=""
                )
                keys = [_key(i, f"whole-{label}-{ext}") for i in range(KEYS)]
                for key, data in zip(keys, payloads, strict=True):
                    assert len(data) == size and artifact_problem(ext, data) is None
                    cache.put(key, ext, data, {**LAUNCH, "name": "k"})  # PTX of kernel k

                def read(i: int, first: bool, check: bool, cache=cache, keys=keys, ext=ext) -> None:
                    if first:
                        cache.store.memo.clear()  # the metadata is read from disk again
                    art = cache.get(keys[i], ext)
                    assert art is not None
                    if check:
                        artifact_problem(ext, art.data)

                rng = random.Random(seed)
                samples: dict[tuple[bool, bool], list[float]] = {}
                order = [(first, check) for first in (False, True) for check in (False, True)]
                for run in range(rounds):
                    for first, check in order if run % 2 == 0 else order[::-1]:
                        samples.setdefault((first, check), []).extend(
                            _time_each(
                                lambda i, f=first, c=check: read(i, f, c), reads // rounds, rng
                            )
                        )
                row = {}
                for first, name in ((False, "remembered"), (True, "first_read")):
                    bare = statistics.median(samples[(first, False)])
                    checked = statistics.median(samples[(first, True)])
                    row[name] = {
                        "get_median_us": round(bare, 2),
                        "checked_median_us": round(checked, 2),
                        "ratio": round(checked / bare, 3),
                    }
                out.setdefault(label, {})[ext] = row
    return out


def _print_whole(whole: dict) -> None:
    print()
    head = f"{'size':>6}  {'ext':<6} {'read':<11} {'get':>9} {'get+check':>10} {'ratio':>7}"
    print(head)
    print("-" * len(head))
    for label, by_ext in whole.items():
        for ext, row in by_ext.items():
            for name, r in row.items():
                print(
                    f"{label:>6}  {ext:<6} {name:<11} {r['get_median_us']:>7.1f}us"
                    f" {r['checked_median_us']:>8.1f}us {r['ratio']:>6.2f}x"
                )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--reads", type=int, default=3000, help="timed reads per size and cache")
    parser.add_argument(
        "--capped",
        default="10000:4K,10000:64K,100000:4K",
        help="ENTRIES:SIZE,... at which to time puts under a size cap ('' to skip)",
    )
    parser.add_argument(
        "--burst",
        default="4:150:32000:1M",
        help="WRITERS:ENTRIES:SIZE:CAP of the burst over a cap ('' to skip)",
    )
    parser.add_argument("--burst-pace", type=float, default=0.01, help="paced writers' sleep")
    parser.add_argument("--burst-runs", type=int, default=3, help="runs of each kind of writers")
    parser.add_argument("--before", help="also burst with kernelcache of this git ref or directory")
    parser.add_argument(
        "--whole",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="time the structural check of an artifact's format on reads",
    )
    parser.add_argument("--out", type=Path, help="also write the JSON summary here")
    args = parser.parse_args()
    burst = None
    if args.burst:
        with tempfile.TemporaryDirectory() as tmp:
            before = export(args.before, Path(tmp)) if args.before else None
            burst = bench_burst(args.burst, args.burst_pace, args.burst_runs, before)
    results = bench(args.reads)
    whole = bench_whole(args.reads) if args.whole else None
    capped = []
    for spec in filter(None, (s.strip() for s in args.capped.split(","))):
        n, _, size = spec.partition(":")
        entries = int(n)
        capped.append(
            bench_capped(entries, max(2000, entries * 6 // 10), units.parse_size(size or "4K"))
        )

    header = f"{'size':>6}  {'cache':<28} {'get median':>11} {'get p90':>9} {'put median':>11}"
    print(header)
    print("-" * len(header))
    for label, by_impl in results.items():
        for name, r in by_impl.items():
            put = f"{r['put_median_us']:>9.1f}us" if "put_median_us" in r else f"{'-':>11}"
            print(
                f"{label:>6}  {name:<28} {r['get_median_us']:>9.1f}us {r['get_p90_us']:>7.1f}us"
                f" {put}"
            )
    ratios = {}
    for label, by_impl in results.items():
        ours = by_impl["kernelcache"]
        for name, r in by_impl.items():
            if name.startswith("bare read"):
                ratios[f"{label} get: kernelcache / {name}"] = round(
                    ours["get_median_us"] / r["get_median_us"], 2
                )
            elif name != "kernelcache":
                ratios[f"{label} get: {name} / kernelcache"] = round(
                    r["get_median_us"] / ours["get_median_us"], 2
                )
                ratios[f"{label} put: {name} / kernelcache"] = round(
                    r["put_median_us"] / ours["put_median_us"], 2
                )
    print()
    for name, ratio in ratios.items():
        print(f"{name:<58} {ratio:>6.2f}x")
    if capped:
        print()
        head = (
            f"{'entries':>8} {'size':>6}  {'puts':>6}  {'put':<9} {'mean':>9} {'cpu':>9}"
            f" {'median':>9} {'max':>9} {'passes':>6} {'pass':>9}"
        )
        print(head)
        print("-" * len(head))
        for row in capped:
            for label in ("capped", "uncapped"):
                r = row[label]
                each = f"{r['pass_mean_ms']:>7.1f}ms" if r["pass_mean_ms"] else f"{'-':>9}"
                print(
                    f"{row['entries']:>8,} {row['entry_bytes'] >> 10:>4}Ki  {row['puts']:>6,}  "
                    f"{label:<9} {r['put_mean_us']:>7.1f}us {r['cpu_per_put_us']:>7.1f}us"
                    f" {r['put_median_us']:>7.1f}us"
                    f" {r['put_max_ms']:>7.1f}ms {r['passes']:>6} {each}"
                )
            print(
                f"{'':>17}  capped / uncapped, amortized: {row['ratio']:.2f}x"
                f" (cpu, the helper's included: {row['cpu_ratio']:.2f}x)"
            )
    if burst is not None:
        _print_burst(burst)
    if whole is not None:
        _print_whole(whole)
    summary = {
        "benchmark": "cache_ops",
        "machine": f"{platform.machine()} {os.cpu_count()} cpus, python {platform.python_version()}",
        "medians_us": {
            label: {name: {k: round(v, 2) for k, v in r.items()} for name, r in by_impl.items()}
            for label, by_impl in results.items()
        },
        "ratios": ratios,
        "capped_puts": capped,
        "burst": burst,
        "whole_check": whole,
        "target_capped_put_ratio": 1.5,
        "target_64KiB_get_median_us": 50,
        "target_met": results["64KiB"]["kernelcache"]["get_median_us"] < 50
        and all(r > 1 for k, r in ratios.items() if k.startswith("64KiB get") and "bare" not in k),
        # a verified hit against a bare read as Python code reads a file: 64 KiB <= 2x, 4 KiB
        # <= 2.5x
        "floor_target_met": ratios["64KiB get: kernelcache / bare read: open().read()"] <= 2.0
        and ratios["4KiB get: kernelcache / bare read: open().read()"] <= 2.5,
    }
    if args.out:
        args.out.write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
