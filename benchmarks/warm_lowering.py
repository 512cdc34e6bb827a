"""Warm lowering: the first lowering of a JAX program in a fresh process, every kernel cached.

Each measurement is one fresh process that imports jax, triton and the bridge, builds
``benchmarks/warm_start.py``'s "small" (5 kernel variants) or "large" (21) model, and times
``jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",))`` with
``KERNELCACHE_TARGET=cuda:90`` against a kernel cache that a first process filled (so no Triton
compile runs: what is timed is tracing, binding and keying every variant, reading the cache and
building the custom calls). No GPU is needed.

The floor, measured in the same run: the same program with every ``triton_call`` replaced by one
plain ``jax.ffi.ffi_call`` of the same outputs with a small fixed backend config, which is JAX's
own cost of tracing and lowering that program; no bridge can lower it faster. The table shows
each bridge's ratio to it.

The "+import" column adds the bridge's import (``import bridge`` and its ``triton_call``,
timed before the window) to the window: what a process pays for its first lowering. A module
the bridge imports on first use (the autotuner's, for an autotuned call) counts in the window
when it is lazy and in the import when it is not; this column compares the two alike.

Where the garbage collector runs is set per sample, not left to the imports before the
window: each process makes a full collection and then holds that sample's number of objects
(0 to 6999, the same for every bridge and the floor), so the window starts at that point of the
cycles of generations 0 and 1 (a collection of generation 1 costs about 1 ms with JAX loaded; a
fixed phase puts one inside every window of one program and none in another's). The JSON has
the collections each window saw.

With ``--partial``, the same models are measured once more with every read set *partial*
(ending with the IR, as one that found a value with no description by content does): the
frontend runs for every variant of every call on each warm lowering, so the row says what a
partial read set costs on a warm hit against a complete one ("partial" against "now").
With ``--unchecked``, once more with every stored read set taken as fresh without reading it:
not a way the bridge can run (a stale or forged read set would be served), only what the
read-set checks cost in the window ("unchecked" against "now").

The second table splits this bridge's window: its own share (``triton_call`` at trace and its
lowering rule, timed around them in the measured process) and the rest, JAX's tracing and
lowering of the program around the calls; "bridge may" is what the bridge's share may be for
the window to stay within 1.5 times the floor, JAX's share being what it is.

With ``--before REF_OR_DIR`` an older bridge (a directory, or a git ref exported with
``git archive``) is measured in the same run, its processes interleaved with this one's. Prints a
table (median and min over ``--repeats`` processes), then one JSON line; ``--out FILE`` also
writes it.

    python benchmarks/warm_lowering.py --repeats 10 --before main --out warm_lowering.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from common import emit_summary, export

REPO = Path(__file__).resolve().parent.parent
MODELS = ("small", "large")
CHILD = r"""
import gc, json, sys, time
sys.path.insert(0, "benchmarks")
import jax, triton
t_import = time.perf_counter()  # what the bridge costs a process before its first call
import bridge
bridge.triton_call
t_import = time.perf_counter() - t_import
from warm_start import make_model

def floor_call(*args, kernel, out_shape, grid, **kw):
    # one custom call with the same outputs: what JAX itself spends on a call
    arrays = [a for a in args if isinstance(a, jax.Array) or hasattr(a, "aval")]
    shapes = jax.tree_util.tree_leaves(out_shape)
    outs = [jax.ShapeDtypeStruct(s.shape, s.dtype) for s in shapes]
    result = jax.ffi.ffi_call("kernelcache_floor", outs)(*arrays, opaque=b"x" * 64)
    return result[0] if len(result) == 1 else tuple(result)

if sys.argv[2] == "partial":  # every read set partial (see the module docstring)
    from bridge.readsets import witness

    _made = witness.Recorder.__init__

    def _partial(self, *args, **kwargs):
        _made(self, *args, **kwargs)
        self.missed("measured as partial")

    witness.Recorder.__init__ = _partial
if sys.argv[2] == "unchecked":  # every read set taken as fresh unread (see the docstring)
    from bridge.readsets import read_sets

    fresh = read_sets.Verdict("fresh") if hasattr(read_sets, "Verdict") else None  # (earlier: None)
    read_sets.stale = lambda *args, **kwargs: fresh
