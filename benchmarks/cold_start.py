"""Cold start of a multi-process job on one machine, without a GPU: N processes lower the same
autotuned matmul (4 configs: 4 kernel variants) for ``cuda:90`` into one empty kernel cache at
the same moment, against one process alone.

Every process imports jax, the bridge and the kernels, then waits; the parent releases them
all at once and each lowers the call (Triton compiles every missing variant, or takes it from
the cache). Per wave: the wall time from the release until the last process has its lowered
module; the Triton compiles in total (single flight: exactly one per variant) and a check that
every process lowered the very same module.

With ``--before REF_OR_DIR`` the same waves also run the bridge of an older checkout (a
directory, or a git ref exported with ``git archive``) in the same run, e.g. the commit before
work stealing, so the ratios compare like with like on the same machine and load.

    python benchmarks/cold_start.py --repeats 5 --before d60eb4c --out cold_start.json

Prints a table, then one JSON line (medians and ratios); ``--out FILE`` also writes it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CHILD = r"""
import hashlib, json, os, sys, time
import jax, jax.numpy as jnp
import bridge, kernelcache
from bridge import compile as bridge_compile
from examples import ops

bridge.triton_call  # the lowering machinery is imported before the start signal
a = jax.ShapeDtypeStruct((512, 512), jnp.bfloat16)
fn = lambda x, y: ops.matmul(x, y, target="cuda:90", embed="inline")
print("READY", flush=True)
sys.stdin.readline()  # the parent releases every process at once
started = time.time()
lowered = jax.jit(fn).trace(a, a).lower(lowering_platforms=("cuda",))
ended = time.time()
text = lowered.as_text()
print(json.dumps({"started": started, "ended": ended,
                  "compiles": bridge_compile.compile_count(),
                  "builds": kernelcache.process_stats()["builds"],
                  "module": hashlib.sha256(text.encode()).hexdigest()}))
"""


def wave(code_root: Path, n: int, cache: str) -> dict:
    """Start ``n`` processes on the bridge of ``code_root``; release them together; collect."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KERNELCACHE_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(code_root), env.get("PYTHONPATH")]))
    env["KERNELCACHE_DIR"] = cache
    env["JAX_PLATFORMS"] = "cpu"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD],
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
            p.wait()
            raise SystemExit(f"a worker failed to start:\n{p.stderr.read()[-3000:]}")  # type: ignore[union-attr]
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
        "builds": sum(r["builds"] for r in results),
        "modules": sorted({r["module"] for r in results}),
    }


def export(ref: str, into: Path) -> Path:
    """A directory holding the bridge of ``ref``: the directory itself, or the git ref's tree."""
    if Path(ref).is_dir():
        return Path(ref).resolve()
    tree = into / f"before-{hashlib.sha256(ref.encode()).hexdigest()[:8]}"
    tree.mkdir()
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", "--format=tar", ref],
        capture_output=True,
        check=True,
    )
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
    return tree


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, default=2, help="processes of a job (default 2)")
    parser.add_argument("--repeats", type=int, default=5, help="repeats of every wave")
    parser.add_argument(
        "--before", help="an older checkout (directory) or git ref to compare against"
    )
    parser.add_argument("--out", type=Path, help="also write the JSON summary here")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="cold-start-"))
    bridges = {"now": REPO}
    if args.before:
        bridges["before"] = export(args.before, work)
    n = args.processes
    runs: dict[str, list[dict]] = {}
    try:
        for rep in range(args.repeats):
            for label, root in bridges.items():
                for size in (1, n):
                    name = f"{label}: {size} process{'es' if size > 1 else ''}"
                    run = wave(root, size, tempfile.mkdtemp(prefix="kc-", dir=work))
                    runs.setdefault(name, []).append(run)
                    print(
                        f"  repeat {rep + 1} {name:22} wall {run['wall']:6.3f} s  compiles "
                        f"{run['compiles']}  builds {run['builds']}",
                        flush=True,
                    )
    finally:
        shutil.rmtree(work, ignore_errors=True)

    waves = {
        name: {
            "wall_s": statistics.median(r["wall"] for r in rs),
            "walls_s": [round(r["wall"], 3) for r in rs],
            "compiles": [r["compiles"] for r in rs],
            "builds": [r["builds"] for r in rs],
        }
        for name, rs in runs.items()
    }
    modules = {m for rs in runs.values() for r in rs for m in r["modules"]}
    ratios = {}
    for label in bridges:
        alone, job = waves[f"{label}: 1 process"], waves[f"{label}: {n} processes"]
        ratios[f"{label}: 1 process over {n}"] = round(alone["wall_s"] / job["wall_s"], 2)
    if "before" in bridges:
        ratios[f"{n} processes: before over now"] = round(
            waves[f"before: {n} processes"]["wall_s"] / waves[f"now: {n} processes"]["wall_s"], 2
        )
    checks = {
        "each variant compiled once per wave": all(
            c == 4 for w in waves.values() for c in w["compiles"]
        ),
        "one lowered module in every process, wave and bridge": len(modules) == 1,
    }
    summary = {
        "processes": n,
        "repeats": args.repeats,
        "before": args.before,
        "cpus": len(os.sched_getaffinity(0)),
        "waves": waves,
        "ratios": ratios,
        "checks": checks,
    }
    print()
    print(f"{'wave':24} {'wall s (median)':>16} {'compiles':>9} {'builds':>7}")
    for name, w in waves.items():
        print(
            f"{name:24} {w['wall_s']:16.3f} {'/'.join(map(str, w['compiles'])):>9} "
            f"{'/'.join(map(str, w['builds'])):>7}"
        )
    print()
    for name, value in ratios.items():
        print(f"{name:34} {value:5.2f}x")
    for check, passed in checks.items():
        print(f"{'PASS' if passed else 'FAIL'}  {check}")
    print()
    print(json.dumps(summary, sort_keys=True))
    if args.out:
        args.out.write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    if not all(checks.values()):
        sys.exit(1)


if __name__ == "__main__":
    main()
