"""Cold start of a multi-process job on one machine, without a GPU: N processes lower the same
autotuned matmul (4 configs: 4 kernel variants) for ``cuda:90`` into one empty kernel cache at
the same moment, against one process alone.

Every process imports jax, the bridge and the kernels, then waits; the parent releases them
all at once and each lowers the call (Triton compiles every missing variant, or takes it from
the cache). Per wave: the wall time from the release until the last process has its lowered
module; the CPU seconds (its own and its ptxas runs') of the busiest process, which is the wall
time on a machine with a free core per process (this benchmark's machine is shared: the load
average is printed, and the "ceiling": how much faster N processes of pure CPU work finish
together than in sequence on the machine at that moment); the Triton compiles in total (single
flight: exactly one per variant) and per process; and a check that every process lowered the
very same module.

With ``--before REF_OR_DIR`` the same waves also run the bridge of an older checkout (a
directory, or a git ref exported with ``git archive``) in the same run, e.g. the commit before
work stealing, so the ratios compare like with like on the same machine and load: "before over
now" for one process alone and for the job (above 1: now is faster). The CPU seconds include
the compiler processes the bridge forks (children, reaped within the lowering).

    python benchmarks/cold_start.py --repeats 5 --before d60eb4c --out cold_start.json

Prints a table, then one JSON line (medians and ratios); ``--out FILE`` also writes it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import emit_summary, export

REPO = Path(__file__).resolve().parent.parent
CHILD = r"""
import hashlib, json, os, resource, sys, time
import jax, jax.numpy as jnp
import bridge, kernelcache
try:
    from bridge.compile import compiler as bridge_compile
except ImportError:  # a bridge from before the stage folders
    from bridge import compile as bridge_compile
from examples import ops

bridge.triton_call  # the lowering machinery is imported before the start signal
if sys.argv[1] == "matmul":
    args = (jax.ShapeDtypeStruct((512, 512), jnp.bfloat16),) * 2
    fn = lambda x, y: ops.matmul(x, y, target="cuda:90", embed="inline")
else:  # a model of benchmarks/tuned_models.py
    sys.path.insert(0, sys.argv[2])
    import tuned_models
    fn, args, _ = tuned_models.make_model(bridge.triton_call, sys.argv[1], {"target": "cuda:90"})
    args = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in args]
print("READY", flush=True)
sys.stdin.readline()  # the parent releases every process at once
def cpu():
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime  # with ptxas

started, cpu_started = time.time(), cpu()
lowered = jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",))
ended, cpu_ended = time.time(), cpu()
text = lowered.as_text()
print(json.dumps({"started": started, "ended": ended, "cpu": cpu_ended - cpu_started,
                  "compiles": bridge_compile.compile_count(),
                  "builds": kernelcache.process_stats()["builds"],
                  "module": hashlib.sha256(text.encode()).hexdigest()}))
"""


def wave(code_root: Path, n: int, cache: str, model: str) -> dict:
    """Start ``n`` processes on the bridge of ``code_root``; release them together; collect."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KERNELCACHE_")}
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # bytecode cached, as for an installed package
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(code_root), env.get("PYTHONPATH")]))
    env["KERNELCACHE_DIR"] = cache
    env["JAX_PLATFORMS"] = "cpu"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, model, str(REPO / "benchmarks")],
            env=env,
            cwd=str(code_root),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(n)
    ]
    for p in procs:
        assert p.stdout is not None
        line = p.stdout.readline()
        if line.strip() != "READY":
            _, err = p.communicate()
            raise SystemExit(f"a worker failed to start:\n{err[-3000:]}")
    released = time.time()
    for p in procs:
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()
    results = []
    for p in procs:
        out, err = p.communicate(timeout=600)
        if p.returncode != 0:
            raise SystemExit(f"a worker failed:\n{err[-3000:]}")
        results.append(json.loads(out.strip().splitlines()[-1]))
    return {
        "wall": max(r["ended"] for r in results) - released,
        "compiles": sum(r["compiles"] for r in results),
        "per_process": [r["compiles"] for r in results],
        # CPU seconds of the busiest process: the wall time it would take with a free core each
        "cpu_critical": max(r["cpu"] for r in results),
        "builds": sum(r["builds"] for r in results),
        "modules": sorted({r["module"] for r in results}),
    }


BURN = "import sys, time\nt = time.perf_counter()\nx = 0\nfor i in range(3_000_000): x += i * i\n"


