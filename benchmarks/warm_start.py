"""Warm start of JAX programs with Triton kernels: the bridge against jax-triton (0.3.1, 0.4.1).

Every measurement is one fresh process: import, lowering (where Triton kernels are compiled or
fetched), XLA compile, first call. Two models: "small" (a vector add and a bf16 matmul
autotuned over 4 configs: 5 kernel variants) and "large" (21 kernel variants). States:

  peer     each jax-triton given with --peer, JAX cache off / JAX cache warm
  bridge   kernel cache cold/warm x JAX persistent cache cold/warm, embed=auto
  ptx      bridge with embed="ptx" (PTX compiled by ptxas inside XLA compile), kernel cache warm

Peers and bridge variants run in their own environments, so that each can use the Triton it
needs in the same run: ``--peer LABEL=PATHS`` and ``--bridge LABEL=PATHS`` put PATHS (separated
by ':') first on that variant's PYTHONPATH (e.g. a folder holding one jax-triton release, and a
folder holding another Triton); ``--env LABEL:NAME=VALUE`` sets a variable for one variant.
Without --peer, an importable ``jax_triton`` is the one peer ("peer").

Prints a table and, last, one JSON line (medians, and ratios against every peer measured in the
same run); ``--out FILE`` also writes that JSON.

    python benchmarks/warm_start.py --repeats 3 --out warm_start.json
    python benchmarks/warm_start.py --peer jax-triton-0.3.1=/tmp/jt031 \
        --peer jax-triton-0.4.1=/tmp/jt041:/tmp/triton-3.9.0 --bridge bridge=  \
        --bridge bridge-triton-3.9=/tmp/triton-3.9.0 --out warm_start.json
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

from common import emit_summary

REPO = Path(__file__).resolve().parent.parent
PHASES = ("import", "lower", "compile", "first_call")
DRY_RUN = False


# -- the model: shared with benchmarks/job_start.py ---------------------------------------
def make_model(triton_call, model: str, extra: dict) -> tuple:
    """The jitted function of ``model`` ("small": 5 kernel variants, "large": 21) calling its
    kernels through ``triton_call`` (the bridge's or jax-triton's) with ``extra`` keywords,
    and its arguments. The first output is ``x + x`` for the first argument ``x``."""
    import jax
    import jax.numpy as jnp
    import triton

    from examples import kernels as K

    def add(x, y, block):
        return triton_call(
            x,
            y,
            x.size,
            kernel=K.add_kernel,
            out_shape=x,
            grid=(triton.cdiv(x.size, block),),
            BLOCK=block,
            **extra,
        )

    def matmul(a, b):
        (m, k), (_, n) = a.shape, b.shape
        return triton_call(
            a,
            b,
            m,
            n,
            k,
            kernel=K.matmul_kernel,
            out_shape=jax.ShapeDtypeStruct((m, n), jnp.bfloat16),
            grid=lambda meta: (triton.cdiv(m, meta["BM"]), triton.cdiv(n, meta["BN"])),
            **extra,
        )

    def softmax(x, block):
        rows, cols = x.shape
        return triton_call(
            x,
            cols,
            cols,
            kernel=K.softmax_kernel,
            out_shape=x,
            grid=(rows,),
            BLOCK=block,
            num_warps=4,
            **extra,
        )

    def copy(x):
        return triton_call(
            x,
            x.size,
            kernel=K.heuristic_copy_kernel,
            out_shape=x,
            grid=(triton.cdiv(x.size, 256),),
            BLOCK=256,
            **extra,
        )

    key = jax.random.PRNGKey(0)
    f32 = jax.random.normal(key, (1 << 20,), jnp.float32)
    a = jax.random.normal(key, (2048, 1024), jnp.float32).astype(jnp.bfloat16)
    b = jax.random.normal(key, (1024, 2048), jnp.float32).astype(jnp.bfloat16)
    if model == "small":
        fn = lambda x, a, b: (add(x, x, 1024), matmul(a, b))  # noqa: E731
        args = (f32, a, b)
    else:
        h16, bf = f32.astype(jnp.float16), f32.astype(jnp.bfloat16)
        a16, b16 = a.astype(jnp.float16), b.astype(jnp.float16)
        rows = [jax.random.normal(key, (512, c), jnp.float32) for c in (100, 300, 700, 1500, 3000)]
        odd = f32[:1000]

        def fn(x, h, bf, a, b, a16, b16, odd, *rows):
            outs = [add(v, v, blk) for v in (x, h, bf) for blk in (512, 1024)]  # 6
            outs += [matmul(a, b), matmul(a16, b16)]  # 8
            outs += [softmax(r, triton.next_power_of_2(r.shape[1])) for r in rows]  # 5
            outs += [copy(x), copy(odd)]  # 2 (a heuristic picks EVEN)
            return outs

        args = (f32, h16, bf, a, b, a16, b16, odd, *rows)
    return fn, args


def use_jax_cache(directory: str | None) -> list[str]:
    """Turn on JAX's persistent cache in ``directory`` (every compile is stored) when given;
    returns the list that JAX's cache-hit events are appended to from now on."""
    import jax

    if directory:
        jax.config.update("jax_compilation_cache_dir", directory)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    hits: list[str] = []
    jax.monitoring.register_event_listener(
        lambda event, **kw: (
            hits.append(event) if event == "/jax/compilation_cache/cache_hits" else None
        )
    )
    return hits