# the bridge's share of the window: triton_call at trace and the lowering rule's two steps
spent = [0.0]

def timed(run):
    def timed_run(*args, **kwargs):
        t = time.perf_counter()
        try:
            return run(*args, **kwargs)
        finally:
            spent[0] += time.perf_counter() - t
    return timed_run

call = floor_call if sys.argv[2] == "floor" else timed(bridge.triton_call)
try:
    from bridge.lowering import lower as bridge_lower
    steps = [bridge_lower._scoped_setup, bridge_lower._lower_with]
except (ImportError, AttributeError):  # an older bridge: its share is not told
    spent = None
if spent is not None and sys.argv[2] != "floor":
    bridge_lower._scoped_setup, bridge_lower._lower_with = map(timed, steps)
fn, args = make_model(call, sys.argv[1], {})
jax.block_until_ready(args)
# the collector's phase: a full collection, then this sample's number of live objects (the
# same for every bridge and the floor), so the window starts where the sample says in the
# cycles of generations 0 and 1 instead of where the imports before it happened to leave it
gc.collect()
phase = [[] for _ in range(int(sys.argv[3]))]
collections = [0, 0, 0]
gc.callbacks.append(lambda p, info: p == "start" and collections.__setitem__(
    info["generation"], collections[info["generation"]] + 1))
t0 = time.perf_counter()
jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",))
t1 = time.perf_counter()
try:
    from bridge.compile import compiler as bridge_compile
except ImportError:  # a bridge from before the stage folders
    from bridge import compile as bridge_compile
print(json.dumps({"lower_ms": (t1 - t0) * 1000, "import_ms": t_import * 1000,
                  "bridge_ms": None if spent is None or sys.argv[2] == "floor" else spent[0] * 1000,
                  "compiles": bridge_compile.compile_count(),
                  "protobuf": "google.protobuf" in sys.modules, "collections": collections}))
