"""A job of many machines under faults, simulated on this one: N nodes x P processes, each node
its own cache root, all sharing a 3-primary Redis Cluster, an S3 server (moto, in a process of
its own), or both in layers (the cluster in front). Every process lowers the same model, and
the script reports, per scenario and tier: compiles (against the ideal: each variant once for
the job), the job's makespan, and the longest time a process waited (its time in the cache
that was not its own compiles), for a first job (fresh roots, an empty tier) and the next one
(fresh roots, the tier as the first left it, the fault still there).

Scenarios (the fault is made before the first job and stays for the next):

  healthy          nothing wrong (the next job: a warm tier)
  killed-primary   one of the 3 primaries killed (kill -9)
  killed-mid-job   the primary that holds the first kernel's PTX killed while it compiles
                   (half a compile after the job's start): its builder loses the primary
                   between taking the kernel's lock (on another primary) and its puts
  stopped-primary  one of the 3 primaries stopped (SIGSTOP: connections hang)
  stopped-s3       the S3 server stopped (SIGSTOP)
  full-disk        node 0's root on a full filesystem: a filled 64 KiB tmpfs in a private mount
                   namespace where the system allows one, else its files limited to 1 KiB

Models:

  synthetic (default)  the bridge's use of the cache, without Triton: 8 kernels of 13 variants
                       (1, 1, 1, 1, 2, 2, 2 and 3 per kernel), one ``get_or_create_each``
                       call per kernel with its variants (those of one lowering), a compile a
                       sleep of --compile-s whose PTX is stored first, under the build locks,
                       as the bridge does
  triton               the bridge lowering 8 calls of 7 Triton kernels (13 variants: four
                       calls are autotuned over 2 or 3 configs) for cuda:90, compiled by
                       Triton here (no GPU); each process imports jax and Triton: give it
                       cores

``--peer LABEL=PATH`` runs every job again with PATH first on the workers' PYTHONPATH (an older
checkout: ``git worktree add /tmp/before REV``), in the same run. A peer whose orphaned locks
last ``lock_ttl`` makes jobs of two minutes.

Usage::

    python benchmarks/cluster_job.py [--nodes 4,8] [--per-node 2] [--model synthetic]
        [--compile-s 0.5] [--tiers cluster,layered,s3] [--scenarios healthy,...]
        [--peer before=/tmp/before] [--out F]

Prints a table, then one JSON line; ``--out`` also writes the JSON.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
#: variants per kernel of the model: 8 kernels, 13 variants
MODEL = (1, 1, 1, 1, 2, 2, 2, 3)
IDEAL = sum(MODEL)
SCENARIOS = (
    "healthy",
    "killed-primary",
    "killed-mid-job",
    "stopped-primary",
    "stopped-s3",
    "full-disk",
)
TIERS = ("cluster", "layered", "s3")
#: the tiers a scenario's fault concerns
APPLIES = {
    "healthy": TIERS,
    "killed-primary": ("cluster", "layered"),
    "killed-mid-job": ("cluster", "layered"),
    "stopped-primary": ("cluster", "layered"),
    "stopped-s3": ("s3", "layered"),
    "full-disk": ("cluster", "layered", "s3"),
}


# -- the worker: one process of the job ---------------------------------------------------------
def worker(cfg: dict[str, Any]) -> None:
    """Lower the model once through the cache (from ``$PYTHONPATH``: this checkout or a
    peer's); print one JSON line: wall-clock start and end, compiles, compile seconds, the
    seconds spent in the cache other than compiling, and the warnings logged."""
    import logging
    import resource

    if cfg["small_files"]:  # a full disk where no file system can be mounted
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1024, 1024))
    warnings: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            warnings.append(record.getMessage()[:300])

    logging.getLogger("kernelcache").addHandler(Keep(logging.WARNING))
    import kernelcache

    cache = kernelcache.Cache(cfg["root"], readonly_roots=[], remote=cfg["url"])
    lower = lower_triton if cfg["model"] == "triton" else lower_synthetic
    prepared = lower(cache, cfg, prepare=True)
    time.sleep(max(0.0, cfg["start_at"] - time.time()))
    started = time.time()
    lower(cache, cfg, prepared=prepared)
    ended = time.time()
    counts = kernelcache.process_stats()
    wall = ended - started
    print(
        json.dumps(
            {
                "node": cfg["node"],
                "started": started,
                "ended": ended,
                "compiles": counts["builds"],
                "compile_s": counts["build_seconds"],
                "wait_s": max(0.0, wall - counts["build_seconds"]),
                "warnings": sorted(set(warnings))[:3],
            }
        ),
        flush=True,
    )


def variant_key(kernel: int, variant: int) -> str:
    return hashlib.sha256(f"cluster-job:{kernel}:{variant}".encode()).hexdigest()


def ptx_key(key: str) -> str:
    """The key of a variant's PTX (a companion entry, stored first), as the bridge on the
    worker's path derives it (a peer's own way)."""
    from bridge.entries.kinds import derived_key

    return derived_key(key, "ptx")


def lower_synthetic(cache: Any, cfg: dict[str, Any], *, prepare: bool = False, **_: Any) -> Any:
    """The model's kernels in order, each one ``get_or_create_each`` call over its variants;
    a compile sleeps, stores its PTX (a companion entry), then returns the binary."""
    if prepare:
        return None
    import kernelcache

    def build(key: str) -> Any:
        def compile_variant() -> tuple[bytes, dict[str, Any]]:
            time.sleep(cfg["compile_s"])
            try:
                cache.put(  # (opaque text: a .ptx must define the kernel it names)
                    ptx_key(key), "txt", key.encode() * 2048, {"name": "ptx", "target": "cuda:90"}
                )
            except kernelcache.CacheError:
                pass  # as the bridge: a PTX that cannot be stored is not fatal
            return key.encode() * 1024, {"name": "kernel", "target": "cuda:90"}

        return compile_variant

    for kernel, variants in enumerate(MODEL):
        keys = [variant_key(kernel, v) for v in range(variants)]
        items = [kernelcache.BuildItem(k, "bin", build(k)) for k in keys]
        for index, art in cache.get_or_create_each(items):
            if isinstance(art, Exception) or art.data != keys[index].encode() * 1024:
                raise SystemExit(f"wrong artifact for {keys[index]}: {art!r}")
    return None


def lower_triton(
    cache: Any, cfg: dict[str, Any], *, prepare: bool = False, prepared: Any = None
) -> Any:
    """Lower a jitted step of 8 Triton kernel calls for cuda:90 (prepare: import, define and
    trace it, without lowering, so that the job's clock starts at the lowering)."""
    if not prepare:
        prepared.lower(lowering_platforms=("cuda",))
        return None
    import jax
    import jax.numpy as jnp
    import triton
    import triton.language as tl

    import bridge

    @triton.jit
    def axpy(x_ptr, y_ptr, n, o_ptr, ALPHA: tl.constexpr, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = i < n
        x, y = tl.load(x_ptr + i, mask=m), tl.load(y_ptr + i, mask=m)
        tl.store(o_ptr + i, x * ALPHA + y, mask=m)

    @triton.jit
    def relu(x_ptr, n, o_ptr, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = i < n
        tl.store(o_ptr + i, tl.maximum(tl.load(x_ptr + i, mask=m), 0.0), mask=m)

    @triton.jit
    def gap(x_ptr, y_ptr, n, o_ptr, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = i < n
        tl.store(o_ptr + i, tl.abs(tl.load(x_ptr + i, mask=m) - tl.load(y_ptr + i, mask=m)), m)

    @triton.jit
    def clip(x_ptr, n, o_ptr, LOW: tl.constexpr, HIGH: tl.constexpr, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = i < n
        tl.store(o_ptr + i, tl.clamp(tl.load(x_ptr + i, mask=m), LOW, HIGH), mask=m)

    two = [triton.Config({}, num_warps=w) for w in (2, 4)]

    @triton.autotune(configs=two, key=["cols"])
    @triton.jit
    def row_reduce(x_ptr, cols, o_ptr, BLOCK: tl.constexpr, MAX: tl.constexpr):
        row = tl.program_id(0)
        j = tl.arange(0, BLOCK)
        if MAX:
            x = tl.load(x_ptr + row * cols + j, mask=j < cols, other=float("-inf"))
            tl.store(o_ptr + row, tl.max(x, axis=0))
        else:
            x = tl.load(x_ptr + row * cols + j, mask=j < cols, other=0.0)
            tl.store(o_ptr + row, tl.sum(x, axis=0))

    @triton.autotune(configs=two, key=["cols"])
    @triton.jit
    def row_scale(x_ptr, cols, o_ptr, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        j = tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * cols + j, mask=j < cols, other=0.0)
        tl.store(o_ptr + row * cols + j, x / (tl.sum(tl.abs(x), axis=0) + 1.0), mask=j < cols)

    blocks = [triton.Config({"BM": bm, "BN": 32}, num_warps=4) for bm in (16, 32, 64)]

    @triton.autotune(configs=blocks, key=["size"])
    @triton.jit
    def matmul(a_ptr, b_ptr, size, c_ptr, BM: tl.constexpr, BN: tl.constexpr):
        rm = tl.program_id(0) * BM + tl.arange(0, BM)
        rn = tl.program_id(1) * BN + tl.arange(0, BN)
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for k in range(0, size, 16):
            rk = k + tl.arange(0, 16)
            a = tl.load(a_ptr + rm[:, None] * size + rk[None, :])
            b = tl.load(b_ptr + rk[:, None] * size + rn[None, :])
            acc += tl.dot(a, b)
        tl.store(c_ptr + rm[:, None] * size + rn[None, :], acc)

    n, rows, cols, size = 4096, 64, 128, 128
    flat = jax.ShapeDtypeStruct((n,), jnp.float32)
    column = jax.ShapeDtypeStruct((rows,), jnp.float32)
    table = jax.ShapeDtypeStruct((rows, cols), jnp.float32)
    square = jax.ShapeDtypeStruct((size, size), jnp.float16)
    out_square = jax.ShapeDtypeStruct((size, size), jnp.float32)

    def call(*args: Any, **kw: Any) -> Any:
        return bridge.triton_call(*args, target="cuda:90", cache=cache, **kw)

    def step(x: Any, y: Any, t: Any, a: Any) -> Any:
        grid = (n // 256,)
        out = call(x, y, n, kernel=axpy, out_shape=flat, grid=grid, ALPHA=2.0, BLOCK=256)
        out = call(out, n, kernel=relu, out_shape=flat, grid=grid, BLOCK=256)
        out = call(out, y, n, kernel=gap, out_shape=flat, grid=grid, BLOCK=256)
        out = call(out, n, kernel=clip, out_shape=flat, grid=grid, LOW=0.0, HIGH=4.0, BLOCK=256)
        rowwise = {"kernel": row_reduce, "out_shape": column, "grid": (rows,), "BLOCK": cols}
        sums = call(t, cols, MAX=False, **rowwise)
        maxes = call(t, cols, MAX=True, **rowwise)
        scaled = call(t, cols, kernel=row_scale, out_shape=table, grid=(rows,), BLOCK=cols)
        grid2 = lambda meta: (size // meta["BM"], size // meta["BN"])  # noqa: E731
        prod = call(a, a, size, kernel=matmul, out_shape=out_square, grid=grid2)
        return out, sums, maxes, scaled, prod

    specs = (flat, flat, table, square)
    return jax.jit(step).trace(*specs)


# -- the job ----------------------------------------------------------------------------------
def job(
    url: str,
    directory: Path,
    args: argparse.Namespace,
    nodes: int,
    pythonpath: str,
    full_node: str | None,
    during: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """Run one job (``nodes`` x ``--per-node`` processes started together); its compiles,
    makespan, longest wait and warnings. ``full_node``: "tmpfs" or "small-files" for node 0's
    root on a full disk, or None; ``during``: called half a compile after the start."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KERNELCACHE_")}
    env["PYTHONPATH"] = pythonpath
    procs = nodes * args.per_node
    start_at = time.time() + (8.0 if args.model == "triton" else 1.0) + 0.15 * procs
    launched = []
    for node in range(nodes):
        root = directory / f"node{node}"
        root.mkdir(parents=True)
        cfgs = [
            {
                "url": url,
                "root": str(root),
                "node": node,
                "model": args.model,
                "compile_s": args.compile_s,
                "start_at": start_at,
                "small_files": node == 0 and full_node == "small-files",
            }
            for _ in range(args.per_node)
        ]
        argvs = [[sys.executable, str(Path(__file__)), "--worker", json.dumps(c)] for c in cfgs]
        if node == 0 and full_node == "tmpfs":  # every process of the node in one namespace
            runs = " & ".join(subprocess.list2cmdline(a) for a in argvs)
            fill = f"head -c 1048576 /dev/zero > {root}/filler 2>/dev/null"
            script = f"mount -t tmpfs -o size=64k tmpfs {root} && {{ {fill}; {runs} & wait; }}"
            argvs = [["unshare", "-rm", "sh", "-c", script]]
        for argv in argvs:
            launched.append(
                subprocess.Popen(
                    argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
                )
            )
    fault = None
    if during is not None:
        fault = threading.Timer(start_at + args.compile_s / 2 - time.time(), during)
        fault.start()
    results = []
    for p in launched:
        out, err = p.communicate(timeout=args.job_timeout)
        lines = [line for line in out.splitlines() if line.startswith("{")]
        if p.returncode != 0 or not lines:
            raise SystemExit(f"a worker failed ({p.returncode}):\n{err[-3000:]}")
        results += [json.loads(line) for line in lines]
    if fault is not None:
        fault.join()
    if len(results) != procs:
        raise SystemExit(f"{len(results)} of {procs} workers reported")
    return {
        "compiles": int(sum(r["compiles"] for r in results)),
        "makespan_s": max(r["ended"] for r in results) - min(r["started"] for r in results),
        "max_wait_s": max(r["wait_s"] for r in results),
        "warned": sum(bool(r["warnings"]) for r in results),
        "warnings": sorted({w for r in results for w in r["warnings"]})[:6],
    }


def can_mount_tmpfs() -> bool:
    try:
        probe = subprocess.run(
            ["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt"],
            capture_output=True,
            timeout=20,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return probe.returncode == 0


class Servers:
    """moto's S3 server for the whole run, and a fresh 3-primary Redis Cluster per scenario."""

    def __init__(self, stack: ExitStack, tmp: Path) -> None:
        from remote import start_moto

        self.tmp = tmp
        self.bucket, self.moto = start_moto(stack)
        self.cluster: Any = None

    def urls(self, tier: str, prefix: str) -> str:
        """The URL of ``tier`` for one scenario (its own namespace and bucket prefix)."""
        s3 = self.bucket.replace("/run?", f"/{prefix}?")
        cluster = f"{self.cluster.url}?namespace={prefix}" if self.cluster else ""
        return {"cluster": cluster, "s3": s3, "layered": f"{cluster} {s3}"}[tier]

    def fresh_cluster(self, name: str) -> None:
        from redis_server import RedisClusterServers

        self.close_cluster()
        self.cluster = RedisClusterServers(self.tmp / f"cluster-{name}").start()

    def close_cluster(self) -> None:
        if self.cluster is not None:
            self.cluster.stop()
            self.cluster = None

    def kill_ptx_primary(self) -> None:
        """Kill the primary that serves the slot of the first kernel's PTX."""
        ptx = ptx_key(variant_key(0, 0))
        name = self.cluster.client().get_node_from_key(f"kc:{{{ptx}}}").name
        next(n for n in self.cluster.nodes if name.endswith(f":{n.port}")).kill()

    def fault(self, scenario: str, on: bool) -> None:
        """Make (``on``) or undo the fault of ``scenario`` (one made during the first job is
        made before the next)."""
        if scenario == "killed-primary" and on:
            self.cluster.nodes[1].kill()
        elif scenario == "stopped-primary":
            node = self.cluster.nodes[1]
            node.pause() if on else node.resume()
        elif scenario == "stopped-s3":
            self.moto.send_signal(signal.SIGSTOP if on else signal.SIGCONT)


def run(args: argparse.Namespace) -> dict[str, Any]:
    impls = [("this", str(REPO))] + [tuple(p.split("=", 1)) for p in args.peer]
    full_node = "tmpfs" if can_mount_tmpfs() else "small-files"
    rows = []
    with tempfile.TemporaryDirectory(prefix="kc-cluster-job-") as tmp_name, ExitStack() as stack:
        tmp = Path(tmp_name)
        servers = Servers(stack, tmp)
        stack.callback(servers.close_cluster)
        counter = 0
        for nodes in args.nodes:
            for scenario in args.scenarios:
                for tier in [t for t in args.tiers if t in APPLIES[scenario]]:
                    for label, path in impls:
                        counter += 1
                        name = f"j{counter}"
                        if tier == "s3":
                            servers.close_cluster()
                        else:
                            servers.fresh_cluster(name)
                        mid_job = scenario == "killed-mid-job"
                        if not mid_job:
                            servers.fault(scenario, True)
                        url = servers.urls(tier, name)
                        full = full_node if scenario == "full-disk" else None
                        during = servers.kill_ptx_primary if mid_job else None
                        try:
                            first = job(url, tmp / name / "1", args, nodes, path, full, during)
                            second = job(url, tmp / name / "2", args, nodes, path, full)
                        finally:
                            servers.fault(scenario, False)
                            shutil.rmtree(tmp / name, ignore_errors=True)
                        row = {
                            "impl": label,
                            "nodes": nodes,
                            "per_node": args.per_node,
                            "scenario": scenario,
                            "tier": tier,
                            "first": first,
                            "next": second,
                        }
                        rows.append(row)
                        print_row(row, flush=True)
    return {
        "benchmark": "cluster_job",
        "cpus": os.cpu_count(),
        "model": args.model,
        "compile_s": args.compile_s if args.model == "synthetic" else None,
        "ideal_compiles": IDEAL,
        "full_disk": full_node,
        "rows": rows,
    }


HEADER = (
    f"{'impl':<8} {'job':>5} {'scenario':<16} {'tier':<8} {'compiles':>8} {'x ideal':>7} "
    f"{'makespan s':>10} {'max wait s':>10} {'next job':>8}"
)


def print_row(row: dict[str, Any], flush: bool = False) -> None:
    first = row["first"]
    size = f"{row['nodes']}x{row['per_node']}"
    print(
        f"{row['impl']:<8} {size:>5} {row['scenario']:<16} {row['tier']:<8} "
        f"{first['compiles']:>8} {first['compiles'] / IDEAL:>6.2f}x "
        f"{first['makespan_s']:>10.1f} {first['max_wait_s']:>10.1f} "
        f"{row['next']['compiles']:>8}",
        flush=flush,
    )


def main(argv: list[str] | None = None) -> int:
    if argv is None and len(sys.argv) == 3 and sys.argv[1] == "--worker":
        worker(json.loads(sys.argv[2]))
        return 0
    sys.path.insert(0, str(REPO))
    sys.path.insert(0, str(REPO / "tests"))
    from common import emit_summary

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", default="4", help="node counts, e.g. 4,8 (default 4)")
    parser.add_argument("--per-node", type=int, default=2, help="processes per node (2)")
    parser.add_argument("--model", choices=("synthetic", "triton"), default="synthetic")
    parser.add_argument("--compile-s", type=float, default=0.5, help="a synthetic compile (0.5)")
    parser.add_argument("--tiers", default=",".join(TIERS), help=",".join(TIERS))
    parser.add_argument("--scenarios", default=",".join(SCENARIOS), help=",".join(SCENARIOS))
    parser.add_argument("--peer", action="append", default=[], help="LABEL=PATH (repeatable)")
    parser.add_argument("--job-timeout", type=float, default=600.0, help="seconds per job")
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    args = parser.parse_args(argv)
    args.nodes = [int(n) for n in args.nodes.split(",")]
    args.tiers = args.tiers.split(",")
    args.scenarios = args.scenarios.split(",")
    for wanted, known in ((args.tiers, TIERS), (args.scenarios, SCENARIOS)):
        unknown = set(wanted) - set(known)
        if unknown:
            raise SystemExit(f"unknown: {', '.join(sorted(unknown))}; known: {', '.join(known)}")
    for peer in args.peer:
        label, sep, path = peer.partition("=")
        if not sep or not label or not Path(path).is_dir():
            raise SystemExit(f"--peer {peer!r}: expected LABEL=PATH to a checkout")
    print(f"ideal: {IDEAL} compiles per job; 'next job': compiles of the job after it")
    print(HEADER, flush=True)
    summary = run(args)
    emit_summary(summary, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