# -- the child: one fresh process, one measurement ---------------------------------------
def child(impl: str, model: str, embed: str | None, jax_cache: str | None, dry_run: bool) -> None:
    t0 = time.perf_counter()
    import jax
    import jax.numpy as jnp

    if impl != "bridge":
        import jax_triton

        triton_call = jax_triton.triton_call
        extra: dict = {}
    else:
        import bridge

        triton_call = bridge.triton_call
        extra = {"embed": embed} if embed else {}
    import triton  # counted in the import phase

    from examples import kernels  # noqa: F401

    t_import = time.perf_counter() - t0
    hits = use_jax_cache(jax_cache)

    fn, args = make_model(triton_call, model, extra)
    jax.block_until_ready(args)
    hits.clear()  # count only the model's compilation, not the inputs'
    if dry_run:  # no GPU: lower for CUDA only (checks the script, not the speed)
        t1 = time.perf_counter()
        jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",))
        t2 = t3 = t4 = time.perf_counter()
        ok = True
    else:
        t1 = time.perf_counter()
        lowered = jax.jit(fn).lower(*args)
        t2 = time.perf_counter()
        compiled = lowered.compile()
        t3 = time.perf_counter()
        out = compiled(*args)
        jax.block_until_ready(out)
        t4 = time.perf_counter()
        ok = bool(jnp.array_equal(out[0], args[0] + args[0]))
    compiles = None
    if impl == "bridge":
        try:
            from bridge.compile import compiler as bridge_compile
        except ImportError:  # a bridge from before the stage folders
            from bridge import compile as bridge_compile  # type: ignore[no-redef]

        compiles = bridge_compile.compile_count()
    print(
        json.dumps(
            {
                "triton": triton.__version__,
                "import": t_import,
                "lower": t2 - t1,
                "compile": t3 - t2,
                "first_call": t4 - t3,
                "jax_cache_hits": len(hits),
                "kernel_compiles": compiles,
                "ok": ok,
            }
        )
    )


# -- the parent: states, repeats, table ---------------------------------------------------
class Variant:
    """A peer or a bridge in its own environment: extra PYTHONPATH entries and variables."""

    def __init__(self, impl: str, label: str, paths: str = "") -> None:
        self.impl, self.label = impl, label
        self.paths = [p for p in paths.split(os.pathsep) if p]
        self.env: dict[str, str] = {}


