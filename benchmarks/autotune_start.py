"""The first call of an autotuned model in fresh processes: jaxlib's runtime autotuning against
the bridge's autotune decisions (GPU).

The model (tuned_models.py's kernels at larger sizes): a bf16 matmul autotuned over 16 configs
(8192^3 by default) and a flash-attention forward over 8, in one jitted step. Every state starts
from a kernel cache that already holds every variant (so no Triton compile is timed), with JAX's
persistent cache off:

  runtime   KERNELCACHE_AUTOTUNE=runtime: every config embedded, jaxlib benchmarks them at the
            first execution, in every process
  decided   after `kernelcache tune MANIFEST` (timed): each call lowered as its one chosen kernel
  job       no decision yet, KERNELCACHE_AUTOTUNE=job: one process measures, the others wait for
            its decision (the tuning is counted: it should happen once per wave)

each alone (one process) and as a wave of N processes launched together. Per process: XLA
compile time, first execution, steady execution (median of 20); "first - steady" is what the
first call costs beyond a steady one. Which config each process ran: for decided calls the
kernel key embedded in the lowered call, for runtime autotuning the "best config" line jaxlib
logs (TF_CPP_MIN_LOG_LEVEL=0). Prints a table and one JSON line; ``--out FILE`` writes it.

    python benchmarks/autotune_start.py --procs 8 --out results/autotune_start-h200.json

``--spread N`` (a machine with N GPUs) times deciding instead: `tune --gpus 1` and `tune --gpus
N` in turn, three times each, the configs of each call spread over the GPUs.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import emit_summary

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
STATES = ("runtime", "decided", "job")


# -- one process --------------------------------------------------------------------------------
def model(size: int, ctx: int, heads: int):
    import jax
    import jax.numpy as jnp
    import triton
    from tuned_models import attention_fwd_kernel, matmul16_kernel

    import bridge

    dim = 64
    keys = jax.random.split(jax.random.PRNGKey(0), 5)

    def rand(key, shape):
        return jax.random.normal(key, shape, jnp.float32).astype(jnp.bfloat16)

    a, b = rand(keys[0], (size, size)), rand(keys[1], (size, size))
    q, k, v = (rand(keys[i], (heads, ctx, dim)) for i in (2, 3, 4))

    def step(a, b, q, k, v):
        c = bridge.triton_call(
            a,
            b,
            size,
            size,
            size,
            kernel=matmul16_kernel,
            out_shape=jax.ShapeDtypeStruct((size, size), jnp.bfloat16),
            grid=lambda meta: (triton.cdiv(size, meta["BM"]), triton.cdiv(size, meta["BN"])),
        )
        o = bridge.triton_call(
            q,
            k,
            v,
            ctx,
            kernel=attention_fwd_kernel,
            out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
            grid=lambda meta: (triton.cdiv(ctx, meta["BLOCK_M"]), heads),
            HEAD_DIM=dim,
            SM_SCALE=1.0 / math.sqrt(dim),
        )
        return c, o

    return step, (a, b, q, k, v)


def embedded(lowered) -> list[str]:
    """Per Triton custom call: the kernel key of its one kernel, or "runtime:" and the name
    jaxlib logs its choice under (autotuned at the first run)."""
    from jax._src.lib.mlir import ir

    from bridge.lowering import proto

    found: list[str] = []

    def visit(op):
        if op.name == "stablehlo.custom_call":
            attrs = op.attributes
            if "mhlo.backend_config" in attrs:
                raw = ir.StringAttr(ir.DictAttr(attrs["mhlo.backend_config"])["opaque"])
            else:
                raw = ir.StringAttr(attrs["backend_config"])
            call = proto.decode_opaque(raw.value_bytes)
            if call.HasField("kernel_call"):
                found.append(call.kernel_call.kernel.ptx.rstrip().rsplit(" ", 1)[-1])
            else:
                found.append("runtime:" + call.autotuned_kernel_call.name)
        return ir.WalkResult.ADVANCE

    module = lowered.compiler_ir("stablehlo")
    with module.context:
        module.operation.walk(visit)
    return found


def child(size: int, ctx: int, heads: int) -> None:
    import logging

    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("bridge.tune.select").setLevel(logging.INFO)
    import jax

    start = time.perf_counter()
    step, args = model(size, ctx, heads)
    jax.block_until_ready(args)
    lowered = jax.jit(step).lower(*args)
    lowering = time.perf_counter() - start
    kernels = embedded(lowered)
    t = time.perf_counter()
    compiled = lowered.compile()
    compile_s = time.perf_counter() - t
    t = time.perf_counter()
    jax.block_until_ready(compiled(*args))
    first = time.perf_counter() - t
    steady = []
    for _ in range(20):
        t = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        steady.append(time.perf_counter() - t)
    doc = {
        "lowering": lowering,
        "compile": compile_s,
        "first": first,
        "steady": statistics.median(steady),
        "kernels": kernels,
    }
    print("RESULT " + json.dumps(doc), flush=True)


# -- waves --------------------------------------------------------------------------------------
def launch(n: int, env: dict[str, str], args: argparse.Namespace) -> list[dict]:
    cmd = [sys.executable, str(Path(__file__)), "--child"]
    cmd += ["--size", str(args.size), "--ctx", str(args.ctx), "--heads", str(args.heads)]
    procs = [
        subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(n)
    ]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=600)
        if proc.returncode != 0:
            raise SystemExit(f"a worker failed:\n{err[-4000:]}")
        doc = json.loads(next(x for x in out.splitlines() if x.startswith("RESULT "))[7:])
        doc["best"] = dict(re.findall(r"Finished autotuning function: (.+) best config (.+)", err))
        doc["tuned"] = len(re.findall(r"kernelcache: tuned ", err))
        results.append(doc)
    return results


def environ(root: Path, mode: str, **extra: str) -> dict[str, str]:
    env = {**os.environ, "KERNELCACHE_DIR": str(root), "KERNELCACHE_AUTOTUNE": mode}
    path = os.pathsep.join(p for p in (str(HERE), str(REPO), env.get("PYTHONPATH", "")) if p)
    # N processes share the GPU: none may take most of its memory up front
    env.update(TF_CPP_MIN_LOG_LEVEL="0", XLA_PYTHON_CLIENT_PREALLOCATE="false", PYTHONPATH=path)
    env.update(extra)
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    return env


def summarize(results: list[dict]) -> dict:
    def med(name: str) -> float:
        return statistics.median(r[name] for r in results)

    configs = []
    for i in range(len(results[0]["kernels"])):
        ran = set()
        for r in results:
            kernel = r["kernels"][i]
            if kernel.startswith("runtime:"):  # jaxlib chose: its log names the config
                kernel = r["best"].get(kernel[len("runtime:") :], "?")
            ran.add(kernel)
        configs.append(len(ran))
    return {
        "processes": len(results),
        "lowering_s": med("lowering"),
        "compile_s": med("compile"),
        "first_s": med("first"),
        "steady_s": med("steady"),
        "first_minus_steady_s": statistics.median(r["first"] - r["steady"] for r in results),
        "first_max_s": max(r["first"] for r in results),
        "distinct_configs_per_call": configs,
        "tunings": sum(r["tuned"] for r in results),
        "best": results[0]["best"],
    }


def _decisions(root: Path, jaxlib_best: dict[str, str]) -> list[dict]:
    """Each decision `kernelcache tune` stored in ``root``, with the config jaxlib's runtime
    autotuning chose for the same call (``jaxlib_best``: the call's name -> config) and how
    much slower that config measured than the chosen one."""
    found = []
    for path in sorted(root.glob("*.decision")):
        d = json.loads(path.read_bytes())
        short = d["kernel"].rpartition(":")[2]
        theirs = next((c for name, c in jaxlib_best.items() if short in name), None)
        ours = d["configs"][d["chosen"]]
        slower = None
        if theirs in d["configs"]:
            t = d["times"][d["configs"].index(theirs)]
            slower = t / d["times"][d["chosen"]] - 1 if t is not None else None
        found.append(
            {
                "kernel": d["kernel"],
                "chosen": ours,
                "jaxlib": theirs,
                "same": theirs == ours,
                "slower": slower,
                "noise": d["noise"],
                "within_noise": theirs == ours
                or (slower is not None and slower <= max(d["noise"] or 0, 0.02)),
                "configs_measured": sum(1 for n in d.get("launches", []) if n),
                "launches": sum(d.get("launches", [])),
                "spent_s": d.get("spent"),
                "wall_s": d.get("wall") or 0.0,
                "by": sorted(set(d.get("by", []))),
            }
        )
    return found


def spread(root: Path, manifest: Path, args: argparse.Namespace) -> None:
    """Decide the model's calls with `tune --gpus 1` and `--gpus N` in turn, three times each:
    the seconds deciding took (the decisions' wall time, summed over the calls)."""
    took: dict[int, list[float]] = {1: [], args.spread: []}
    for _ in range(3):
        for gpus in took:
            cmd = [sys.executable, str(Path(__file__)), "--tune", str(manifest)]
            done = subprocess.run(
                [*cmd, "--gpus", str(gpus)],
                env=environ(root, "runtime"),
                capture_output=True,
                text=True,
            )
            if done.returncode != 0:
                raise SystemExit(f"kernelcache tune failed:\n{done.stderr[-4000:]}")
            made = _decisions(root, {})
            took[gpus].append(sum(d["wall_s"] for d in made))
            print(
                f"--gpus {gpus}: {took[gpus][-1]:.3f} s on {sorted({b for d in made for b in d['by']})}"
            )
    one, many = statistics.median(took[1]), statistics.median(took[args.spread])
    print(f"median: --gpus 1 {one:.3f} s, --gpus {args.spread} {many:.3f} s: {one / many:.2f}x")
    emit_summary(
        {
            "benchmark": "autotune_spread",
            "size": args.size,
            "gpus": args.spread,
            "deciding_s": {str(k): v for k, v in took.items()},
            "speedup": one / many,
        },
        args.out,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--tune", metavar="MANIFEST", help=argparse.SUPPRESS)
    parser.add_argument("--size", type=int, default=8192, help="matmul M = N = K")
    parser.add_argument("--ctx", type=int, default=4096, help="attention sequence length")
    parser.add_argument("--heads", type=int, default=32, help="attention batch x heads")
    parser.add_argument("--procs", type=int, default=8, help="processes in a wave")
    parser.add_argument(
        "--spread",
        type=int,
        metavar="N",
        help="instead of the waves: decide with `tune --gpus 1` and `--gpus N` in turn (3 each)",
    )
    parser.add_argument("--gpus", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.child:
        child(args.size, args.ctx, args.heads)
        return
    if args.tune:  # what `kernelcache tune MANIFEST` runs, without needing the console script
        import kernelcache
        from bridge.cli import tune

        for result in tune.tune(args.tune, kernelcache.Cache(), force=True, gpus=args.gpus):
            print(result.line())
        return
    work = Path(tempfile.mkdtemp(prefix="kc-autotune-"))
    root, manifest = work / "root", work / "manifest.jsonl"
    try:
        t = time.perf_counter()
        launch(1, environ(root, "runtime", KERNELCACHE_RECORD=str(manifest)), args)
        prepare = time.perf_counter() - t
        if args.spread:
            spread(root, manifest, args)
            return
        rows: dict[str, dict] = {}
        rows["runtime alone"] = summarize(launch(1, environ(root, "runtime"), args))
        rows["runtime wave"] = summarize(launch(args.procs, environ(root, "runtime"), args))
        job_root = work / "job-root"
        shutil.copytree(root, job_root)
        t = time.perf_counter()
        tune = subprocess.run(
            [sys.executable, str(Path(__file__)), "--tune", str(manifest)],
            env=environ(root, "runtime"),
            capture_output=True,
            text=True,
        )
        tune_s = time.perf_counter() - t
        if tune.returncode != 0:
            raise SystemExit(f"kernelcache tune failed:\n{tune.stdout}\n{tune.stderr[-4000:]}")
        decided = _decisions(root, rows["runtime alone"]["best"])
        rows["decided alone"] = summarize(launch(1, environ(root, "decided"), args))
        rows["decided wave"] = summarize(launch(args.procs, environ(root, "decided"), args))
        rows["job wave"] = summarize(launch(args.procs, environ(job_root, "job"), args))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    deciding = sum(d["wall_s"] for d in decided)
    jaxlib_s = rows["runtime alone"]["first_minus_steady_s"]
    print(
        f"prepare (record, compile every variant): {prepare:.1f} s; kernelcache tune: "
        f"{tune_s:.1f} s in all (process start, imports, replaying the records), of which "
        f"deciding {deciding:.3f} s; jaxlib's autotuning of the same configs (first - steady): "
        f"{jaxlib_s:.3f} s; ratio {deciding / jaxlib_s:.2f}"
    )
    print(tune.stdout.strip())
    for d in decided:
        slower = d["slower"]
        verdict = "same" if d["same"] else f"{100 * (slower or 0):.1f}% slower than ours"
        print(
            f"  {d['kernel']}: ours {d['chosen']!r}, jaxlib's {d['jaxlib']!r}: {verdict} "
            f"(noise {100 * (d['noise'] or 0):.1f}%); {d['configs_measured']} configs, "
            f"{d['launches']} launches, {d['wall_s']:.3f} s"
        )
    head = f"{'state':<15}{'procs':>6}{'first':>10}{'steady':>10}{'first-steady':>14}{'max first':>11}  configs  tunings"
    print(head)
    for name, row in rows.items():
        print(
            f"{name:<15}{row['processes']:>6}{row['first_s'] * 1e3:>8.1f}ms"
            f"{row['steady_s'] * 1e3:>8.2f}ms{row['first_minus_steady_s'] * 1e3:>12.1f}ms"
            f"{row['first_max_s'] * 1e3:>9.1f}ms  {row['distinct_configs_per_call']}  {row['tunings']}"
        )
    emit_summary(
        {
            "benchmark": "autotune_start",
            "size": args.size,
            "attention": {"ctx": args.ctx, "heads": args.heads, "dim": 64},
            "prepare_s": prepare,
            "tune_process_s": tune_s,
            "tune_s": deciding,
            "jaxlib_autotune_s": jaxlib_s,
            "tune_over_jaxlib": deciding / jaxlib_s,
            "decisions": decided,
            "states": rows,
        },
        args.out,
    )


if __name__ == "__main__":
    main()