"""
#: objects that make one full cycle of generation 1 at CPython's default thresholds (700, 10)
GC_CYCLE = 7000


def run(root: Path, cache: str, model: str, kind: str = "bridge", phase: int = 0) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KERNELCACHE_")}
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # bytecode cached, as for an installed package
    env.update(
        # the bridge measured first; what the environment adds (carried packages) after it
        PYTHONPATH=os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH")])),
        KERNELCACHE_DIR=cache,
        KERNELCACHE_TARGET="cuda:90",
        JAX_PLATFORMS="cpu",
    )
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, model, kind, str(phase)],
        env=env,
        cwd=str(root),
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise SystemExit(f"the measuring process failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=10, help="processes per bridge and model")
    parser.add_argument("--before", help="an older checkout (directory) or git ref")
    parser.add_argument("--out", type=Path)
    parser.add_argument(
        "--partial",
        action="store_true",
        help="measure the models with every read set partial too",
    )
    parser.add_argument(
        "--unchecked",
        action="store_true",
        help="measure the models with every read set taken as fresh unread too (diagnostic)",
    )
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="warm-lowering-"))
    bridges = {"now": REPO}
    if args.before:
        bridges["before"] = export(args.before, work)
    extra = [k for k in ("partial", "unchecked") if getattr(args, k)]
    samples: dict[str, dict[str, list[dict]]] = {
        b: {m: [] for m in MODELS} for b in [*bridges, *extra, "floor"]
    }
    try:
        caches = {b: tempfile.mkdtemp(prefix="kc-", dir=work) for b in bridges}
        caches.update((kind, caches["now"]) for kind in extra)  # (the same entries, read)
        for label, root in bridges.items():  # fill the kernel cache, write the bytecode
            for model in MODELS:
                run(root, caches[label], model)
        if "partial" in extra:  # (its own entries: each read set ends with the IR)
            caches["partial"] = tempfile.mkdtemp(prefix="kc-", dir=work)
            for model in MODELS:
                run(REPO, caches["partial"], model, "partial")
        phases = random.Random(0).sample(range(GC_CYCLE), args.repeats)
        for phase in phases:
            for model in MODELS:
                samples["floor"][model].append(
                    run(REPO, caches["now"], model, "floor", phase=phase)
                )
                for label, root in bridges.items():
                    samples[label][model].append(run(root, caches[label], model, phase=phase))
                for kind in extra:
                    samples[kind][model].append(run(REPO, caches[kind], model, kind, phase=phase))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    results: dict = {}
    for label, by_model in samples.items():
        for model, rows in by_model.items():
            ms = [r["lower_ms"] for r in rows]
            # the bridge's import and the window: what a process pays for its first lowering
            paid = [r["lower_ms"] + (0 if label == "floor" else r["import_ms"]) for r in rows]
            results.setdefault(label, {})[model] = {
                "median_ms": round(statistics.median(ms), 1),
                "min_ms": round(min(ms), 1),
                "with_import_median_ms": round(statistics.median(paid), 1),
                "samples_ms": [round(v, 1) for v in ms],
                # the bridge's own share of the window (None: an older bridge, or the floor)
                "bridge_median_ms": _median([r.get("bridge_ms") for r in rows]),
                "kernel_compiles": max(r["compiles"] for r in rows),
                # garbage collections in the timed window, by generation, summed over samples
                "collections": [sum(r["collections"][g] for r in rows) for g in range(3)],
                "imports_protobuf": any(r["protobuf"] for r in rows),
            }
    summary = {
        "repeats": args.repeats,
        "before": args.before,
        "cpus": len(os.sched_getaffinity(0)),
        "load_average": os.getloadavg(),
        "results": results,
    }
    summary["over_floor"] = {
        label: {
            m: round(results[label][m]["median_ms"] / results["floor"][m]["median_ms"], 2)
            for m in MODELS
        }
        for label in [*bridges, *extra]
    }
    if "partial" in extra:
        summary["partial_over_now"] = {
            m: round(results["partial"][m]["median_ms"] / results["now"][m]["median_ms"], 2)
            for m in MODELS
        }
    summary["bridge_share"] = {m: _share(results, m) for m in MODELS}
    if "before" in results:
        summary["now_over_before"] = {
            m: round(results["now"][m]["median_ms"] / results["before"][m]["median_ms"], 2)
            for m in MODELS
        }
        summary["now_over_before_with_import"] = {
            m: round(
                results["now"][m]["with_import_median_ms"]
                / results["before"][m]["with_import_median_ms"],
                2,
            )
            for m in MODELS
        }
    print(
        f"{'bridge':8} {'model':6} {'median ms':>10} {'min ms':>8} {'x floor':>8} {'compiles':>9}"
        f" {'+import ms':>11}"
    )
    for label, by_model in results.items():
        for model, r in by_model.items():
            ratio = summary["over_floor"].get(label, {}).get(model)
            shown = f"{ratio:8.2f}" if ratio is not None else f"{'':8}"
            print(
                f"{label:8} {model:6} {r['median_ms']:10.1f} {r['min_ms']:8.1f} {shown} "
                f"{r['kernel_compiles']:9} {r['with_import_median_ms']:11.1f}"
            )
    print(f"load average: {os.getloadavg()[0]:.1f} on {summary['cpus']} CPUs")
    print()
    print(f"{'model':6} {'bridge ms':>10} {'JAX ms':>8} {'1.5x floor':>11} {'bridge may':>11}")
    for model, share in summary["bridge_share"].items():
        print(
            f"{model:6} {share['bridge_ms']:10.1f} {share['jax_ms']:8.1f} "
            f"{share['goal_ms']:11.1f} {share['bridge_may_ms']:11.1f}"
        )
    print()
    emit_summary(summary, args.out)


def _median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return round(statistics.median(known), 2) if len(known) == len(values) and known else None


def _share(results: dict, model: str) -> dict[str, float]:
    """This bridge's own share of the window (``triton_call`` at trace and its lowering rule),
    the rest (JAX's, tracing and lowering the program around the calls), and what the bridge
    may spend for the window to stay within 1.5 times the floor."""
    now, floor = results["now"][model], results["floor"][model]["median_ms"]
    ours = now["bridge_median_ms"] or 0.0
    jax_ms = now["median_ms"] - ours
    return {
        "bridge_ms": ours,
        "jax_ms": round(jax_ms, 2),
        "goal_ms": round(1.5 * floor, 2),
        "bridge_may_ms": round(1.5 * floor - jax_ms, 2),
    }


if __name__ == "__main__":
    main()