def run(
    variant: Variant,
    model: str,
    *,
    embed: str | None = None,
    kernels: str | None = None,
    jax_cache: str | None = None,
) -> dict:
    impl = variant.impl
    cmd = [
        sys.executable,
        __file__,
        "--child",
        impl,
        model,
        embed or "-",
        jax_cache or "-",
        "dry" if DRY_RUN else "run",
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("KERNELCACHE_")}
    env["PYTHONPATH"] = os.pathsep.join([*variant.paths, str(REPO), env.get("PYTHONPATH", "")])
    env.update(variant.env)
    if kernels:
        env["KERNELCACHE_DIR"] = kernels
    if DRY_RUN:
        env["KERNELCACHE_TARGET"] = "cuda:90"
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=str(REPO))
    if proc.returncode != 0:
        raise SystemExit(f"{variant.label}/{model} failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def peer_available() -> bool:
    probe = subprocess.run([sys.executable, "-c", "import jax_triton"], capture_output=True)
    return probe.returncode == 0


def measure(
    model: str, repeats: int, work: Path, peers: list[Variant], bridges: list[Variant]
) -> dict[str, list[dict]]:
    results: dict[str, list[dict]] = {}

    def fresh(name: str) -> str:
        path = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=work))
        return str(path)

    def add(state: str, r: dict) -> None:
        results.setdefault(state, []).append(r)
        print(
            f"  {model:5} {state:40} "
            + " ".join(f"{p}={r[p]:.3f}" for p in PHASES)
            + f" hits={r['jax_cache_hits']} compiles={r['kernel_compiles']} ok={r['ok']}",
            flush=True,
        )

    for peer in peers:
        for _ in range(repeats):
            add(f"{peer.label}, JAX cache off", run(peer, model))
        jc = fresh("peer-jax")
        run(peer, model, jax_cache=jc)  # populate
        for _ in range(repeats):
            add(f"{peer.label}, JAX cache warm", run(peer, model, jax_cache=jc))
    for b in bridges:
        name = b.label
        warm_kernels = fresh("kernels")
        run(b, model, kernels=warm_kernels)  # populate the kernel cache
        warm_jax = fresh("jax")
        run(b, model, kernels=warm_kernels, jax_cache=warm_jax)  # populate JAX's cache
        for _ in range(repeats):
            add(
                f"{name}, kc cold, jax cold",
                run(b, model, kernels=fresh("kc"), jax_cache=fresh("jc")),
            )
            add(
                f"{name}, kc warm, jax cold",
                run(b, model, kernels=warm_kernels, jax_cache=fresh("jc")),
            )
            add(
                f"{name}, kc cold, jax warm",
                run(b, model, kernels=fresh("kc"), jax_cache=warm_jax),
            )
            add(
                f"{name}, kc warm, jax warm",
                run(b, model, kernels=warm_kernels, jax_cache=warm_jax),
            )
            add(
                f"{name} ptx, kc warm, jax cold",
                run(b, model, embed="ptx", kernels=warm_kernels, jax_cache=fresh("jc")),
            )
    return results


