"""Compiles that cannot take the job down, and the Gluon layout hint only for layout errors.

LLVM's own abort (a gfx950-only scaled MFMA lowered for gfx942: "Cannot select"), and a compile
stage replaced by one that aborts, segfaults, or is killed from outside: the lowering survives,
the config is left out and named, a crash is remembered (a second lowering compiles nothing) and
a kill is not. The compiler process is forked once per lowering, never for a warm one, and gets
kernels from ``__main__``, from an exec'd notebook-like module and from closures. Lowered for cuda:90, hip:gfx942 and hip:gfx950
on this CPU machine; on an NVIDIA GPU (``pytest -m gpu``), a crash beside GPU work.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import signal
import subprocess
import sys
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import triton
import triton.language as tl
from bridge_helpers import cuda_devices, decoded, forget_lowerings, kernels_of
from support import HELPERS, checked, child_env
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

import bridge
import kernelcache
from bridge.compile import fetch, variants
from bridge.lowering.configs import FETCHED
from bridge.vendors import backends

F32 = jax.ShapeDtypeStruct((4096,), jnp.float32)
TARGETS = [("cuda:90", "cuda"), ("hip:gfx942", "rocm"), ("hip:gfx950", "rocm")]
CRASHES = {
    "abort": (os.abort, "the compiler crashed (SIGABRT: Aborted)"),
    "segfault": (lambda: ctypes.string_at(0), "the compiler crashed (SIGSEGV: Segmentation fault)"),
}


@triton.jit
def scaled_copy(x_ptr, n, out_ptr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 3, mask=mask)


WARPS = [triton.Config({"BLOCK": 256}, num_warps=w) for w in (2, 4, 8)]
tuned_copy = triton.autotune(configs=WARPS, key=["n"])(scaled_copy)


@pytest.fixture(autouse=True)
def _fresh_warnings():
    """Each test sees the warnings about left-out configs as a fresh process would."""
    variants._warned.clear()


@pytest.fixture
def cache(tmp_path) -> kernelcache.Cache:
    return kernelcache.Cache(tmp_path / "root", readonly_roots=(), remote="")


@pytest.fixture
def attempts(monkeypatch) -> list[int]:
    """Every compile this process asks for (one per kernel-cache miss), its num_warps."""
    asked: list[int] = []
    real = fetch.compile_source

    def counted(src, target, backend, options):
        asked.append(options.num_warps)
        return real(src, target, backend, options)

    monkeypatch.setattr(fetch, "compile_source", counted)
    return asked


@pytest.fixture
def forks(monkeypatch) -> list[int]:
    """The processes forked by this one."""
    forked: list[int] = []
    real = os.fork

    def counted() -> int:
        with warnings.catch_warnings():  # JAX's warning, for a fork from here
            warnings.simplefilter("ignore", RuntimeWarning)
            pid = real()
        if pid:
            forked.append(pid)
        return pid

    monkeypatch.setattr(os, "fork", counted)
    return forked


def crash_at_llir(monkeypatch, target: str, crash, warps: int | None = None) -> None:
    """Make ``target``'s LLVM IR stage call ``crash()`` (for kernels of ``warps`` warps only,
    if given), where LLVM's own aborts happen."""
    backend = backends.make_backend(bridge.parse_target(target))
    add_stages = backend.add_stages

    def crashing_stages(stages, options, language):
        add_stages(stages, options, language)
        llir = stages["llir"]

        def crashing(module, metadata):
            if warps is None or options.num_warps == warps:
                crash()
            return llir(module, metadata)

        stages["llir"] = crashing

    monkeypatch.setattr(backend, "add_stages", crashing_stages)


def copy_call(kernel, cache, target, **kw):
    grid = lambda m: (triton.cdiv(m["n"], m["BLOCK"]),)  # noqa: E731
    return lambda x: bridge.triton_call(
        x, x.size, kernel=kernel, out_shape=x, grid=grid, target=target, cache=cache, **kw
    )


def lower_again(cache, kernel, target, platform, **kw):
    """Lower as a new process would: from the kernel entries, not this one's memos."""
    FETCHED.clear()
    forget_lowerings(cache.root)
    return decoded(copy_call(kernel, cache, target, **kw), F32, platform=platform)


