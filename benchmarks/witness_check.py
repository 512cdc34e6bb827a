"""The frontend as witness: what checking a cached kernel's read set costs, per kernel.

Lowers ``benchmarks/warm_start.py``'s "large" model (21 kernel variants) for cuda:90 into a
fresh cache root (no GPU needed), then, for every kernel entry, times the check a lowering makes
before it uses the entry (every read of its read set made again in this process:
``bridge.readsets.read_sets.stale``) against the floor of the same run, a bare read of the entry's
metadata file (what any hit costs at least). Prints a table (median over ``--repeats`` checks of
each kernel: microseconds, reads, ratio to the floor), then one JSON line; ``--out FILE`` also
writes it.

    python benchmarks/witness_check.py --repeats 200 --out witness_check.json
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from common import emit_summary

REPO = Path(__file__).resolve().parent.parent


def _timed(fn, repeats: int) -> float:
    """The median time of ``fn()`` in microseconds."""
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(samples)


def _checker(read_sets, text: str, kernel, backend):
    """The check a lowering makes of ``text`` before it uses the entry: a read set that ends
    with the IR read is checked for the specialization it was recorded for (the lookup's own;
    a tree whose check takes no specialization checks it as it is)."""
    rows = read_sets.parse(text) or ()
    if rows and rows[-1][1] == "ir" and hasattr(read_sets, "reads_ir"):
        made = rows[-1][2]
        return functools.partial(
            read_sets.stale, [text], kernel, {}, backend, expected=lambda: [made]
        )
    return functools.partial(read_sets.stale, [text], kernel, {}, backend)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=200, help="checks of each kernel")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix="witness-check-")
    os.environ.update(KERNELCACHE_DIR=root, KERNELCACHE_TARGET="cuda:90", JAX_PLATFORMS="cpu")
    sys.path[:0] = [str(REPO), str(REPO / "benchmarks")]
    import jax
    from warm_start import make_model

    import bridge
    from bridge.identity import static_reads
    from bridge.readsets import read_sets
    from bridge.vendors import backends
    from bridge.vendors.targets import parse_target

    fn, model_args = make_model(bridge.triton_call, "large", {})
    jax.jit(fn).trace(*model_args).lower(lowering_platforms=("cuda",))
    backend = backends.make_backend(parse_target("cuda:90"))
    rows = []
    for path in sorted(Path(root).glob("*.json")):
        meta = json.loads(path.read_text())
        text = meta.get("reads")
        if meta.get("ext") != "cubin" or not isinstance(text, str):
            continue
        module, _, qualname = meta["kernel"].partition(":")
        kernel = importlib.import_module(module)
        for part in qualname.split("."):
            kernel = getattr(kernel, part)
        while not static_reads.is_jit(kernel):  # (an autotuner's or heuristics' kernel)
            kernel = kernel.fn
        check_once = _checker(read_sets, text, kernel, backend)
        found = check_once()  # (a Verdict; None where a bridge before it found them fresh)
        assert found is None or getattr(found, "fresh", False), meta["kernel"]
        check = _timed(check_once, args.repeats)
        floor = _timed(path.read_bytes, args.repeats)
        reads = len(read_sets.parse(text) or ())
        rows.append(
            {"kernel": meta["kernel"], "reads": reads, "check_us": check, "floor_us": floor}
        )
    print(f"{'kernel':48} {'reads':>5} {'check µs':>9} {'read µs':>8} {'ratio':>6}")
    for r in rows:
        ratio = r["check_us"] / r["floor_us"]
        print(
            f"{r['kernel'][-48:]:48} {r['reads']:5d} {r['check_us']:9.1f} {r['floor_us']:8.1f} {ratio:6.2f}"
        )
    summary = {
        "kernels": len(rows),
        "reads_median": statistics.median(r["reads"] for r in rows),
        "check_us_median": statistics.median(r["check_us"] for r in rows),
        "check_us_per_read": statistics.median(r["check_us"] / max(r["reads"], 1) for r in rows),
        "floor_us_median": statistics.median(r["floor_us"] for r in rows),
        "rows": rows,
    }
    emit_summary(summary, args.out)


if __name__ == "__main__":
    main()
