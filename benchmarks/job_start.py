"""The training-job start: N worker processes start at once on one machine (e.g. 8 per GPU, each
pinned to one GPU with CUDA_VISIBLE_DEVICES), each lowering and running the same model of 21
Triton kernel variants (the "large" model of warm_start.py), sharing one kernel-cache root.

Waves (each: N fresh processes launched together; cold waves get fresh cache roots):

  bridge cold      kernel cache cold, JAX cache cold: every variant must be compiled exactly
                   once in total across the N processes (single flight; checked)
  peer cold        jax-triton 0.3.1, JAX cache cold: every process compiles every variant
  bridge warm      kernel cache warm, JAX persistent cache off
  peer warm        jax-triton, JAX cache off (it has no kernel cache)
  bridge jax-warm  kernel cache warm, JAX cache warm
  peer jax-warm    jax-triton, JAX cache warm (the peer's best start)
  bridge pruned    JAX cache warm, kernel cache pruned just before (`kernelcache prune
                   --max-size 0`): kernels compiled again, once in total (checked)

Per process: time from its launch to its first result (imports, input arrays, lowering, XLA
compile and first call finished), reported as median, p90 and max, with the median of each
phase; per wave: wall time from the first launch to the
last exit, total Triton compiles, JAX cache hits, and a correctness check of every result.
Prints a table, ends with one JSON line (medians and ratios against the peer measured in the
same run); ``--out FILE`` also writes it.

    python benchmarks/job_start.py --per-gpu 8 --repeats 2 --out job_start.json
    python benchmarks/job_start.py --dry-run          # no GPU: lowering only, a check of the script

The peer rows are skipped, with a note, when ``import jax_triton`` fails.
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

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
WAVES = (
    "bridge cold",
    "peer cold",
    "bridge warm",
    "peer warm",
    "bridge jax-warm",
    "peer jax-warm",
    "bridge pruned",
)


# -- the child: one worker process ------------------------------------------------------------
def child(impl: str, model: str, jax_cache: str | None, dry_run: bool) -> None:
    """Lower, compile and run the model once; print one JSON line of timings (wall clock, so
    that the parent can relate them to the launch time it passes in $KC_LAUNCHED)."""
    launched = float(os.environ["KC_LAUNCHED"])
    import jax
    import jax.numpy as jnp

    if impl == "peer":
        import jax_triton

        triton_call = jax_triton.triton_call
    else:
        import bridge

        triton_call = bridge.triton_call
    sys.path.insert(0, str(HERE))
    import warm_start

    imported = time.time()
    hits = warm_start.use_jax_cache(jax_cache)
    fn, args = warm_start.make_model(triton_call, model, {})
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
        ok = bool(jnp.array_equal(out[0], args[0] + args[0]))
    done = time.time()
    compiles = None
    if impl != "peer":
        from bridge import compile as bridge_compile

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


def peer_available() -> bool:
    probe = subprocess.run([sys.executable, "-c", "import jax_triton"], capture_output=True)
    return probe.returncode == 0


def wave(
    impl: str,
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
    base["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), base.get("PYTHONPATH")]))
    base["KERNELCACHE_DIR"] = kernels
    base["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"  # n processes share each GPU's memory
    if dry_run:
        base["KERNELCACHE_TARGET"] = "cuda:90"
    cmd = [sys.executable, __file__, "--child", impl, model, jax_cache or "-", str(dry_run)]
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
        print(f"  {len(failed)} of {n} {impl} workers failed; the last error:\n{failed[-1]}")
    return {"results": results, "wall": wall, "failed": len(failed)}


def _q(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def summarize(runs: list[dict], kernels_in_root: list[int]) -> dict:
    """One wave kind over its repeats: first-result quantiles over every process, wall time
    median, compiles per repeat, checks."""
    first = [r["first_result"] for run in runs for r in run["results"]]
    compiles = [
        sum(r["kernel_compiles"] or 0 for r in run["results"])
        if run["results"] and run["results"][0]["kernel_compiles"] is not None
        else None
        for run in runs
    ]
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
        "kernel_compiles": compiles,
        "kernels_in_root": kernels_in_root,
        "jax_cache_hits": sorted({r["jax_cache_hits"] for run in runs for r in run["results"]}),
        "ok": all(r["ok"] for run in runs for r in run["results"]),
    }


def count_kernels(root: str) -> int:
    """Distinct compiled kernels in a root: its .cubin entries (one per kernel key)."""
    try:
        return sum(1 for name in os.listdir(root) if name.endswith(".cubin"))
    except FileNotFoundError:
        return 0


def prune_all(root: str) -> None:
    cmd = [sys.executable, "-m", "kernelcache.cli", "--root", root, "prune", "--max-size", "0"]
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    )
    subprocess.run(cmd, check=True, capture_output=True, env=env, cwd=str(REPO))


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        _, _, impl, model, jax_cache, dry = sys.argv
        child(impl, model, None if jax_cache == "-" else jax_cache, dry == "True")
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--per-gpu", type=int, default=8, help="workers per GPU (default 8)")
    parser.add_argument("--gpus", type=int, help="GPUs to use (default: all that nvidia-smi lists)")
    parser.add_argument("--processes", type=int, help="total workers (overrides --per-gpu)")
    parser.add_argument("--repeats", type=int, default=2, help="repeats of every wave (default 2)")
    parser.add_argument("--model", default="large", choices=("small", "large"))
    parser.add_argument("--waves", default=",".join(WAVES), help="comma-separated subset")
    parser.add_argument("--no-peer", action="store_true", help="skip jax-triton's waves")
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
    wanted = [w.strip() for w in args.waves.split(",") if w.strip()]
    unknown = set(wanted) - set(WAVES)
    if unknown:
        raise SystemExit(f"unknown waves {sorted(unknown)}; choose from {', '.join(WAVES)}")
    with_peer = not args.no_peer and not args.dry_run and peer_available()
    if not with_peer:
        wanted = [w for w in wanted if not w.startswith("peer")]
        if not args.no_peer:
            print(
                "note: jax_triton is not importable (or --dry-run); the peer waves are skipped "
                "(pip install --no-deps jax_triton-0.3.1-py3-none-any.whl)"
            )
    work = Path(tempfile.mkdtemp(prefix="job-start-"))
    print(
        f"{n} workers ({gpus or 'no'} GPU(s){', dry run: lowering only' if args.dry_run else ''}),"
        f" model {args.model}, {args.repeats} repeat(s); caches under {work}",
        flush=True,
    )
    runs: dict[str, list[dict]] = {w: [] for w in wanted}
    kernel_counts: dict[str, list[int]] = {w: [] for w in wanted}
    started = time.time()

    def fresh(name: str) -> str:
        return tempfile.mkdtemp(prefix=f"{name}-", dir=work)

    def go(name: str, impl: str, kernels: str, jax_cache: str | None) -> None:
        if name not in runs:
            return
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
        runs[name].append(run)
        kernel_counts[name].append(count_kernels(kernels))
        firsts = sorted(r["first_result"] for r in run["results"]) or [float("nan")]
        compiles = [r["kernel_compiles"] for r in run["results"]]
        print(
            f"  {name:16} wall {run['wall']:7.2f} s  first result median "
            f"{statistics.median(firsts):6.2f} s  max {firsts[-1]:6.2f} s  compiles "
            f"{sum(c or 0 for c in compiles) if None not in compiles else '-'}  failed "
            f"{run['failed']}",
            flush=True,
        )

    try:
        for rep in range(args.repeats):
            print(f"repeat {rep + 1}:", flush=True)
            kc, jc = fresh("kc"), fresh("jc")
            go("bridge cold", "bridge", kc, jc)
            if "bridge cold" not in runs:  # later waves need a warm kernel cache
                wave(
                    "bridge",
                    1,
                    gpus,
                    model=args.model,
                    kernels=kc,
                    jax_cache=jc,
                    dry_run=args.dry_run,
                    timeout=args.timeout,
                )
            peer_jc = fresh("peer-jc")
            go("peer cold", "peer", fresh("unused"), peer_jc)
            go("bridge warm", "bridge", kc, None)
            go("peer warm", "peer", fresh("unused"), None)
            go("bridge jax-warm", "bridge", kc, jc)
            if "peer jax-warm" in runs and not runs.get("peer cold"):
                wave(
                    "peer",
                    1,
                    gpus,
                    model=args.model,
                    kernels=fresh("unused"),
                    jax_cache=peer_jc,
                    dry_run=args.dry_run,
                    timeout=args.timeout,
                )
            go("peer jax-warm", "peer", fresh("unused"), peer_jc)
            if "bridge pruned" in runs:
                prune_all(kc)
                assert count_kernels(kc) == 0
                go("bridge pruned", "bridge", kc, jc)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)

    summary: dict = {
        "processes": n,
        "gpus": gpus,
        "model": args.model,
        "repeats": args.repeats,
        "dry_run": args.dry_run,
        "seconds": round(time.time() - started, 1),
        "waves": {w: summarize(r, kernel_counts[w]) for w, r in runs.items() if r},
    }
    waves = summary["waves"]
    checks = {}
    for name in ("bridge cold", "bridge pruned"):
        if name in waves:
            w = waves[name]
            checks[f"{name}: each variant compiled once in total"] = (
                w["kernel_compiles"] == w["kernels_in_root"] and w["failed"] == 0
            )
    checks["every result correct, no worker failed"] = all(
        w["ok"] and w["failed"] == 0 for w in waves.values()
    )
    summary["checks"] = checks

    def med(name: str) -> float | None:
        return waves[name]["first_result_s"]["median"] if name in waves else None

    def ratio(a: float | None, b: float | None) -> float | None:
        return round(a / b, 2) if a and b else None

    summary["ratios"] = {
        "cold_wall_peer_over_bridge": ratio(
            waves.get("peer cold", {}).get("wall_s"), waves.get("bridge cold", {}).get("wall_s")
        ),
        "warm_first_result_peer_over_bridge": ratio(med("peer warm"), med("bridge warm")),
        "jax_warm_first_result_peer_over_bridge": ratio(
            med("peer jax-warm"), med("bridge jax-warm")
        ),
        "pruned_first_result_peer_jax_warm_over_bridge": ratio(
            med("peer jax-warm"), med("bridge pruned")
        ),
    }
    summary["medians_s"] = {w: med(w) for w in waves}

    print()
    print(
        f"{'wave':17} {'procs':>5} {'wall s':>7} {'first result s: median':>23} {'p90':>6} "
        f"{'max':>6} {'compiles':>9} {'kernels':>7} {'jax hits':>8} {'ok':>3}"
    )
    for name, w in waves.items():
        fr = w["first_result_s"]
        comp = "/".join("-" if c is None else str(c) for c in w["kernel_compiles"])
        print(
            f"{name:17} {w['processes']:5d} {w['wall_s']:7.2f} {fr['median'] or 0:23.2f} "
            f"{fr['p90'] or 0:6.2f} {fr['max'] or 0:6.2f} {comp:>9} "
            f"{'/'.join(map(str, w['kernels_in_root'])):>7} "
            f"{','.join(map(str, w['jax_cache_hits'])):>8} {'yes' if w['ok'] else 'NO':>3}"
        )
    print()
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