# -- crashes ---------------------------------------------------------------------------------
@pytest.mark.parametrize("how", sorted(CRASHES))
@pytest.mark.parametrize("target, platform", TARGETS)
def test_a_crashing_compiler_fails_the_kernel_not_the_job(
    cache, attempts, monkeypatch, how, target, platform
):
    crash, said = CRASHES[how]
    crash_at_llir(monkeypatch, target, crash)
    with pytest.raises(bridge.NoConfigError) as info:
        decoded(copy_call(scaled_copy, cache, target, BLOCK=256), F32, platform=platform)
    assert f"no config of {__name__}:scaled_copy can run on {target}: {said}" in str(info.value)
    assert len(attempts) == 1
    (failure,) = Path(cache.root).glob("*.failure")
    assert said in failure.read_text()
    # remembered: a second lowering says the same; as the cache's word alone would leave the
    # call no config (a failure entry may be another writer's), it is compiled once more first
    with pytest.raises(bridge.NoConfigError, match=said.replace("(", r"\(").replace(")", r"\)")):
        lower_again(cache, scaled_copy, target, platform, BLOCK=256)
    assert len(attempts) == 2


@pytest.mark.parametrize("target, platform", TARGETS)
def test_a_config_whose_compiler_aborts_is_left_out_and_the_others_run(
    cache, attempts, forks, monkeypatch, caplog, target, platform
):
    caplog.set_level(logging.WARNING, logger="bridge")
    crash_at_llir(monkeypatch, target, os.abort, warps=4)
    (call,) = decoded(copy_call(tuned_copy, cache, target, embed="inline"), F32, platform=platform)
    assert [k.num_warps for k in kernels_of(call)] == [2, 8]
    assert all(k.module_image.object_file.startswith(b"\x7fELF") for k in kernels_of(call))
    (warning,) = [r.getMessage() for r in caplog.records if r.name == "bridge.compile.variants"]
    assert "left out 1 of its 3 configs" in warning
    assert "num_warps: 4" in warning and "the compiler crashed (SIGABRT: Aborted)" in warning
    assert sorted(attempts) == [2, 4, 8]
    assert len(forks) == 2  # one compiler process for the lowering, another after the crash
    assert len(list(Path(cache.root).glob("*.failure"))) == 1
    (again,) = lower_again(cache, tuned_copy, target, platform, embed="inline")
    assert [k.num_warps for k in kernels_of(again)] == [2, 8]
    assert sorted(attempts) == [2, 4, 8]  # nothing compiled again, the crash remembered
    assert len(forks) == 2


def test_a_compiler_killed_from_outside_is_left_out_but_not_remembered(
    cache, attempts, monkeypatch
):
    crash_at_llir(monkeypatch, "hip:gfx942", lambda: os.kill(os.getpid(), signal.SIGKILL))
    for tries in (1, 2):
        with pytest.raises(bridge.NoConfigError, match=r"was killed \(SIGKILL: Killed\)"):
            lower_again(cache, scaled_copy, "hip:gfx942", "rocm", BLOCK=256)
        assert len(attempts) == tries  # out of memory, say: tried again next time
    assert not list(Path(cache.root).glob("*.failure"))


def test_one_compiler_process_per_lowering_and_none_for_a_warm_one(cache, attempts, forks):
    (call,) = decoded(copy_call(tuned_copy, cache, "hip:gfx950"), F32, platform="rocm")
    assert len(kernels_of(call)) == 3 and len(attempts) == 3 and len(forks) == 1
    (again,) = lower_again(cache, tuned_copy, "hip:gfx950", "rocm")
    assert again == call and len(attempts) == 3 and len(forks) == 1


@pytest.mark.gpu
@pytest.mark.skipif(not cuda_devices(), reason="needs an NVIDIA GPU")
def test_on_the_gpu_a_crashing_config_is_left_out_and_the_others_run(cache, forks, monkeypatch):
    """A process whose CUDA runtime and XLA threads are up forks its compiler processes: the
    crash is left out, the other configs run, and the process's own GPU work goes on."""
    from bridge.vendors import targets

    x = jax.random.normal(jax.random.PRNGKey(0), (1 << 16,), jnp.float32)
    np.testing.assert_array_equal(np.asarray(jax.jit(lambda a: a * 2)(x)), np.asarray(x) * 2)
    target = str(targets.detect("cuda")[0])
    crash_at_llir(monkeypatch, target, os.abort, warps=4)
    out = jax.jit(copy_call(tuned_copy, cache, None))(x)  # the target from the device
    np.testing.assert_array_equal(np.asarray(out), np.asarray(x) * 3)
    assert len(forks) == 2  # a compiler process, and another after the crash
    assert len(list(Path(cache.root).glob("*.failure"))) == 1
    np.testing.assert_array_equal(np.asarray(jax.jit(lambda a: a + 1)(x)), np.asarray(x) + 1)