def ceiling(n: int) -> float:
    """How much faster ``n`` processes of pure CPU work finish together than one after the
    other on this machine now (``n`` on a machine with ``n`` free cores)."""

    def burn(count: int) -> float:
        started = time.perf_counter()
        procs = [subprocess.Popen([sys.executable, "-c", BURN]) for _ in range(count)]
        for p in procs:
            p.wait()
        return time.perf_counter() - started

    return n * burn(1) / burn(n)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, default=2, help="processes of a job (default 2)")
    parser.add_argument("--repeats", type=int, default=5, help="repeats of every wave")
    parser.add_argument(
        "--before", help="an older checkout (directory) or git ref to compare against"
    )
    parser.add_argument(
        "--model",
        default="matmul",
        choices=("matmul", "matmul16", "attention", "autotune"),
        help="matmul: the 4-config matmul of examples/ (default); others: tuned_models.py",
    )
    parser.add_argument("--out", type=Path, help="also write the JSON summary here")
    args = parser.parse_args()
    variants = {"matmul": 4, "matmul16": 16, "attention": 8, "autotune": 24}[args.model]
    work = Path(tempfile.mkdtemp(prefix="cold-start-"))
    bridges = {"now": REPO}
    if args.before:
        bridges["before"] = export(args.before, work)
    n = args.processes
    runs: dict[str, list[dict]] = {}
    ceilings: list[float] = []
    try:
        for rep in range(args.repeats):
            ceilings.append(ceiling(n))
            print(f"  repeat {rep + 1} CPU work, {n} processes at once: {ceilings[-1]:.2f}x faster")
            for label, root in bridges.items():
                for size in (1, n):
                    name = f"{label}: {size} process{'es' if size > 1 else ''}"
                    run = wave(root, size, tempfile.mkdtemp(prefix="kc-", dir=work), args.model)
                    runs.setdefault(name, []).append(run)
                    print(
                        f"  repeat {rep + 1} {name:22} wall {run['wall']:6.3f} s  compiles "
                        f"{run['compiles']} ({'+'.join(map(str, run['per_process']))})  "
                        f"builds {run['builds']}  busiest process {run['cpu_critical']:.3f} "
                        f"CPU s  load {os.getloadavg()[0]:.1f}",
                        flush=True,
                    )
    finally:
        shutil.rmtree(work, ignore_errors=True)

    waves = {
        name: {
            "wall_s": statistics.median(r["wall"] for r in rs),
            "cpu_critical_s": statistics.median(r["cpu_critical"] for r in rs),
            "walls_s": [round(r["wall"], 3) for r in rs],
            "compiles": [r["compiles"] for r in rs],
            "builds": [r["builds"] for r in rs],
            "compiles_per_process": [r["per_process"] for r in rs],
        }
        for name, rs in runs.items()
    }
    modules = {
        label: {
            m
            for name, rs in runs.items()
            if name.startswith(label)
            for r in rs
            for m in r["modules"]
        }
        for label in bridges
    }
    ratios = {}
    for label in bridges:
        alone, job = waves[f"{label}: 1 process"], waves[f"{label}: {n} processes"]
        ratios[f"{label}: 1 process over {n}, wall"] = round(alone["wall_s"] / job["wall_s"], 2)
        ratios[f"{label}: 1 process over {n}, busiest CPU"] = round(
            alone["cpu_critical_s"] / job["cpu_critical_s"], 2
        )
    if "before" in bridges:
        for size in (1, n):
            wave_name = f"{size} process{'es' if size > 1 else ''}"
            for what, field in (("wall", "wall_s"), ("busiest CPU", "cpu_critical_s")):
                ratios[f"{wave_name}: before over now, {what}"] = round(
                    waves[f"before: {wave_name}"][field] / waves[f"now: {wave_name}"][field], 2
                )
    checks = {
        "each variant compiled once per wave": all(
            c == variants for w in waves.values() for c in w["compiles"]
        ),
        "one lowered module in every process and wave (per bridge)": all(
            len(m) == 1 for m in modules.values()
        ),
    }
    summary = {
        "processes": n,
        "model": args.model,
        "repeats": args.repeats,
        "before": args.before,
        "cpus": len(os.sched_getaffinity(0)),
        "load_average": os.getloadavg(),
        # what this machine allowed: n processes of pure CPU work at once against in sequence
        "ceiling": round(statistics.median(ceilings), 2),
        "ceilings": [round(c, 2) for c in ceilings],
        "waves": waves,
        "ratios": ratios,
        "checks": checks,
    }
    print()
    print(
        f"{'wave':24} {'wall s':>8} {'busiest CPU s':>14} {'compiles per process':>24}  (medians)"
    )
    for name, w in waves.items():
        shares = " ".join("+".join(map(str, c)) for c in w["compiles_per_process"])
        print(f"{name:24} {w['wall_s']:8.3f} {w['cpu_critical_s']:14.3f} {shares:>24}")
    print()
    for name, value in ratios.items():
        print(f"{name:44} {value:5.2f}x")
    print(
        f"{'ceiling: CPU work, ' + str(n) + ' processes at once vs in sequence':44} "
        f"{summary['ceiling']:5.2f}x"
    )
    print(f"load average at the end: {os.getloadavg()[0]:.1f} on {summary['cpus']} CPUs")
    for check, passed in checks.items():
        print(f"{'PASS' if passed else 'FAIL'}  {check}")
    print()
    emit_summary(summary, args.out)
    if not all(checks.values()):
        sys.exit(1)


if __name__ == "__main__":
    main()
