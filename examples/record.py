"""Regenerate ``examples/manifest.jsonl``: lower the example ops with ``$KERNELCACHE_RECORD`` set.

    python -m examples.record                     # rewrites examples/manifest.jsonl
    python -m examples.record --out m.jsonl --target hip:gfx942

This is the record step of docs/warm.md on a small scale: a program lowers its kernels once with
``KERNELCACHE_RECORD`` naming a manifest, and ``kernelcache warm`` replays the manifest for every
target. Lowering needs no GPU: each op is traced with abstract arrays and lowered for the
target's platform. The kernels compile into a temporary cache that is thrown away; the manifest is
written to a temporary file and renamed over ``--out`` at the end, so it holds exactly this run's
records.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def workload() -> list[tuple[str, Callable[..., Any], tuple[Any, ...]]]:
    """(name, function of arrays, abstract arguments) of every example op recorded."""
    import jax
    import jax.numpy as jnp

    from examples import ops

    f32 = jax.ShapeDtypeStruct((4096,), jnp.float32)
    return [
        ("add", ops.add, (f32, f32)),
        ("softmax", ops.softmax, (jax.ShapeDtypeStruct((32, 300), jnp.float32),)),
        (
            "matmul (autotuned, 4 configs)",
            ops.matmul,
            (jax.ShapeDtypeStruct((256, 256), jnp.bfloat16),) * 2,
        ),
        ("gluon_scale (Gluon)", lambda x, **kw: ops.gluon_scale(x, 2.0, **kw), (f32,)),
    ]


def record(out: Path, target: str) -> int:
    """Lower every op of :func:`workload` for ``target``, recording into ``out``; returns the
    number of records written."""
    import jax

    import bridge

    platform = bridge.parse_target(target).platform
    out = out.resolve()
    with tempfile.TemporaryDirectory(prefix="kernelcache-record-") as tmp:
        partial = Path(tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp")[1])
        try:
            os.environ["KERNELCACHE_RECORD"] = str(partial)
            os.environ["KERNELCACHE_DIR"] = tmp
            for name, fn, avals in workload():
                print(f"lowering {name} for {target}", file=sys.stderr)

                def call(*args: Any, fn: Callable[..., Any] = fn) -> Any:
                    return fn(*args, target=target)

                jax.jit(call).trace(*avals).lower(lowering_platforms=(platform,))
            lines = len(partial.read_text().splitlines())
            os.replace(partial, out)
        finally:
            os.environ.pop("KERNELCACHE_RECORD", None)
            partial.unlink(missing_ok=True)
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m examples.record", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--out", type=Path, default=HERE / "manifest.jsonl", help="the manifest to write"
    )
    parser.add_argument(
        "--target", default="cuda:90", help="the target to record for (default cuda:90)"
    )
    args = parser.parse_args(argv)
    n = record(args.out, args.target)
    print(f"wrote {n} records to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
