"""The training-job start: N worker processes start at once on one machine (e.g. 8 per GPU, each
pinned to one GPU with CUDA_VISIBLE_DEVICES), each lowering and running the same model, sharing
one kernel-cache root. Models: "large" (21 Triton kernel variants, from warm_start.py), "small"
(5), and, with a realistic autotune space (tuned_models.py), "matmul16" (a bf16 matmul autotuned
over 16 configs), "attention" (a flash-attention forward over 8) and "autotune" (both: 24).

Implementations, each in its own environment so that each can use the Triton it needs in the
same run (as in warm_start.py): ``--bridge LABEL=PATHS`` and ``--peer LABEL=PATHS`` put PATHS
(separated by ':') first on the workers' PYTHONPATH: a bridge found there (e.g. an older
checkout: "the bridge before a change"), or a jax-triton release (with a folder holding the
Triton it needs); ``--env LABEL:NAME=VALUE`` sets a variable for one of them. Default: the
bridge of this checkout ("bridge") and, without --peer, an importable ``jax_triton`` ("peer").
The first bridge is the reference of the ratios.

States (each: N fresh processes launched together; cold states get fresh cache roots):

  cold      kernel cache and JAX cache cold. A bridge compiles every variant exactly once in
            total across the N processes (single flight; checked); a peer compiles every
            variant in every process
  warm      kernel cache warm, JAX persistent cache off (a peer: JAX cache off)
  jax-warm  kernel cache warm, JAX cache warm (a peer: JAX cache warm, its best start)
  pruned    (bridges) JAX cache warm, kernel cache pruned just before (`kernelcache prune
            --max-size 0`): kernels compiled again, once in total (checked)

Per process: time from its launch to its first result (imports, input arrays, lowering, XLA
compile and first call finished), reported as median, p90 and max, with the median of each
phase; per wave: wall time from the first launch to the last exit, total Triton compiles (and
per process), JAX cache hits, and a correctness check of every result. Prints a table, ends with
one JSON line (medians and ratios against the reference bridge measured in the same run);
``--out FILE`` also writes it.

    python benchmarks/job_start.py --per-gpu 8 --repeats 2 --out job_start.json
    python benchmarks/job_start.py --gpus 1 --per-gpu 8 --model autotune \\
        --states cold,jax-warm,pruned --bridge bridge= --bridge before=.bench/before \\
        --peer jax-triton-0.3.1=/tmp/jt031 --peer jax-triton-0.4.1=/tmp/jt041:/tmp/triton-3.8.0
    python benchmarks/job_start.py --dry-run          # no GPU: lowering for cuda:90 only

A peer is skipped, with a note, when ``import jax_triton`` fails in its environment. In a dry run a
peer lowers with ``compute_capability=90`` (no GPU to ask).
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
from dataclasses import dataclass, field
from pathlib import Path

from common import emit_summary

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
STATES = ("cold", "warm", "jax-warm", "pruned")
MODELS = ("small", "large", "matmul16", "attention", "autotune")


@dataclass(frozen=True)
class Impl:
    """One implementation under test: its label, kind ("bridge" or "peer"), the directories put
    first on its workers' PYTHONPATH and its extra environment variables."""

    name: str
    kind: str
    paths: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)

    def states(self, wanted: list[str]) -> list[str]:
        return [s for s in wanted if self.kind == "bridge" or s != "pruned"]


def parse_impl(kind: str, text: str) -> Impl:
    """``LABEL=PATHS`` (PATHS separated by ':', possibly empty) as an :class:`Impl`.

    Raises:
        SystemExit: malformed, with what is expected.
    """
    name, sep, rest = text.partition("=")
    if not sep or not name or " " in name:
        raise SystemExit(
            f"--{kind} {text!r}: expected LABEL=PATHS (PATHS separated by ':', may be empty) "
            f"with a LABEL without spaces, e.g. --{kind} before=.bench/before"
        )
    paths = tuple(str(Path(d).resolve()) for d in rest.split(os.pathsep) if d)
    for path in paths:
        if not Path(path).is_dir():
            raise SystemExit(f"--{kind} {text!r}: {path} is not a directory")
    return Impl(name, kind, paths)


