"""The training-job scenario on CPU: many processes lowering the same kernels at once through
the bridge, sharing one cold cache root. Each kernel variant is compiled exactly once in total
(single flight covers the CUDA binary and its PTX companion), and every process embeds
byte-identical opaques. (benchmarks/job_start.py runs the same scenario on GPUs.)"""

from __future__ import annotations

import hashlib
import json
import threading
import time

from artifact_images import elf_image, launch, ptx_text
from bridge_helpers import finish_children, start_child
from reliability_support import record_figures, run_cli
from support import key_of

import kernelcache

N_PROCESSES = 4

# Lower 8 kernel variants for cuda:90 once every peer has started (a file barrier), then
# report this process's Triton compiles and a digest of each custom call's opaque.
LOWER = """
import hashlib, json, os, sys, time
index, peers, barrier = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
import jax, jax.numpy as jnp
sys.path.insert(0, os.path.join(os.getcwd(), "tests", "helpers"))
from bridge_helpers import custom_calls, lowered_module
from bridge.compile import compiler as bridge_compile
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
    results = finish_children(procs)
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
    from bridge.compile.compiler import Compiled
    from bridge.compile.fetch import Request, fetch_request

    root = tmp_path / "kernels"
    builds: list[int] = []

    class SlowCompanion(kernelcache.Cache):
        def put(self, key, ext, data, meta, **options):
            if ext == "ptx":
                time.sleep(0.3)  # widen the window between the binary and its companion
            return super().put(key, ext, data, meta, **options)

    def build() -> Compiled:
        builds.append(1)
        time.sleep(0.1)
        return Compiled(elf_image(b"binary"), ptx_text("k").decode(), {"name": "k"})

    key = key_of("ptx-companion")
    got = []

    def worker() -> None:
        cache = SlowCompanion(root, readonly_roots=())
        request = Request(key, "cubin", build, lambda c: launch(name="k"), need_ptx=True)
        got.append(fetch_request(cache, request))

    threads = [threading.Thread(target=worker) for _ in range(2)]
    threads[0].start()
    time.sleep(0.03)  # the second arrives while the first builds
    threads[1].start()
    for t in threads:
        t.join(timeout=60)
    assert len(builds) == 1, "the waiter compiled again"
    assert sorted(kb.built for kb in got) == [False, True]
    assert {kb.ptx for kb in got} == {ptx_text("k").decode()}


# A job process: operations on 30 shared keys until told to stop; every artifact served is
# checked against the bytes its key must hold. Prints its counts.
WORKER = """
import hashlib, json, os, random, sys, kernelcache
root, seed, stop = sys.argv[1], int(sys.argv[2]), sys.argv[3]
rng = random.Random(seed)

def payload(i):
    return hashlib.sha256(b"chaos-%d" % i).digest() * (100 + 997 * i % 3000)

def key(i):
    return hashlib.sha256(b"chaos-key-%d" % i).hexdigest()

cache = kernelcache.Cache(root, readonly_roots=(), lock_timeout=30)
ops = wrong = 0
print("READY", flush=True)
while not os.path.exists(stop):
    i = rng.randrange(30)
    op = rng.random()
    if op < 0.6:
        art = cache.get_or_create(key(i), "bin", lambda: (payload(i), {"name": "k%d" % i}))
    elif op < 0.9:
        art = cache.get(key(i), "bin")
    else:
        try:
            art = cache.put(key(i), "bin", payload(i), {"name": "k%d" % i})
        except kernelcache.CacheError:
            art = None  # e.g. the entry was being pruned: put may fail, never lie
    ops += 1
    if art is not None:
        # (the bytes served; the file itself may be pruned or damaged once get has returned)
        wrong += art.data != payload(i)
print(json.dumps({"ops": ops, "wrong": wrong, "stats": kernelcache.process_stats()}))
"""
PRUNER = """
import sys, time
from kernelcache import cli
root = sys.argv[1]
while True:
    cli.main(["--root", root, "prune", "--max-size", "400K"])
    time.sleep(0.05)
"""


KILLS = 20


def test_chaos_jobs_pruner_kills_and_damage(tmp_path):
    """Six job processes at a time on one root, a pruner looping `prune --max-size`, a
    process killed (SIGKILL) every ~0.3 s and replaced, and artifact files damaged in place:
    no job is served a wrong byte, no job fails, and the root verifies clean afterwards."""
    import random
    import signal
    import subprocess
    import sys

    from reliability_support import audit
    from support import child_env

    root = tmp_path / "root"
    stop = tmp_path / "stop"
    rng = random.Random(7)
    env = child_env()

    def start(seed: int) -> subprocess.Popen:
        p = subprocess.Popen(
            [sys.executable, "-c", WORKER, str(root), str(seed), str(stop)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert p.stdout.readline().strip() == "READY"
        return p

    pruner = subprocess.Popen(
        [sys.executable, "-c", PRUNER, str(root)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    live = [start(s) for s in range(6)]
    seed, kills, damaged = 6, 0, 0
    while kills < KILLS:
        time.sleep(rng.uniform(0.1, 0.5))
        victim = rng.choice(live)
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        live.remove(victim)
        for stream in (victim.stdout, victim.stderr):
            stream.close()
        kills += 1
        live.append(start(seed))
        seed += 1
        artifacts = list(root.glob("*.bin"))
        if artifacts and kills % 2:
            target = rng.choice(artifacts)
            try:
                with open(target, "r+b") as f:  # damage in place, as a bad disk would
                    f.seek(rng.randrange(max(target.stat().st_size, 1)))
                    f.write(b"\xff")
                damaged += 1
            except OSError:
                pass  # pruned meanwhile
    stop.touch()
    pruner.send_signal(signal.SIGKILL)
    pruner.wait()
    finished = live
    ops = wrong = failed = 0
    for p in finished:
        out, err = p.communicate(timeout=120)
        if p.returncode != 0:
            failed += 1
            print(err)
            continue
        doc = json.loads(out.strip().splitlines()[-1])
        ops += doc["ops"]
        wrong += doc["wrong"]
    assert failed == 0 and wrong == 0
    assert damaged >= KILLS // 4
    code, out = run_cli("--root", str(root), "verify", "--repair", "--json")
    assert code == 0, out
    code, out = run_cli("--root", str(root), "verify", "--json")
    assert code == 0 and json.loads(out)["clean"] is True
    expected = {}
    for i in range(30):
        k = hashlib.sha256(b"chaos-key-%d" % i).hexdigest()
        expected[k] = ("bin", hashlib.sha256(b"chaos-%d" % i).digest() * (100 + 997 * i % 3000))
    assert audit(root, expected).served_wrong == 0
    record_figures(
        "chaos: jobs, pruner, kill -9, damaged artifacts",
        processes=6 + kills + 1,
        operations=ops,
        faults=kills + damaged,
        corrupt_served=wrong,
        jobs_failed=failed,
    )
