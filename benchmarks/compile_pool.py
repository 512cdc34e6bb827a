"""Would a pool of compiler processes inside one lowering pay for itself? Measured on this
machine in a process that has imported jax, triton and the bridge (a JAX program at its first
lowering), against one Triton compile of a matmul config for ``cuda:90``:

  compile            one compile in this process (the autotuned matmul's first config)
  fork pool          a 2-worker ``fork`` pool: start-up and a first round trip (unsafe in a JAX
                     process that has started XLA's threads; measured for scale)
  spawn pool         a 2-worker ``spawn`` pool: start-up and a first task that imports what a
                     compile needs (triton, the bridge, the kernel's module, which imports jax)
  forkserver pool    the same with ``forkserver``

A pool of ``w`` workers saves at most ``(1 - 1/w)`` of the compile time of the missing variants,
so it pays back only when that exceeds its start-up. Prints a table, then one JSON line;
``--out FILE`` also writes it.

    python benchmarks/compile_pool.py --repeats 3 --out compile_pool.json
"""

from __future__ import annotations

import argparse
import concurrent.futures
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from common import emit_summary

REPO = Path(__file__).resolve().parent.parent


def _noop() -> int:
    return os.getpid()


def _import_compiler() -> int:
    import triton  # noqa: F401

    import bridge.identity.specialize  # noqa: F401
    from examples import kernels  # noqa: F401

    return os.getpid()


def _one_compile(cache_root: str) -> float:
    """Lower-level than a lowering: bind, key and compile the matmul's first config."""
    import jax.numpy as jnp

    import kernelcache
    from bridge.call.kernel_objects import decompose, expand_variants
    from bridge.call.placeholders import ArgArray
    from bridge.compile import fetch
    from bridge.identity import specialize
    from bridge.vendors.targets import parse_target
    from examples import kernels

    cache = kernelcache.Cache(root=cache_root, readonly_roots=(), remote="")
    parts = decompose(kernels.matmul_kernel)
    named = {
        "a_ptr": ArgArray((512, 512), jnp.bfloat16, ("in", 0)),
        "b_ptr": ArgArray((512, 512), jnp.bfloat16, ("in", 1)),
        "M": 512,
        "N": 512,
        "K": 512,
        "c_ptr": ArgArray((512, 512), jnp.bfloat16, ("out", 0)),
    }
    target = parse_target("cuda:90")
    variant = expand_variants(parts, named, {}, {}, target)[0]
    spec = specialize.specialize(parts, named, variant, target, cache)
    started = time.perf_counter()
    fetch.fetch(spec, cache)
    return time.perf_counter() - started


def _pool(method: str, task: Callable[[], int]) -> float:
    """Seconds until both workers of a new 2-worker pool have run ``task`` once."""
    started = time.perf_counter()
    with concurrent.futures.ProcessPoolExecutor(
        max_workers=2, mp_context=multiprocessing.get_context(method)
    ) as pool:
        futures = [pool.submit(task) for _ in range(2)]
        for future in futures:
            future.result()
        elapsed = time.perf_counter() - started
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)  # workers find bytecode, as when installed
    import jax

    import bridge

    bridge.triton_call  # noqa: B018  (the lowering machinery, as at a first lowering)
    jax.numpy.zeros(1).block_until_ready()  # XLA's client and its threads are up
    rows: dict[str, list[float]] = {"compile": [], "fork pool": [], "spawn pool": []}
    rows["forkserver pool"] = []
    for _ in range(args.repeats):
        with tempfile.TemporaryDirectory() as root:
            rows["compile"].append(_one_compile(root))
        rows["fork pool"].append(_pool("fork", _noop))
        rows["spawn pool"].append(_pool("spawn", _import_compiler))
        rows["forkserver pool"].append(_pool("forkserver", _import_compiler))
    med = {k: statistics.median(v) for k, v in rows.items()}
    compile_s = med["compile"]
    summary = {
        "repeats": args.repeats,
        "cpus": len(os.sched_getaffinity(0)),
        "load_average": os.getloadavg(),
        "median_s": med,
        # missing variants a 2-worker pool needs to save its start-up: n * c / 2 > start-up
        "break_even_variants_2_workers": {
            k: round(2 * v / compile_s, 1) for k, v in med.items() if k != "compile"
        },
    }
    print(f"{'what':18} {'median s':>9} {'runs':>28} {'break-even variants (2 workers)':>32}")
    for k, v in med.items():
        be = summary["break_even_variants_2_workers"].get(k, "")
        print(f"{k:18} {v:9.3f} {' '.join(f'{x:.3f}' for x in rows[k]):>28} {be!s:>32}")
    print(f"load average: {os.getloadavg()[0]:.1f} on {summary['cpus']} CPUs")
    print()
    emit_summary(summary, args.out)


if __name__ == "__main__":
    main()
