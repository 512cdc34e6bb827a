"""Across fresh processes: identical opaques (JAX's persistent cache keys on them), and a warm
kernel cache means no Triton compile at all. No process computes Triton's 0.3 s
``triton_key()``: the compiler's identity is a faster digest of the same files, memoized."""

from __future__ import annotations

import os
import shutil

import pytest
from bridge_helpers import COUNT_COMPILES, REPO, run_child

# Lowers a set of kernels for both vendors in every embedding; counts every way Triton could
# compile: the front end (ASTSource/GluonASTSource.make_ir), triton.compile and triton_key.
CHILD = (
    COUNT_COMPILES
    + r"""
import hashlib, json
import jax, jax.numpy as jnp
import kernelcache
from bridge.compile import compiler as bridge_compile
from bridge_helpers import custom_calls, lowered_module
from examples import kernels as K
from examples import ops

f32 = jax.ShapeDtypeStruct((4096,), jnp.float32)
bf = jax.ShapeDtypeStruct((256, 256), jnp.bfloat16)
cases = {
    "add/cuda/inline": (lambda x, y: ops.add(x, y, target="cuda:90", embed="inline"), (f32, f32), "cuda"),
    "add/cuda/ptx": (lambda x, y: ops.add(x, y, target="cuda:90", embed="ptx"), (f32, f32), "cuda"),
    "add/rocm/inline": (lambda x, y: ops.add(x, y, target="hip:gfx942", embed="inline"), (f32, f32), "rocm"),
    "add/rocm/path": (lambda x, y: ops.add(x, y, target="hip:gfx942", embed="path"), (f32, f32), "rocm"),
    "matmul/cuda": (lambda a, b: ops.matmul(a, b, target="cuda:90", embed="inline"), (bf, bf), "cuda"),
    "softmax/rocm": (lambda x: ops.softmax(x, target="hip:gfx90a", embed="inline"),
                     (jax.ShapeDtypeStruct((32, 300), jnp.float32),), "rocm"),
    "gluon/cuda": (lambda x: ops.gluon_scale(x, 2.0, warp_size=32, target="cuda:90", embed="inline"), (f32,), "cuda"),
    "gluon/rocm": (lambda x: ops.gluon_scale(x, 2.0, warp_size=64, target="hip:gfx942", embed="inline"), (f32,), "rocm"),
}
out = {}
for name, (fn, avals, platform) in cases.items():
    (call,) = custom_calls(lowered_module(fn, *avals, platform=platform))
    out[name] = hashlib.sha256(call["opaque"]).hexdigest()
print(json.dumps({"opaques": out, "counts": counts, "module_file": K.__file__,
                  "bridge_compiles": bridge_compile.compile_count(),
                  "stats": kernelcache.process_stats()}))
"""
)


@pytest.fixture(scope="module")
def cold(tmp_path_factory) -> tuple[str, dict]:
    """A root and what a process lowering :data:`CHILD`'s kernels into it, cold, found: the
    first process of each test below."""
    root = str(tmp_path_factory.mktemp("opaques") / "cache")
    return root, run_child(CHILD, KERNELCACHE_DIR=root)


def test_two_processes_identical_opaques_and_warm_start_compiles_nothing(cold):
    root, cold = cold
    warm = run_child(CHILD, KERNELCACHE_DIR=root)
    assert cold["opaques"] == warm["opaques"]
    assert len(set(cold["opaques"].values())) == len(cold["opaques"])
    # the first process compiled every kernel once: add x2 targets (each shared by two
    # embeddings), 4 matmul configs, softmax, Gluon x2
    assert cold["bridge_compiles"] == 9 and cold["counts"]["make_ir"] == 9
    assert cold["counts"]["triton_key"] == 0
    # the second compiled nothing and did not even hash Triton's sources
    assert warm["counts"] == {"make_ir": 0, "compile": 0, "triton_key": 0}
    assert warm["bridge_compiles"] == 0
    assert warm["stats"]["builds"] == 0 and warm["stats"]["misses"] == 0
    assert warm["stats"]["hits"] >= 9


def test_opaques_do_not_depend_on_where_the_sources_live(tmp_path, cold):
    """The same kernels imported from another directory, compiled into another cold cache,
    give byte-identical opaques: no absolute source path reaches the machine code or PTX, nor
    the time or size of the source files (ptxas reads both for the line table of a source file
    it finds, from its working directory: here the sources are found there, and differ in both)."""
    elsewhere = tmp_path / "checkout"
    shutil.copytree(REPO / "examples", elsewhere / "examples")
    copy = elsewhere / "examples" / "kernels.py"
    with open(copy, "a") as f:
        f.write("\n# a comment at the end: no kernel moves\n")
    os.utime(copy, (1_000_000_000, 1_000_000_000))
    _, here = cold
    there = run_child(
        CHILD,
        cwd=str(elsewhere),
        KERNELCACHE_DIR=str(tmp_path / "b"),
        PYTHONPATH=f"{elsewhere}:{REPO}",
    )
    assert there["module_file"].startswith(str(elsewhere))
    assert here["opaques"] == there["opaques"]


# A stand-in "torch" that records being imported. Triton's argument specializer imports torch
# in every process where it is installed (1 to 3 s); lowering through the bridge must not.
FAKE_TORCH = """
import os
with open(os.environ["TORCH_IMPORTED"], "a") as f:
    f.write("imported\\n")
class Tensor:
    pass
"""


def test_lowering_does_not_import_torch(tmp_path):
    fake = tmp_path / "site" / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(FAKE_TORCH)
    marker = tmp_path / "torch-imported"
    code = r"""
import json, sys
import jax, jax.numpy as jnp
from examples import ops
f32 = jax.ShapeDtypeStruct((4096,), jnp.float32)
jax.jit(lambda x, y: ops.add(x, y, target="cuda:90")).trace(f32, f32).lower(lowering_platforms=("cuda",))
print(json.dumps({"torch_in_modules": "torch" in sys.modules and sys.modules["torch"] is not None}))
"""
    out = run_child(
        code,
        PYTHONPATH=f"{REPO}:{tmp_path / 'site'}",
        TORCH_IMPORTED=str(marker),
        KERNELCACHE_DIR=str(tmp_path / "kc"),
    )
    assert not marker.exists(), "lowering imported torch"
    assert out["torch_in_modules"] is False
    # the stand-in is importable: a user's own `import torch` afterwards still works
    run_child(
        "import json, torch; from examples import ops; print(json.dumps({'ok': torch.Tensor is not None}))",
        PYTHONPATH=f"{REPO}:{tmp_path / 'site'}",
        TORCH_IMPORTED=str(marker),
    )
    assert marker.read_text() == "imported\n"