@gluon.jit
def scaled_mfma(a_ptr, b_ptr, out_ptr, M: gl.constexpr, N: gl.constexpr, K: gl.constexpr):
    """out = a @ b for one tile of fp8 (e4m3) data, unit scales: gfx950's scaled MFMA."""
    blocked: gl.constexpr = gl.BlockedLayout([1, 16], [8, 8], [4, 1], [1, 0])
    mfma: gl.constexpr = gl.amd.AMDMFMALayout(
        version=4, instr_shape=[16, 16, 128], transposed=True, warps_per_cta=[2, 2]
    )
    rows = gl.arange(0, M, layout=gl.SliceLayout(1, blocked))[:, None]
    a = gl.load(a_ptr + rows * K + gl.arange(0, K, layout=gl.SliceLayout(0, blocked))[None, :])
    depth = gl.arange(0, K, layout=gl.SliceLayout(1, blocked))[:, None]
    b = gl.load(b_ptr + depth * N + gl.arange(0, N, layout=gl.SliceLayout(0, blocked))[None, :])
    a = gl.convert_layout(a, gl.DotOperandLayout(operand_index=0, parent=mfma, k_width=16))
    b = gl.convert_layout(b, gl.DotOperandLayout(operand_index=1, parent=mfma, k_width=16))
    acc = gl.zeros([M, N], dtype=gl.float32, layout=mfma)
    c = gl.amd.cdna4.mfma_scaled(a, None, "e4m3", b, None, "e4m3", acc)
    out_rows = gl.arange(0, M, layout=gl.SliceLayout(1, mfma))[:, None]
    gl.store(out_ptr + out_rows * N + gl.arange(0, N, layout=gl.SliceLayout(0, mfma))[None, :], c)


def test_llvm_that_cannot_select_an_instruction_fails_the_kernel_not_the_job(cache):
    """A gfx950-only kernel lowered for gfx942: LLVM aborts ("Cannot select"), as Triton's own
    launcher would, and the lowering says so instead."""
    a = jax.ShapeDtypeStruct((32, 128), jnp.uint8)
    b = jax.ShapeDtypeStruct((128, 32), jnp.uint8)

    def call(target):
        out = jax.ShapeDtypeStruct((32, 32), jnp.float32)
        return lambda a, b: bridge.triton_call(
            a, b, kernel=scaled_mfma, out_shape=out, grid=(1,), M=32, N=32, K=128,
            num_warps=4, target=target, embed="inline", cache=cache,
        )  # fmt: skip

    (call_950,) = decoded(call("hip:gfx950"), a, b, platform="rocm")
    assert call_950.kernel_call.kernel.module_image.object_file.startswith(b"\x7fELF")
    with pytest.raises(bridge.NoConfigError) as info:
        decoded(call("hip:gfx942"), a, b, platform="rocm")
    assert (
        "the compiler crashed (SIGABRT: Aborted): LLVM ERROR: Cannot select: intrinsic "
        "%llvm.amdgcn.mfma.scale.f32.16x16x128.f8f6f4"
    ) in str(info.value)


# -- where kernels come from ------------------------------------------------------------------
KERNELS_HERE = '''
import json, linecache, os, sys, types
sys.path.insert(0, os.environ["HELPERS"])
import jax, jax.numpy as jnp, triton, triton.language as tl
import bridge, kernelcache
from bridge.vendors import backends
from bridge_helpers import decoded, kernels_of

SOURCE = """
import triton, triton.language as tl

@triton.jit
def notebook_copy(x_ptr, n, out_ptr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) + 2, mask=offs < n)
"""


@triton.jit
def main_copy(x_ptr, n, out_ptr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) + 1, mask=offs < n)


def notebook_cell():
    """A module as a notebook makes it: its code registered with linecache, not importable."""
    name = "<notebook-cell-1>"
    linecache.cache[name] = (len(SOURCE), None, SOURCE.splitlines(True), name)
    module = types.ModuleType("notebook")
    exec(compile(SOURCE, name, "exec"), module.__dict__)
    return module.notebook_copy


def closure(step):
    @triton.jit
    def closure_copy(x_ptr, n, out_ptr, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) - 1, mask=offs < n)

    return closure_copy


target = bridge.parse_target("hip:gfx942")
backend = backends.make_backend(target)
add_stages = backend.add_stages

def crashing_stages(stages, options, language):
    add_stages(stages, options, language)
    llir = stages["llir"]
    def crashing(module, metadata):
        if options.num_warps == 8:
            os.abort()
        return llir(module, metadata)
    stages["llir"] = crashing

backend.add_stages = crashing_stages
cache = kernelcache.Cache(os.environ["KERNELCACHE_DIR"], readonly_roots=(), remote="")
x = jax.ShapeDtypeStruct((4096,), jnp.float32)
configs = [triton.Config({"BLOCK": 256}, num_warps=w) for w in (4, 8)]
out = {}
for name, kernel in [("main", main_copy), ("notebook", notebook_cell()), ("closure", closure(1))]:
    tuned = triton.autotune(configs=configs, key=["n"])(kernel)
    fn = lambda x: bridge.triton_call(x, x.size, kernel=tuned, out_shape=x, grid=(16,),
                                      target="hip:gfx942", cache=cache)
    (call,) = decoded(fn, x, platform="rocm")
    out[name] = sorted({k.num_warps for k in kernels_of(call)})
out["failures"] = sum(1 for p in os.listdir(cache.root) if p.endswith(".failure"))
print(json.dumps(out))
'''


