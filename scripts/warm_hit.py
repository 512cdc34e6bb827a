"""The warm hit's walk: which project modules run code while a fresh process lowers one call
that the kernel cache already holds.

    .venv-test/bin/python scripts/warm_hit.py              # the table
    .venv-test/bin/python scripts/warm_hit.py --json out.json

A first process lowers ``examples/kernels.py``'s ``add_kernel`` through ``bridge.triton_call``
for cuda:90 on the CPU into a temporary cache root. A second, fresh process does its imports
(jax, triton, and ``from bridge import triton_call``, as a user's program does: the bridge
imports its API lazily, on that first touch of ``bridge.triton_call``), builds the same jitted
function, then traces and lowers it once under :func:`sys.setprofile` (every thread too; the
window of ``benchmarks/warm_lowering.py``), and records each project module (``kernelcache``,
``bridge`` and their submodules, by the ``__name__`` of the running code's globals) in which a
Python function ran: a module imported lazily during the lowering counts, since its code runs. The lowering must hit (no Triton compile): the probe fails if the
second process compiled.

The measure is the number of distinct modules (``count``) and their names, grouped by folder;
the JSON also has each function that ran (``module:qualname``, `` [import]`` when it ran below a
module's body, that is for an import) and how many times it was called, the modules that ran
only to be imported (``imported_only``), and every project module the process had imported once
the lowering was done (``loaded``: what it imported for the hit, whether code of it ran or not).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PROJECT = ("kernelcache", "bridge")
#: the most project modules a warm hit may run code in (held by tests/system/test_warm_hit.py;
#: lowered as the walk gets shorter, never raised)
BOUND = 36

PROGRAM = """
import json, os, sys, threading
import jax, jax.numpy as jnp, triton
from bridge import triton_call
sys.path.insert(0, {repo!r})
from examples import kernels as K

def fn(x, y):
    return triton_call(
        x, y, x.size, kernel=K.add_kernel, out_shape=x,
        grid=(triton.cdiv(x.size, 256),), BLOCK=256,
    )

x = jnp.ones((1024,), jnp.float32)
jitted = jax.jit(fn)
seen = {{}}

def profile(frame, event, arg):
    if event == "call":
        name = frame.f_globals.get("__name__", "")
        if name.split(".")[0] in {project!r}:
            where = name + ":" + frame.f_code.co_qualname
            up = frame
            while up is not None:  # below a module's body: an import's work
                if up.f_code.co_name == "<module>" and up.f_globals.get("__name__") != "__main__":
                    where += " [import]"
                    break
                up = up.f_back
            seen[where] = seen.get(where, 0) + 1

if {probe!r}:
    threading.setprofile(profile)
    sys.setprofile(profile)
jitted.trace(x, x).lower(lowering_platforms=("cuda",))
sys.setprofile(None)
threading.setprofile(None)
loaded = sorted(m for m in sys.modules if m.split(".")[0] in {project!r})
print(json.dumps({{"functions": seen, "loaded": loaded}}))
"""


def _lower(root: Path, probe: bool) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KERNELCACHE_")}
    env.update(
        KERNELCACHE_DIR=str(root),
        KERNELCACHE_TARGET="cuda:90",
        JAX_PLATFORMS="cpu",
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH", "")])),
    )
    source = PROGRAM.format(repo=str(REPO), project=PROJECT, probe=probe)
    done = subprocess.run(
        [sys.executable, "-c", source],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if done.returncode:
        raise SystemExit(f"the lowering failed:\n{done.stdout}{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _files(root: Path) -> set[str]:
    return {p.name for p in root.rglob("*") if p.is_file()}


def measure() -> dict:
    """The modules of one warm hit, in a fresh process after a first one filled the cache."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "cache"
        _lower(root, probe=False)
        before = _files(root)
        result = _lower(root, probe=True)
        written = sorted(_files(root) - before)
    functions = result["functions"]
    modules = sorted({where.split(":")[0] for where in functions})
    called = sorted({w.split(":")[0] for w in functions if not w.endswith(" [import]")})
    if any(name.endswith((".cubin", ".hsaco")) for name in written):
        raise SystemExit(f"the second lowering compiled (it wrote {written}): not a warm hit")
    folders: dict[str, int] = {}
    for name in modules:
        parts = name.split(".")
        folder = ".".join(parts[:2]) if len(parts) > 2 else parts[0]
        folders[folder] = folders.get(folder, 0) + 1
    return {
        "count": len(modules),
        "modules": modules,
        "imported_only": sorted(set(modules) - set(called)),
        "folders": folders,
        "functions": dict(sorted(functions.items())),
        "written": written,
        "loaded": result["loaded"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, help="also write the measure to this file")
    args = parser.parse_args()
    measured = measure()
    for folder, n in sorted(measured["folders"].items(), key=lambda kv: (-kv[1], kv[0])):
        print(f"{n:4d}  {folder}")
    print(f"{measured['count']:4d}  project modules ran code during one warm hit")
    print(f"{len(measured['imported_only']):4d}  of them only to be imported")
    if args.json:
        args.json.write_text(json.dumps(measured, indent=2) + "\n")


if __name__ == "__main__":
    main()