def pythonpath(impl: Impl) -> str:
    return os.pathsep.join(filter(None, [*impl.paths, str(REPO), os.environ.get("PYTHONPATH")]))


# -- the child: one worker process ------------------------------------------------------------
def make_model(triton_call, model: str, extra: dict) -> tuple:
    """``(fn, args, check)`` of ``model``; ``check(outputs)`` tells whether they are right."""
    sys.path.insert(0, str(HERE))
    if model in ("small", "large"):
        import jax.numpy as jnp
        import warm_start

        fn, args = warm_start.make_model(triton_call, model, extra)
        return fn, args, lambda out: bool(jnp.array_equal(out[0], args[0] + args[0]))
    import tuned_models

    return tuned_models.make_model(triton_call, model, extra)


def child(kind: str, model: str, jax_cache: str | None, dry_run: bool) -> None:
    """Lower, compile and run the model once; print one JSON line of timings (wall clock, so
    that the parent can relate them to the launch time it passes in $KC_LAUNCHED)."""
    launched = float(os.environ["KC_LAUNCHED"])
    import jax

    extra: dict = {}
    if kind == "peer":
        import jax_triton

        triton_call = jax_triton.triton_call
        if dry_run:
            extra["compute_capability"] = 90
    else:
        import bridge

        triton_call = bridge.triton_call
    sys.path.insert(0, str(HERE))
    import warm_start

    imported = time.time()
    hits = warm_start.use_jax_cache(jax_cache)
    fn, args, check = make_model(triton_call, model, extra)
    jax.block_until_ready(args)
    hits.clear()
    started = time.time()
    if dry_run:  # no GPU: lowering for CUDA only
        jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",))
        lowered = compiled = time.time()
        ok = True
    else:
        low = jax.jit(fn).lower(*args)
        lowered = time.time()
        exe = low.compile()
        compiled = time.time()
        out = jax.block_until_ready(exe(*args))
        ok = check(out)
    done = time.time()
    compiles = None
    if kind != "peer":
        try:
            from bridge.compile import compiler as bridge_compile
        except ImportError:  # a bridge from before the stage folders
            from bridge import compile as bridge_compile  # type: ignore[no-redef]

        compiles = bridge_compile.compile_count()
    print(
        json.dumps(
            {
                "first_result": done - launched,
                "import": imported - launched,
                "setup": started - imported,  # the model's input arrays
                "lower": lowered - started,
                "compile": compiled - lowered,
                "first_call": done - compiled,
                "kernel_compiles": compiles,
                "jax_cache_hits": len(hits),
                "ok": ok,
                "device": os.environ.get("CUDA_VISIBLE_DEVICES"),
            }
        )
    )


# -- the parent: waves of processes -----------------------------------------------------------
def gpu_count() -> int:
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))


def importable(impl: Impl) -> str | None:
    """None if ``impl``'s package imports with its path, else the error."""
    module = "jax_triton" if impl.kind == "peer" else "bridge"
    env = dict(os.environ, PYTHONPATH=pythonpath(impl), **impl.env)
    probe = subprocess.run(
        [sys.executable, "-c", f"import {module}"], capture_output=True, text=True, env=env
    )
    return None if probe.returncode == 0 else (probe.stderr.strip().splitlines() or ["?"])[-1]