def test_kernels_from_main_a_notebook_and_closures_compile_in_the_compiler_process(tmp_path):
    script = tmp_path / "kernels_here.py"
    script.write_text(KERNELS_HERE)
    env = child_env(KERNELCACHE_DIR=str(tmp_path / "root"), HELPERS=str(HELPERS))
    proc = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=240
    )
    out = json.loads(checked(proc).stdout.strip().splitlines()[-1])
    # each compiled where its num_warps=8 config aborted: left out, and this process went on
    assert out == {"main": [4], "notebook": [4], "closure": [4], "failures": 3}


# -- Gluon errors: the layout hint only for layouts --------------------------------------------
GLUON = {"BLOCK": 1024, "num_warps": 4}


@gluon.jit
def gluon_copy(x_ptr, n, out_ptr, BLOCK: gl.constexpr, TPW: gl.constexpr, WPC: gl.constexpr):
    layout: gl.constexpr = gl.BlockedLayout([4], [TPW], [WPC], [0])
    offs = gl.program_id(0) * BLOCK + gl.arange(0, BLOCK, layout=layout)
    gl.store(out_ptr + offs, gl.load(x_ptr + offs, mask=offs < n), mask=offs < n)


@gluon.jit
def gluon_misshapen(x_ptr, n, out_ptr, BLOCK: gl.constexpr, TPW: gl.constexpr):
    layout: gl.constexpr = gl.BlockedLayout([4], [TPW], [gl.num_warps()], [0])
    offs = gl.program_id(0) * BLOCK + gl.arange(0, BLOCK, layout=layout)
    other = gl.arange(0, 2 * BLOCK, layout=layout)
    gl.store(out_ptr + offs, gl.load(x_ptr + offs + other, mask=offs < n), mask=offs < n)


def hint(target: str) -> str:
    warp = bridge.parse_target(target).warp_size
    return (
        f"Gluon layouts must fit the target: {warp} threads per warp on {target}, and "
        "warps_per_cta multiplying to num_warps=4"
    )


@pytest.mark.parametrize("target, platform", TARGETS)
def test_the_layout_hint_only_for_errors_about_layouts(cache, capfd, target, platform):
    warp = bridge.parse_target(target).warp_size
    misfits = [
        (96 - warp, 4, f"Layout has {96 - warp} threads per warp, but the module specifies"),
        (warp, 8, "Layout has 8 warps per CTA, but the context requires 4"),
    ]
    for tpw, wpc, said in misfits:  # the verifier's words reach stderr, and the hint the error
        with pytest.raises(RuntimeError) as info:
            decoded(
                copy_call(gluon_copy, cache, target, TPW=tpw, WPC=wpc, **GLUON),
                F32,
                platform=platform,
            )
        assert info.value.__notes__ == [f"while compiling gluon_copy for {target}", hint(target)]
        assert said in capfd.readouterr().err
    with pytest.raises(
        triton.compiler.errors.CompilationError, match="make_shape_compatible"
    ) as info:
        decoded(
            copy_call(gluon_misshapen, cache, target, TPW=warp, **GLUON), F32, platform=platform
        )
    assert info.value.__notes__ == [f"while compiling gluon_misshapen for {target}"]


def test_the_layout_hint_reads_what_the_verifier_said():
    from bridge.compile.compiler import about_layouts

    error = RuntimeError("error encountered during parsing")
    assert about_layouts(error, "Layout has 32 threads per warp, but the module specifies 64")
    assert about_layouts(error, "Layout has 8 warps per CTA, but the context requires 4 warps")
    assert not about_layouts(error, "")
    assert not about_layouts(ValueError("offsets layout must be a BlockedLayout"), "")