def medians(rows: list[dict]) -> dict:
    return {p: statistics.median(r[p] for r in rows) for p in PHASES}


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        _, _, impl, model, embed, jax_cache, dry = sys.argv
        child(
            impl,
            model,
            None if embed == "-" else embed,
            None if jax_cache == "-" else jax_cache,
            dry == "dry",
        )
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--models", default="small,large")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--keep", action="store_true", help="keep the temporary caches")
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="no GPU: only lower for cuda:90 (checks the script, not the speed)",
    )
    parser.add_argument(
        "--peer",
        action="append",
        default=[],
        metavar="LABEL=PATHS",
        help="a jax-triton to compare with: its label, and PYTHONPATH entries holding it",
    )
    parser.add_argument(
        "--bridge",
        action="append",
        default=[],
        metavar="LABEL=PATHS",
        help="the bridge in an environment (default: 'bridge' as installed)",
    )
    parser.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="LABEL:NAME=VALUE",
        help="an environment variable for one peer or bridge variant",
    )
    args = parser.parse_args()
    global DRY_RUN
    DRY_RUN = args.dry_run

    def variants(impl: str, specs: list[str]) -> list[Variant]:
        return [Variant(impl, *spec.split("=", 1)) for spec in specs]

    peers = variants("peer", args.peer)
    if not args.peer and peer_available():
        peers = [Variant("peer", "peer")]
    if DRY_RUN or not peers:
        peers = []
        print("note: no peer rows (pass --peer LABEL=PATHS, e.g. a folder with jax-triton 0.4.1)")
    bridges = variants("bridge", args.bridge) or [Variant("bridge", "bridge")]
    by_label = {v.label: v for v in (*peers, *bridges)}
    for spec in args.env:
        label, _, assignment = spec.partition(":")
        name, _, value = assignment.partition("=")
        if label not in by_label:
            parser.error(f"--env {spec}: no peer or bridge is labelled {label!r}")
        by_label[label].env[name] = value
    work = Path(tempfile.mkdtemp(prefix="warm-start-"))
    summary: dict = {"repeats": args.repeats, "models": {}}
    try:
        for model in args.models.split(","):
            print(f"model {model}:", flush=True)
            res = measure(model, args.repeats, work, peers, bridges)
            summary["models"][model] = {state: medians(rows) for state, rows in res.items()}
            summary["models"][model]["_checks"] = {
                state: {
                    "ok": all(r["ok"] for r in rows),
                    "jax_cache_hits": [r["jax_cache_hits"] for r in rows],
                    "kernel_compiles": [r["kernel_compiles"] for r in rows],
                    "triton": sorted({r["triton"] for r in rows}),
                }
                for state, rows in res.items()
            }
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)

    print()
    print(f"{'model':6} {'state':42} " + " ".join(f"{p:>11}" for p in PHASES) + f" {'total':>8}")
    for model, states in summary["models"].items():
        for state, m in states.items():
            if state.startswith("_"):
                continue
            total = sum(m[p] for p in PHASES)
            print(
                f"{model:6} {state:42} "
                + " ".join(f"{m[p]:11.3f}" for p in PHASES)
                + f" {total:8.3f}"
            )
    ratios: dict = {}

    def total(m: dict) -> float:
        return sum(m[p] for p in PHASES)

    for model, states in summary["models"].items():
        r: dict = {}
        for b in bridges:
            warm = states[f"{b.label}, kc warm, jax warm"]
            inline = states[f"{b.label}, kc warm, jax cold"]
            ptx = states[f"{b.label} ptx, kc warm, jax cold"]
            mine: dict = {
                "xla_compile_ptx_over_inline": (
                    ptx["compile"] / inline["compile"] if inline["compile"] else None
                ),
                "warm_lower_s": warm["lower"],
            }
            for peer in peers:
                theirs = states[f"{peer.label}, JAX cache warm"]
                mine[f"vs {peer.label}"] = {
                    "lower_speedup": theirs["lower"] / warm["lower"],
                    "total_speedup": total(theirs) / total(warm),
                    "lower_speedup_kc_warm_jax_cold_vs_peer_jax_off": (
                        states[f"{peer.label}, JAX cache off"]["lower"] / inline["lower"]
                    ),
                }
            r[b.label] = mine
        ratios[model] = r
    summary["ratios"] = ratios
    if ratios:
        print()
        for model, per_bridge in ratios.items():
            for label, mine in per_bridge.items():
                for peer_label, vs in mine.items():
                    if peer_label.startswith("vs "):
                        print(
                            f"{model:6} {label} {peer_label}: warm lowering "
                            f"{vs['lower_speedup']:.1f}x, whole process {vs['total_speedup']:.2f}x"
                        )
    print()
    emit_summary(summary, args.out)


if __name__ == "__main__":
    main()
