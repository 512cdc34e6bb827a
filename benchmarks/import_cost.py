"""What the bridge adds to a process's start, against ``import jax, triton`` alone, and what
``import kernelcache`` and the operator's command cost, module by module.

Each measurement is a fresh process. The bridge's process imports jax and triton (the baseline:
any Triton-in-JAX program pays it), then ``import bridge`` and ``bridge.triton_call`` (the first
access imports the lowering machinery), then lowers one call whose kernel is already in the
kernel cache (the imports it makes are the first lowering's). The operator's processes import
``kernelcache`` alone, and ``kernelcache.cli`` (what the ``kernelcache`` command imports before
it parses its arguments), with nothing before.

Two runs per repeat and process: one timed, one under ``python -X importtime``, whose stderr
gives each module's own (self) and cumulative microseconds; the tables show each module's median
over the repeats, largest own time first. A module ``importlib.import_module`` imports (the
bridge's lazy names: ``bridge.api``) is not logged by ``-X importtime``; the row "not logged"
is the wall time of the step less what the log attributes, which is mostly those modules' own
code. The modules a step brings in are counted from ``sys.modules``: the project's
(``bridge.*``, ``kernelcache.*``), the standard library's, and each third-party package's
beyond what ``import jax, triton`` loaded already (protobuf, xxhash, ...). Bytecode is cached
(``PYTHONDONTWRITEBYTECODE`` is unset for the measured processes, and a first run writes it),
as it is for an installed package.

Wall time (median and minimum) and, for the steps the bridge adds and the operator's imports, the
process's CPU time (median; what other work on a busy machine changes least).

With ``--before REF_OR_DIR`` the same runs also measure an older bridge (a directory, or a git
ref exported with ``git archive``), its processes interleaved with this one's. Prints tables
(median and min over ``--repeats``), then one JSON line; ``--out FILE`` also writes it.

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
PROJECT = ("bridge", "kernelcache")
STEPS = (
    "import jax, triton",
    "import bridge + bridge.triton_call",
    "first lowering",
    "next lowering",
)
#: the operator's processes: the step, and the statement it times with nothing imported before
OPERATOR = {
    "import kernelcache (alone)": "import kernelcache",
    "import kernelcache.cli (the command)": "import kernelcache.cli",
}
#: the steps whose imports are tabled module by module
TABLED = ("import bridge + bridge.triton_call", *OPERATOR)
#: the bridge's process: markers on stderr delimit the steps in the ``-X importtime`` log
BRIDGE_CHILD = r"""
import json, sys, time
def mark(what):
    sys.stderr.write(f"@@ {what}\n")
    sys.stderr.flush()
t0 = time.perf_counter()
import jax, jax.numpy as jnp, triton
t1 = time.perf_counter()
loaded = set(sys.modules)
mark("bridge")
t2, c2 = time.perf_counter(), time.process_time()
import bridge
bridge.triton_call
t3, c3 = time.perf_counter(), time.process_time()
mark("accessed")
brought = sorted(set(sys.modules) - loaded)
from examples import kernels as K
x = jax.ShapeDtypeStruct((4096,), jnp.float32)
def f(a, b):
    return bridge.triton_call(a, b, a.size, kernel=K.add_kernel, out_shape=a, grid=(4,),
                              BLOCK=1024, target="cuda:90")
jax.jit(lambda a, b: a + b).trace(x, x).lower(lowering_platforms=("cuda",))  # JAX's own first
mark("lowering")
t4, c4 = time.perf_counter(), time.process_time()
jax.jit(f).trace(x, x).lower(lowering_platforms=("cuda",))
t5, c5 = time.perf_counter(), time.process_time()
mark("end")
t6 = time.perf_counter()
jax.jit(f).trace(jax.ShapeDtypeStruct((8192,), jnp.float32), x).lower(lowering_platforms=("cuda",))
t7 = time.perf_counter()
print(json.dumps({"ms": {"import jax, triton": t1 - t0, "import bridge + bridge.triton_call": t3 - t2,
                         "first lowering": t5 - t4, "next lowering": t7 - t6},
                  "cpu": {"import bridge + bridge.triton_call": c3 - c2, "first lowering": c5 - c4},
                  "brought": brought, "stdlib": sorted(sys.stdlib_module_names)}))
"""
#: an operator's process: the statement given (``import kernelcache``) and nothing before it
OPERATOR_CHILD = r"""
import json, sys, time
loaded = set(sys.modules)
sys.stderr.write("@@ start\n")
sys.stderr.flush()
t0, c0 = time.perf_counter(), time.process_time()
exec(sys.argv[1])
t1, c1 = time.perf_counter(), time.process_time()
sys.stderr.write("@@ end\n")
print(json.dumps({"ms": t1 - t0, "cpu": c1 - c0, "brought": sorted(set(sys.modules) - loaded),
                  "stdlib": sorted(sys.stdlib_module_names)}))
