"""What the bridge adds to a process's start, against ``import jax, triton`` alone.

Each measurement is a fresh process that imports jax and triton (the baseline: any Triton-in-JAX
program pays it), then ``import bridge``, then ``bridge.triton_call`` (the first access imports
the lowering machinery), then lowers one call whose kernel is already in the kernel cache. The
modules the first lowering imports are timed with ``-X importtime`` in separate runs (the
imports between two markers), and the largest of everything the bridge brings in is listed.
Bytecode is cached (``PYTHONDONTWRITEBYTECODE`` is unset for the measured processes, and a
first run writes it), as it is for an installed package.

With ``--before REF_OR_DIR`` the same runs also measure an older bridge (a directory, or a git
ref exported with ``git archive``) for comparison. Prints a table (min and median over
``--repeats`` processes), then one JSON line; ``--out FILE`` also writes it.

    python benchmarks/import_cost.py --repeats 15 --before main --out import_cost.json
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
from pathlib import Path

from common import emit_summary, export

REPO = Path(__file__).resolve().parent.parent
STEPS = ("import jax, triton", "import bridge", "bridge.triton_call", "first lowering")
CHILD = r"""
import json, sys, time
def mark(what):
    sys.stderr.write(f"@@ {what}\n")
    sys.stderr.flush()
t0 = time.perf_counter()
import jax, jax.numpy as jnp, triton
t1 = time.perf_counter()
mark("bridge")
import bridge
t2 = time.perf_counter()
bridge.triton_call
t3 = time.perf_counter()
mark("accessed")
from examples import kernels as K
x = jax.ShapeDtypeStruct((4096,), jnp.float32)
def f(a, b):
    return bridge.triton_call(a, b, a.size, kernel=K.add_kernel, out_shape=a, grid=(4,),
                              BLOCK=1024, target="cuda:90")
jax.jit(lambda a, b: a + b).trace(x, x).lower(lowering_platforms=("cuda",))  # JAX's own first
mark("lowering")
t4 = time.perf_counter()
jax.jit(f).trace(x, x).lower(lowering_platforms=("cuda",))
t5 = time.perf_counter()
mark("end")
t6 = time.perf_counter()
jax.jit(f).trace(jax.ShapeDtypeStruct((8192,), jnp.float32), x).lower(lowering_platforms=("cuda",))
t7 = time.perf_counter()
print(json.dumps({"import jax, triton": t1 - t0, "import bridge": t2 - t1,
                  "bridge.triton_call": t3 - t2, "first lowering": t5 - t4,
                  "next lowering": t7 - t6}))
"""


def run(root: Path, cache: str, importtime: bool) -> tuple[dict, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KERNELCACHE_")}
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # bytecode cached, as for an installed package
    env.update(PYTHONPATH=str(root), KERNELCACHE_DIR=cache, JAX_PLATFORMS="cpu")
    cmd = [sys.executable, *(["-X", "importtime"] if importtime else []), "-c", CHILD]
    proc = subprocess.run(cmd, env=env, cwd=str(root), capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"the measuring process failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


def imports_between(stderr: str, start: str, end: str) -> dict[str, float]:
    """Top-level imports (cumulative ms) that ``-X importtime`` logged between two markers."""
    out: dict[str, float] = {}
    inside = False
    for line in stderr.splitlines():
        if line.startswith("@@ "):
            inside = line[3:] == start or (inside and line[3:] != end)
            continue
        if inside and line.startswith("import time:") and "self [us]" not in line:
            _, cumulative, name = line[len("import time:") :].split("|")
            if not name.startswith("  "):  # one space: imported by the section itself
                out[name.strip()] = out.get(name.strip(), 0.0) + int(cumulative) / 1000
    return out


def measure(root: Path, repeats: int, work: Path) -> dict:
    cache = tempfile.mkdtemp(prefix="kc-", dir=work)
    run(root, cache, False)  # the kernel and the modules' bytecode are cached from now on
    rows: dict[str, list[float]] = {}
    for _ in range(repeats):
        timings, _ = run(root, cache, False)
        for step, seconds in timings.items():
            rows.setdefault(step, []).append(seconds * 1000)
    lowering_imports: list[dict[str, float]] = []
    access_imports: list[dict[str, float]] = []
    for _ in range(3):
        _, stderr = run(root, cache, True)
        access_imports.append(imports_between(stderr, "bridge", "accessed"))
        lowering_imports.append(imports_between(stderr, "lowering", "end"))

    def least(samples: list[dict[str, float]]) -> dict[str, float]:
        names = set().union(*samples)
        return {
            n: round(min(s.get(n, 0.0) for s in samples), 2)
            for n in sorted(names, key=lambda n: -min(s.get(n, 0.0) for s in samples))
        }

    imports_access = least(access_imports)
    imports_lowering = least(lowering_imports)
    return {
        "min_ms": {k: round(min(v), 2) for k, v in rows.items()},
        "median_ms": {k: round(statistics.median(v), 2) for k, v in rows.items()},
        "imports_by_access_ms": imports_access,
        "imports_by_first_lowering_ms": imports_lowering,
        "imports_by_first_lowering_total_ms": round(sum(imports_lowering.values()), 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=15, help="processes per bridge")
    parser.add_argument("--before", help="an older checkout (directory) or git ref")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="import-cost-"))
    bridges = {"now": REPO}
    if args.before:
        bridges["before"] = export(args.before, work)
    try:
        results = {label: measure(root, args.repeats, work) for label, root in bridges.items()}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    summary: dict = {
        "repeats": args.repeats,
        "before": args.before,
        "cpus": len(os.sched_getaffinity(0)),
        "load_average": os.getloadavg(),
        "bridges": results,
    }
    for r in results.values():
        added = r["min_ms"]["import bridge"] + r["min_ms"]["bridge.triton_call"]
        r["bridge_adds_min_ms"] = round(added, 2)
        r["bridge_adds_with_lowering_imports_min_ms"] = round(
            added + r["imports_by_first_lowering_total_ms"], 2
        )
    print(f"{'step':40} " + " ".join(f"{label + ' min':>11} {'median':>8}" for label in results))
    for step in (*STEPS, "next lowering"):
        print(
            f"{step:40} "
            + " ".join(
                f"{r['min_ms'][step]:11.1f} {r['median_ms'][step]:8.1f}" for r in results.values()
            )
        )
    print(
        f"{'imports during the first lowering':40} "
        + " ".join(
            f"{r['imports_by_first_lowering_total_ms']:11.1f} {'':8}" for r in results.values()
        )
    )
    print(
        f"{'bridge adds: import + first access':40} "
        + " ".join(f"{r['bridge_adds_min_ms']:11.1f} {'':8}" for r in results.values())
    )
    print(
        f"{'  + imports of the first lowering':40} "
        + " ".join(
            f"{r['bridge_adds_with_lowering_imports_min_ms']:11.1f} {'':8}"
            for r in results.values()
        )
    )
    for label, r in results.items():
        top = list(r["imports_by_access_ms"].items())[:6]
        print(
            f"{label}: largest imports at first access (ms): "
            + ", ".join(f"{n} {t}" for n, t in top)
        )
        low = list(r["imports_by_first_lowering_ms"].items())[:6]
        print(
            f"{label}: imports during the first lowering (ms): "
            + ", ".join(f"{n} {t}" for n, t in low)
        )
    print(f"load average: {os.getloadavg()[0]:.1f} on {summary['cpus']} CPUs")
    print()
    emit_summary(summary, args.out)


if __name__ == "__main__":
    main()
