"""The training-job scenario on CPU: many processes lowering the same kernels at once through
the bridge, sharing one cold cache root. Each kernel variant is compiled exactly once in total
(single flight covers the CUDA binary and its PTX companion), and every process embeds
byte-identical opaques. (benchmarks/job_start.py runs the same scenario on GPUs.)"""

from __future__ import annotations

import json
import threading
import time

from bridge_helpers import finish_child, start_child
from conftest import key_of
from test_reliability_support import record_figures, run_cli

import kernelcache

N_PROCESSES = 4

# Lower 8 kernel variants for cuda:90 once every peer has started (a file barrier), then
# report this process's Triton compiles and a digest of each custom call's opaque.
LOWER = """
import hashlib, json, os, sys, time
index, peers, barrier = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
import jax, jax.numpy as jnp
sys.path.insert(0, os.path.join(os.getcwd(), "tests"))
from bridge_helpers import custom_calls, lowered_module
from bridge import compile as bridge_compile
from examples import ops

open(os.path.join(barrier, f"ready-{index}"), "w").close()
deadline = time.time() + 120
while len(os.listdir(barrier)) < peers:
    if time.time() > deadline:
        raise SystemExit("barrier timed out")
    time.sleep(0.005)

def model(x, h, b, r1, r2):
    outs = [ops.add(v, v, block=blk, target="cuda:90") for v in (x, h, b) for blk in (256, 1024)]
    outs += [ops.softmax(r, target="cuda:90") for r in (r1, r2)]
    return outs

args = [jax.ShapeDtypeStruct((4096,), d) for d in (jnp.float32, jnp.float16, jnp.bfloat16)]
args += [jax.ShapeDtypeStruct((64, c), jnp.float32) for c in (100, 700)]
calls = custom_calls(lowered_module(model, *args))
print(json.dumps({
    "compiles": bridge_compile.compile_count(),
    "opaques": [hashlib.sha256(c["opaque"]).hexdigest() for c in calls],
}))
"""
VARIANTS = 8


def test_cold_processes_compile_each_variant_once_in_total(tmp_path):
    root = tmp_path / "kernels"
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    procs = [
        start_child(LOWER, str(i), str(N_PROCESSES), str(barrier), KERNELCACHE_DIR=str(root))
        for i in range(N_PROCESSES)
    ]
    results = [finish_child(p) for p in procs]
    compiles = [r["compiles"] for r in results]
    assert sum(compiles) == VARIANTS, compiles  # single flight: no variant compiled twice
    assert len({json.dumps(r["opaques"]) for r in results}) == 1  # byte-identical opaques
    assert len(results[0]["opaques"]) == VARIANTS
    code, out = run_cli("--root", str(root), "verify", "--json")
    assert code == 0 and json.loads(out)["clean"] is True
    record_figures(
        "cold job start (CPU lowering)",
        processes=N_PROCESSES,
        operations=N_PROCESSES * VARIANTS,
        faults=0,
        corrupt_served=0,
        jobs_failed=0,
        compiles=sum(compiles),
    )


def test_waiters_find_the_ptx_companion_the_builder_stored(tmp_path):
    """A process that waited for the builder of a CUDA kernel finds the binary *and* its PTX:
    the companion is stored before the binary, under the build lock (it used to be stored
    after the lock was released, and a waiter that came in between compiled again)."""
    from bridge.artifacts import fetch
    from bridge.compile import Compiled

    root = tmp_path / "kernels"
    builds: list[int] = []

    class SlowCompanion(kernelcache.Cache):
        def put(self, key, ext, data, meta):
            if ext == "ptx":
                time.sleep(0.3)  # widen the window between the binary and its companion
            return super().put(key, ext, data, meta)

    def build() -> Compiled:
        builds.append(1)
        time.sleep(0.1)
        return Compiled(b"\x7fELF binary", "// ptx text", {"name": "k"})

    key = key_of("ptx-companion")
    got = []

    def worker() -> None:
        cache = SlowCompanion(root, readonly_roots=())
        got.append(fetch(cache, key, "cubin", build, lambda c: {"name": "k"}, need_ptx=True))

    threads = [threading.Thread(target=worker) for _ in range(2)]
    threads[0].start()
    time.sleep(0.03)  # the second arrives while the first builds
    threads[1].start()
    for t in threads:
        t.join(timeout=60)
    assert len(builds) == 1, "the waiter compiled again"
    assert sorted(kb.built for kb in got) == [False, True]
    assert {kb.ptx for kb in got} == {"// ptx text"}