"""


def run(root: Path, cache: str, child: str, importtime: bool, *args: str) -> tuple[dict, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KERNELCACHE_")}
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # bytecode cached, as for an installed package
    env.update(PYTHONPATH=str(root), KERNELCACHE_DIR=cache, JAX_PLATFORMS="cpu")
    cmd = [sys.executable, *(["-X", "importtime"] if importtime else []), "-c", child, *args]
    proc = subprocess.run(cmd, env=env, cwd=str(root), capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"the measuring process failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


def logged_imports(stderr: str, start: str, end: str) -> dict[str, tuple[int, int, bool]]:
    """{module: (self µs, cumulative µs, imported by the section itself)} that ``-X
    importtime`` logged between two markers (a module logged twice: the times added)."""
    out: dict[str, tuple[int, int, bool]] = {}
    inside = False
    for line in stderr.splitlines():
        if line.startswith("@@ "):
            inside = line[3:] == start or (inside and line[3:] != end)
            continue
        if inside and line.startswith("import time:") and "self [us]" not in line:
            own, cumulative, name = line[len("import time:") :].split("|")
            top = not name.startswith("  ")  # one space: imported by the section itself
            was = out.get(name.strip(), (0, 0, False))
            out[name.strip()] = (was[0] + int(own), was[1] + int(cumulative), was[2] or top)
    return out


def counts(brought: list[str], stdlib: list[str]) -> dict:
    """The modules a step brought in: the project's, the standard library's, the others' by
    top-level package."""
    std = set(stdlib)
    third: dict[str, int] = {}
    project = standard = 0
    for name in brought:
        top = name.split(".")[0]
        if top in PROJECT:
            project += 1
        elif top in std:
            standard += 1
        else:
            third[top] = third.get(top, 0) + 1
    return {"project": project, "stdlib": standard, "third_party": dict(sorted(third.items()))}


def modules_table(logs: list[dict[str, tuple[int, int, bool]]], wall_ms: list[float]) -> dict:
    """Each module's median own and cumulative ms over the runs, largest own time first, and
    the median of what the log does not attribute (the step's wall time less its top-level
    imports' cumulative time)."""
    names = set().union(*logs)
    rows = []
    for name in names:
        own = statistics.median(log.get(name, (0, 0, False))[0] for log in logs) / 1000
        cumulative = statistics.median(log.get(name, (0, 0, False))[1] for log in logs) / 1000
        rows.append(
            {"module": name, "self_ms": round(own, 3), "cumulative_ms": round(cumulative, 3)}
        )
    rows.sort(key=lambda r: (-r["self_ms"], r["module"]))
    unlogged = [
        wall - sum(c for _, c, top in log.values() if top) / 1000
        for log, wall in zip(logs, wall_ms, strict=True)
    ]
    project = [r["self_ms"] for r in rows if r["module"].split(".")[0] in PROJECT]
    return {
        "modules": rows,
        "logged_total_ms": round(sum(r["self_ms"] for r in rows), 2),
        "project_self_ms": round(sum(project), 2),
        "not_logged_ms": round(statistics.median(unlogged), 2),
    }


def sample(root: Path, cache: str) -> dict:
    """One repeat: each process timed, then each under ``-X importtime``: {"ms": {step: ms},
    "tables": {step: (its import log, its wall ms, what it brought)}, "lowering": the first
    lowering's import log}."""
    result, _ = run(root, cache, BRIDGE_CHILD, False)
    timed = {step: seconds * 1000 for step, seconds in result["ms"].items()}
    cpu = {step: seconds * 1000 for step, seconds in result["cpu"].items()}
    for step, statement in OPERATOR.items():
        result, _ = run(root, cache, OPERATOR_CHILD, False, statement)
        timed[step] = result["ms"] * 1000
        cpu[step] = result["cpu"] * 1000
    result, stderr = run(root, cache, BRIDGE_CHILD, True)
    step = "import bridge + bridge.triton_call"
    tables = {
        step: (
            logged_imports(stderr, "bridge", "accessed"),
            result["ms"][step] * 1000,
            counts(result["brought"], result["stdlib"]),
        )
    }
    lowering = logged_imports(stderr, "lowering", "end")
    for step, statement in OPERATOR.items():
        result, stderr = run(root, cache, OPERATOR_CHILD, True, statement)
        tables[step] = (
            logged_imports(stderr, "start", "end"),
            result["ms"] * 1000,
            counts(result["brought"], result["stdlib"]),
        )
    return {"ms": timed, "cpu": cpu, "tables": tables, "lowering": lowering}


def summarize(samples: list[dict]) -> dict:
    """The medians and minimums of one bridge's samples."""
    timed = {step: [s["ms"][step] for s in samples] for step in (*STEPS, *OPERATOR)}
    cpu = {step: [s["cpu"][step] for s in samples] for step in samples[0]["cpu"]}
    first = modules_table([s["lowering"] for s in samples], [0.0] * len(samples))
    tables = {}
    for step in TABLED:
        logs = [s["tables"][step][0] for s in samples]
        walls = [s["tables"][step][1] for s in samples]
        tables[step] = {**modules_table(logs, walls), "brought": samples[-1]["tables"][step][2]}
    return {
        "median_ms": {k: round(statistics.median(v), 2) for k, v in timed.items()},
        "min_ms": {k: round(min(v), 2) for k, v in timed.items()},
        "cpu_median_ms": {k: round(statistics.median(v), 2) for k, v in cpu.items()},
        "imports": tables,
        "first_lowering_imports": first["modules"],
        "first_lowering_imports_ms": first["logged_total_ms"],
    }


def brought_line(brought: dict) -> str:
    third = ", ".join(f"{k} {v}" for k, v in brought["third_party"].items()) or "none"
    return (
        f"{brought['project']} project, {brought['stdlib']} standard library, third-party: {third}"
    )


def print_modules(label: str, what: str, table: dict, top: int) -> None:
    print(f"{label}: {what}: {brought_line(table['brought'])}")
    print(f"  {'module':44} {'self ms':>8} {'cumul. ms':>10}")
    for row in table["modules"][:top]:
        print(f"  {row['module']:44} {row['self_ms']:8.2f} {row['cumulative_ms']:10.2f}")
    rest = table["modules"][top:]
    if rest:
        print(f"  {f'{len(rest)} more':44} {sum(r['self_ms'] for r in rest):8.2f}")
    print(f"  {'not logged (importlib.import_module)':44} {table['not_logged_ms']:8.2f}")
    others = table["logged_total_ms"] - table["project_self_ms"]
    print(f"  {'own time of the project modules, in all':44} {table['project_self_ms']:8.2f}")
    print(f"  {'own time of the others, in all':44} {others:8.2f}")
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=15, help="processes per bridge and run")
    parser.add_argument("--before", help="an older checkout (directory) or git ref")
    parser.add_argument("--top", type=int, default=20, help="modules shown per table")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="import-cost-"))
    bridges = {"now": REPO}
    if args.before:
        bridges["before"] = export(args.before, work)
    samples: dict[str, list[dict]] = {label: [] for label in bridges}
    try:
        caches = {label: tempfile.mkdtemp(prefix="kc-", dir=work) for label in bridges}
        for label, root in bridges.items():  # the kernel and the bytecode cached from now on
            run(root, caches[label], BRIDGE_CHILD, False)
            run(root, caches[label], OPERATOR_CHILD, False, "import kernelcache.cli")
        for _ in range(args.repeats):
            for label, root in bridges.items():
                samples[label].append(sample(root, caches[label]))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    results = {label: summarize(rows) for label, rows in samples.items()}
    summary: dict = {
        "repeats": args.repeats,
        "before": args.before,
        "cpus": len(os.sched_getaffinity(0)),
        "load_average": os.getloadavg(),
        "bridges": results,
    }
    print(
        f"{'step':36} "
        + " ".join(f"{label + ' median':>14} {'min':>7} {'cpu':>7}" for label in results)
    )
    for step in (*STEPS, *OPERATOR):
        cells = []
        for r in results.values():
            cpu = r["cpu_median_ms"].get(step)
            shown = f"{cpu:7.1f}" if cpu is not None else f"{'':7}"
            cells.append(f"{r['median_ms'][step]:14.1f} {r['min_ms'][step]:7.1f} {shown}")
        print(f"{step:36} " + " ".join(cells))
    print()
    print(
        f"{'modules a step imports':36} "
        + " ".join(f"{label + ': project':>16} {'own ms':>7} {'std':>4}" for label in results)
    )
    for step in TABLED:
        cells = []
        for r in results.values():
            table = r["imports"][step]
            cells.append(
                f"{table['brought']['project']:16} {table['project_self_ms']:7.1f}"
                f" {table['brought']['stdlib']:4}"
            )
        print(f"{step:36} " + " ".join(cells))
    print(
        f"{'imports of the first lowering, ms':36} "
        + " ".join(f"{r['first_lowering_imports_ms']:14.1f} {'':7}" for r in results.values())
    )
    print()
    for label, r in results.items():
        for step in TABLED:
            print_modules(label, step, r["imports"][step], args.top)
        first = ", ".join(
            f"{row['module']} {row['self_ms']:.2f}" for row in r["first_lowering_imports"][:6]
        )
        print(f"{label}: imports of the first lowering (self ms): {first or 'none'}")
        print()
    print(f"load average: {os.getloadavg()[0]:.1f} on {summary['cpus']} CPUs")
    print()
    emit_summary(summary, args.out)


if __name__ == "__main__":
    main()