def wave(
    impl: Impl,
    n: int,
    gpus: int,
    *,
    model: str,
    kernels: str,
    jax_cache: str | None,
    dry_run: bool,
    timeout: float,
) -> dict:
    """Launch ``n`` workers together; wait for all; return their results and the wall time."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("KERNELCACHE_")}
    base.pop("PYTHONDONTWRITEBYTECODE", None)  # bytecode cached, as for installed packages
    base["PYTHONPATH"] = pythonpath(impl)
    base.update(impl.env)
    base["KERNELCACHE_DIR"] = kernels
    base["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"  # n processes share each GPU's memory
    if dry_run:
        base["KERNELCACHE_TARGET"] = "cuda:90"
        base["JAX_PLATFORMS"] = "cpu"
    cmd = [sys.executable, __file__, "--child", impl.kind, model, jax_cache or "-", str(dry_run)]
    procs = []
    first = time.time()
    for i in range(n):
        env = dict(base, KC_LAUNCHED=repr(time.time()))
        if gpus:
            env["CUDA_VISIBLE_DEVICES"] = str(i % gpus)
        procs.append(
            subprocess.Popen(
                cmd, env=env, cwd=str(REPO), stdout=subprocess.PIPE, stderr=subprocess.PIPE
            )
        )
    results, failed = [], []
    deadline = first + timeout
    for p in procs:
        try:
            out, err = p.communicate(timeout=max(deadline - time.time(), 1))
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
        if p.returncode != 0:
            failed.append(err.decode(errors="replace")[-2000:])
            continue
        results.append(json.loads(out.decode().strip().splitlines()[-1]))
    wall = time.time() - first
    if failed:
        print(f"  {len(failed)} of {n} {impl.name} workers failed; the last error:\n{failed[-1]}")
    return {"results": results, "wall": wall, "failed": len(failed)}


def _q(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def summarize(runs: list[dict], kernels_in_root: list[int]) -> dict:
    """One wave kind over its repeats: first-result quantiles over every process, wall time
    median, compiles per repeat (in total and per process), checks."""
    first = [r["first_result"] for run in runs for r in run["results"]]
    counted = all(r["kernel_compiles"] is not None for run in runs for r in run["results"])
    return {
        "processes": sum(len(run["results"]) for run in runs),
        "failed": sum(run["failed"] for run in runs),
        "wall_s": statistics.median(run["wall"] for run in runs),
        "first_result_s": {
            "median": statistics.median(first) if first else None,
            "p90": _q(first, 0.9) if first else None,
            "max": max(first) if first else None,
        },
        "phases_median_s": {
            p: statistics.median(r[p] for run in runs for r in run["results"])
            for p in ("import", "setup", "lower", "compile", "first_call")
        }
        if first
        else {},
        "kernel_compiles": [sum(r["kernel_compiles"] for r in run["results"]) for run in runs]
        if counted and first
        else None,
        "compiles_per_process": [
            sorted(r["kernel_compiles"] for r in run["results"]) for run in runs
        ]
        if counted and first
        else None,
        "kernels_in_root": kernels_in_root,
        "jax_cache_hits": sorted({r["jax_cache_hits"] for run in runs for r in run["results"]}),
        "ok": bool(first) and all(r["ok"] for run in runs for r in run["results"]),
    }


def count_kernels(root: str) -> int:
    """Distinct compiled kernels in a root: its .cubin entries (one per kernel key)."""
    try:
        return sum(1 for name in os.listdir(root) if name.endswith(".cubin"))
    except FileNotFoundError:
        return 0


def prune_all(root: str, impl: Impl) -> None:
    cmd = [sys.executable, "-m", "kernelcache.cli", "--root", root, "prune", "--max-size", "0"]
    env = dict(os.environ, PYTHONPATH=pythonpath(impl), **impl.env)
    subprocess.run(cmd, check=True, capture_output=True, env=env, cwd=str(REPO))


def ratios(waves: dict, impls: list[Impl]) -> dict:
    """Other implementations over the reference bridge (> 1: the reference is faster): cold
    wall time and cold first result; pruned against a bridge's pruned wave or a peer's
    jax-warm wave (its best start, as it has no kernel cache to prune)."""
    ref = next((i for i in impls if i.kind == "bridge"), None)
    out: dict = {}
    if ref is None:
        return out

    def get(name: str, what: str) -> float | None:
        w = waves.get(name)
        if w is None:
            return None
        return w["wall_s"] if what == "wall" else w["first_result_s"]["median"]

    def ratio(a: float | None, b: float | None) -> float | None:
        return round(a / b, 2) if a and b else None

    for other in impls:
        if other is ref:
            continue
        restart = f"{other.name} pruned" if other.kind == "bridge" else f"{other.name} jax-warm"
        for what in ("wall", "first_result"):
            out[f"cold {what}: {other.name} / {ref.name}"] = ratio(
                get(f"{other.name} cold", what), get(f"{ref.name} cold", what)
            )
            out[f"pruned {what}: {restart} / {ref.name} pruned"] = ratio(
                get(restart, what), get(f"{ref.name} pruned", what)
            )
    return {k: v for k, v in out.items() if v is not None}


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        _, _, kind, model, jax_cache, dry = sys.argv
        child(kind, model, None if jax_cache == "-" else jax_cache, dry == "True")
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--per-gpu", type=int, default=8, help="workers per GPU (default 8)")
    parser.add_argument("--gpus", type=int, help="GPUs to use (default: all that nvidia-smi lists)")
    parser.add_argument("--processes", type=int, help="total workers (overrides --per-gpu)")
    parser.add_argument("--repeats", type=int, default=2, help="repeats of every wave (default 2)")
    parser.add_argument("--model", default="large", choices=MODELS)
    parser.add_argument(
        "--bridge",
        action="append",
        default=[],
        metavar="LABEL=PATHS",
        help="a bridge in an environment (default: 'bridge', this checkout)",
    )
    parser.add_argument(
        "--peer",
        action="append",
        default=[],
        metavar="LABEL=PATHS",
        help="a jax-triton to compare with: its label, and PYTHONPATH entries holding it",
    )
    parser.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="LABEL:NAME=VALUE",
        help="an environment variable for one bridge or peer",
    )
    parser.add_argument("--states", default=",".join(STATES), help="comma-separated subset")
    parser.add_argument("--no-peer", action="store_true", help="skip every peer")
    parser.add_argument("--timeout", type=float, default=300, help="seconds per wave")
    parser.add_argument("--out", type=Path, help="also write the JSON summary here")
    parser.add_argument("--keep", action="store_true", help="keep the temporary caches")
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="no GPU: lower for cuda:90 only (checks the script, not the speed); 4 workers",
    )
    args = parser.parse_args()
    gpus = 0 if args.dry_run else (args.gpus if args.gpus is not None else gpu_count())
    if not args.dry_run and gpus == 0:
        raise SystemExit("no GPU found (nvidia-smi -L); use --dry-run on a machine without one")
    n = args.processes or (4 if args.dry_run else args.per_gpu * gpus)
    states = [s.strip() for s in args.states.split(",") if s.strip()]
    unknown = set(states) - set(STATES)
    if unknown:
        raise SystemExit(f"unknown states {sorted(unknown)}; choose from {', '.join(STATES)}")
    bridges = [parse_impl("bridge", text) for text in args.bridge] or [Impl("bridge", "bridge")]
    peers = [parse_impl("peer", text) for text in args.peer] or [Impl("peer", "peer")]
    impls = [*bridges, *peers]
    if len({i.name for i in impls}) != len(impls):
        raise SystemExit("every --bridge and --peer needs a label of its own")
    by_label = {i.name: i for i in impls}
    for spec in args.env:
        label, _, assignment = spec.partition(":")
        name, eq, value = assignment.partition("=")
        if label not in by_label or not eq or not name:
            raise SystemExit(f"--env {spec!r}: expected LABEL:NAME=VALUE with a known LABEL")
        by_label[label].env[name] = value
    usable = []
    for impl in impls:
        if impl.kind == "peer" and args.no_peer:
            continue
        why = importable(impl)
        if why is not None:
            print(f"note: {impl.name} is skipped: {why}")
            if impl.kind == "bridge":
                raise SystemExit(f"the bridge {impl.name} cannot be imported: {why}")
            continue
        usable.append(impl)
    impls = usable
    work = Path(tempfile.mkdtemp(prefix="job-start-"))
    print(
        f"{n} workers ({gpus or 'no'} GPU(s){', dry run: lowering only' if args.dry_run else ''}),"
        f" model {args.model}, {args.repeats} repeat(s), "
        f"{', '.join(f'{i.name} ({i.kind})' for i in impls)}; caches under {work}",
        flush=True,
    )
    runs: dict[str, list[dict]] = {f"{i.name} {s}": [] for i in impls for s in i.states(states)}
    kernel_counts: dict[str, list[int]] = {name: [] for name in runs}
    started = time.time()

    def fresh(name: str) -> str:
        return tempfile.mkdtemp(prefix=f"{name}-", dir=work)

    def go(impl: Impl, state: str, kernels: str, jax_cache: str | None, n: int = n) -> None:
        name = f"{impl.name} {state}"
        run = wave(
            impl,
            n,
            gpus,
            model=args.model,
            kernels=kernels,
            jax_cache=jax_cache,
            dry_run=args.dry_run,
            timeout=args.timeout,
        )
        if name not in runs:  # a preparing wave: not reported
            return
        runs[name].append(run)
        kernel_counts[name].append(count_kernels(kernels))
        firsts = sorted(r["first_result"] for r in run["results"]) or [float("nan")]
        compiles = [r["kernel_compiles"] for r in run["results"]]
        shares = "+".join(map(str, sorted(compiles))) if None not in compiles else "-"
        print(
            f"  {name:30} wall {run['wall']:7.2f} s  first result median "
            f"{statistics.median(firsts):6.2f} s  max {firsts[-1]:6.2f} s  compiles "
            f"{shares}  failed {run['failed']}",
            flush=True,
        )

    try:
        for rep in range(args.repeats):
            print(f"repeat {rep + 1}:", flush=True)
            for impl in impls:
                mine = impl.states(states)
                kc, jc = fresh("kc"), fresh("jc")
                if "cold" in mine:
                    go(impl, "cold", kc, jc)
                elif set(mine) - {"cold"}:  # later states need warm caches
                    go(impl, "prepare", kc, jc, n=1)
                if "warm" in mine:
                    go(impl, "warm", kc if impl.kind == "bridge" else fresh("unused"), None)
                if "jax-warm" in mine:
                    go(impl, "jax-warm", kc if impl.kind == "bridge" else fresh("unused"), jc)
                if "pruned" in mine:
                    prune_all(kc, impl)
                    assert count_kernels(kc) == 0
                    go(impl, "pruned", kc, jc)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)

    summary: dict = {
        "processes": n,
        "gpus": gpus,
        "model": args.model,
        "repeats": args.repeats,
        "dry_run": args.dry_run,
        "impls": [
            {"name": i.name, "kind": i.kind, "paths": list(i.paths), "env": i.env} for i in impls
        ],
        "seconds": round(time.time() - started, 1),
        "waves": {w: summarize(r, kernel_counts[w]) for w, r in runs.items() if r},
    }
    waves = summary["waves"]
    checks = {}
    for impl in impls:
        for state in ("cold", "pruned"):
            w = waves.get(f"{impl.name} {state}")
            if impl.kind == "bridge" and w is not None:
                checks[f"{impl.name} {state}: each variant compiled once in total"] = (
                    w["kernel_compiles"] == w["kernels_in_root"] and w["failed"] == 0
                )
    checks["every result correct, no worker failed"] = all(
        w["ok"] and w["failed"] == 0 for w in waves.values()
    )
    summary["checks"] = checks
    summary["ratios"] = ratios(waves, impls)
    summary["medians_s"] = {w: v["first_result_s"]["median"] for w, v in waves.items()}

    print()
    print(
        f"{'wave':30} {'procs':>5} {'wall s':>7} {'first result s: median':>23} {'p90':>6} "
        f"{'max':>6} {'lower':>6} {'compiles':>9} {'kernels':>7} {'jax hits':>8} {'ok':>3}"
    )
    for name, w in waves.items():
        fr = w["first_result_s"]
        comp = "/".join(map(str, w["kernel_compiles"])) if w["kernel_compiles"] else "-"
        print(
            f"{name:30} {w['processes']:5d} {w['wall_s']:7.2f} {fr['median'] or 0:23.2f} "
            f"{fr['p90'] or 0:6.2f} {fr['max'] or 0:6.2f} "
            f"{w['phases_median_s'].get('lower', 0):6.2f} {comp:>9} "
            f"{'/'.join(map(str, w['kernels_in_root'])):>7} "
            f"{','.join(map(str, w['jax_cache_hits'])):>8} {'yes' if w['ok'] else 'NO':>3}"
        )
    print()
    for name, value in summary["ratios"].items():
        print(f"{name:64} {value:6.2f}x")
    print()
    for check, passed in checks.items():
        print(f"{'PASS' if passed else 'FAIL'}  {check}")
    print()
    emit_summary(summary, args.out)
    if not all(checks.values()):
        sys.exit(1)


if __name__ == "__main__":
    main()
