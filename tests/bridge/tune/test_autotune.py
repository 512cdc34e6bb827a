"""Triton's autotuner, faithfully, and the autotune decisions that say which config runs.

The autotuner: backend options in configs, configs that cannot compile or launch left out (and
remembered in the cache), pre_hooks run at lowering, and autotune decisions that never choose a
left-out config. Lowered for cuda:90 and hip:gfx942 on this CPU machine; the kernels are in
tests/helpers/autotuner_kernels.py (importable by child processes and warm).

Autotune decisions (entries of the cache that say which config of an autotuned call runs), for
examples' matmul lowered for cuda:90. Measuring needs the GPU; here a stand-in measurer
(``bridge.tune.measure.use``) plays the GPU where a test needs one.

``fresh`` is a cache of the test's own; ``cache`` is shared by the module's tests.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import autotuner_kernels as K
import jax
import jax.numpy as jnp
import pytest
import triton
from bridge_helpers import (
    COUNT_COMPILES,
    custom_calls,
    decoded,
    forget_lowerings,
    kernels_of,
    lowered_module,
    run_child,
)
from cli_support import kc, kc_json
from redis_server import REDIS_SERVER, SKIP_REASON, RedisServer
from stand_in_gpu import TableMeasurer, read_log
from support import HELPERS, REPO, checked, child_env

import bridge
import kernelcache
from bridge import versions
from bridge.call import kernel_objects
from bridge.cli import tune
from bridge.compile import fetch, variants
from bridge.entries import decisions, failures
from bridge.entries.decisions import DECISION, Decision
from bridge.entries.kinds import derived_key
from bridge.lowering.configs import FETCHED
from bridge.tune import measure
from examples import ops
from kernelcache.keys import digest_of
from kernelcache.store import Store

F32 = jax.ShapeDtypeStruct((4096,), jnp.float32)
ONE = jax.ShapeDtypeStruct((1,), jnp.float32)
TARGETS = [("cuda:90", "cuda"), ("hip:gfx942", "rocm")]


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> kernelcache.Cache:
    """One kernel cache for the module: each kernel compiles once."""
    return kernelcache.Cache(
        root=tmp_path_factory.mktemp("autotuner"), readonly_roots=(), remote=""
    )


@pytest.fixture(autouse=True)
def _fresh_warnings():
    """Each test sees the warnings about left-out configs as a fresh process would."""
    variants._warned.clear()


@pytest.fixture
def warnings_(caplog):
    caplog.set_level(logging.WARNING, logger="bridge")
    return caplog


def left_out_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "bridge.compile.variants"]


@pytest.fixture
def jaxlib_0112(monkeypatch):
    """Lower as if jaxlib 0.11.2 ran (host tensor descriptors need >= 0.11.1)."""
    monkeypatch.setattr(versions, "jaxlib_version", lambda: "0.11.2")


def configs_of(call) -> list[str]:
    if call.HasField("kernel_call"):
        return [""]
    return [c.description for c in call.autotuned_kernel_call.configs]


def copy_call(kernel, cache, target="cuda:90", **kw):
    grid = lambda m: (triton.cdiv(m["n"], m["BLOCK"]),)  # noqa: E731
    return lambda x: bridge.triton_call(
        x, x.size, kernel=kernel, out_shape=x, grid=grid, target=target, cache=cache, **kw
    )


# -- 1. backend options in a config --------------------------------------------------------------
def fma_call(cache, kernel=K.fma_fusion, **kw):
    return lambda x, y: bridge.triton_call(
        x,
        y,
        x.size,
        kernel=kernel,
        out_shape=x,
        grid=(16,),
        target="cuda:90",
        embed="inline",
        cache=cache,
        **kw,
    )


def test_enable_fp_fusion_in_a_config_is_that_configs_compile_option(cache):
    (call,) = decoded(fma_call(cache), F32, F32)
    fused, unfused = kernels_of(call)
    assert "enable_fp_fusion: False" in configs_of(call)[1]
    assert "fma.rn.f32" in fused.ptx and "fma.rn.f32" not in unfused.ptx
    assert "mul.rn.f32" in unfused.ptx
    # the very kernel a call with the option as a keyword compiles
    (plain,) = decoded(
        fma_call(cache, kernel=K.fma_kernel, BLOCK=256, enable_fp_fusion=False), F32, F32
    )
    assert kernels_of(plain)[0].module_image.object_file == unfused.module_image.object_file
    assert fused.module_image.object_file != unfused.module_image.object_file


def test_matrix_instr_nonkdim_in_a_config_on_gfx942(cache):
    h = jax.ShapeDtypeStruct((32, 32), jnp.float16)

    def dot(kernel, **kw):
        return lambda a, b: bridge.triton_call(
            a,
            b,
            kernel=kernel,
            out_shape=h,
            grid=(1,),
            target="hip:gfx942",
            embed="inline",
            cache=cache,
            **kw,
        )

    (call,) = decoded(dot(K.dot_nonkdim), h, h, platform="rocm")
    k16, k32 = (k.module_image.object_file for k in kernels_of(call))
    assert k16 != k32
    for nonkdim, image in ((16, k16), (32, k32)):
        (plain,) = decoded(
            dot(K.dot_kernel, BM=32, BN=32, BK=32, matrix_instr_nonkdim=nonkdim),
            h,
            h,
            platform="rocm",
        )
        assert kernels_of(plain)[0].module_image.object_file == image


def test_a_config_name_neither_parameter_nor_option_is_an_error(cache):
    bogus = triton.autotune(configs=[triton.Config({"BLOCK": 256, "BLOK": 1})], key=["n"])(
        K.fma_kernel
    )
    with pytest.raises(bridge.KernelArgumentError, match=r"sets BLOK.*enable_fp_fusion"):
        decoded(fma_call(cache, kernel=bogus), F32, F32)
    # an option of the other vendor's backend is not one of this target's, as in Triton
    amd_only = triton.autotune(
        configs=[triton.Config({"BLOCK": 256, "waves_per_eu": 2})], key=["n"]
    )(K.fma_kernel)
    with pytest.raises(bridge.KernelArgumentError, match=r"sets waves_per_eu.*nvidia"):
        decoded(fma_call(cache, kernel=amd_only), F32, F32)
    (call,) = decoded(
        lambda x, y: bridge.triton_call(
            x,
            y,
            x.size,
            kernel=amd_only,
            out_shape=x,
            grid=(16,),
            target="hip:gfx942",
            cache=cache,
        ),
        F32,
        F32,
        platform="rocm",
    )
    assert "waves_per_eu: 2" in configs_of(call)[0]


# -- 2. configs that cannot compile ----------------------------------------------------------
@pytest.mark.parametrize("target, platform", TARGETS)
def test_configs_failing_a_static_assert_are_left_out_with_a_warning(
    cache, target, platform, warnings_
):
    (call,) = decoded(copy_call(K.bounded_copy, cache, target), F32, platform=platform)
    kept = configs_of(call)
    assert [c.split(",")[0] for c in kept] == ["BLOCK: 128", "BLOCK: 256"]
    (warning,) = left_out_warnings(warnings_)
    assert "left out 2 of its 4 configs" in warning and target in warning
    assert "BLOCK: 512" in warning and "BLOCK: 1024" in warning
    assert "static assertion failed: BLOCK must be at most 256" in warning
    warnings_.clear()
    decoded(copy_call(K.bounded_copy, cache, target), F32, platform=platform)
    assert not left_out_warnings(warnings_)  # one warning per kernel and process


def test_a_static_assert_in_a_called_function_leaves_the_config_out(cache):
    (call,) = decoded(copy_call(K.bounded_copy_nested, cache), F32)
    assert call.HasField("kernel_call") and call.kernel_call.grid_0 == 32  # BLOCK 128


def test_when_no_config_compiles_the_error_names_each(cache):
    with pytest.raises(bridge.NoConfigError) as info:
        decoded(copy_call(K.never_fits, cache), F32)
    message = str(info.value)
    assert isinstance(info.value, bridge.BridgeError)
    assert "BLOCK: 512" in message and "BLOCK: 1024" in message
    assert message.count("static assertion failed") == 2


def test_other_compile_errors_still_fail_the_call(cache):
    with pytest.raises(triton.compiler.errors.CompilationError, match="undefined_name") as info:
        decoded(copy_call(K.broken, cache), F32)
    assert not isinstance(info.value, bridge.BridgeError)
    remembered = [
        json.loads(p.with_suffix(".json").read_text()) for p in Path(cache.root).glob("*.failure")
    ]
    assert all(m["name"] != "broken_kernel" for m in remembered)  # nothing remembered


SECOND = (
    COUNT_COMPILES
    + """
import json, logging, jax, jax.numpy as jnp, triton
logging.basicConfig(level=logging.WARNING)
import bridge, autotuner_kernels as K
from bridge_helpers import decoded
x = jax.ShapeDtypeStruct((4096,), jnp.float32)
grid = lambda m: (triton.cdiv(m["n"], m["BLOCK"]),)
(call,) = decoded(lambda x: bridge.triton_call(x, x.size, kernel=K.bounded_copy, out_shape=x,
                  grid=grid, target="cuda:90"), x)
print(json.dumps({"configs": [c.description.split(",")[0] for c in call.autotuned_kernel_call.configs],
                  **counts}))
"""
)


def test_a_second_process_does_not_compile_the_left_out_configs_again(tmp_path):
    root = tmp_path / "root"
    first = run_child(SECOND, KERNELCACHE_DIR=str(root))
    assert first["configs"] == ["BLOCK: 128", "BLOCK: 256"]
    assert first["make_ir"] == 4  # two compile, two fail their static assertion
    second = run_child(SECOND, KERNELCACHE_DIR=str(root))
    assert second == {**first, "make_ir": 0, "compile": 0, "triton_key": 0}
    entries = kc_json(root, "ls", "--kind", "failure")["entries"]
    left = [e for e in entries if e["kind"] == "failure"]
    assert len(left) == 2 and {e["kernel"] for e in left} == {"bounded_copy_kernel"}
    assert kc(root, "verify").returncode == 0


def test_a_malformed_failure_entry_is_ignored(tmp_path, monkeypatch):
    cache = kernelcache.Cache(tmp_path / "root", readonly_roots=(), remote="")
    decoded(copy_call(K.bounded_copy, cache), F32)
    path = sorted(Path(cache.root).glob("*.failure"))[0]
    key = json.loads(path.read_bytes())["of"]
    assert failures.remembered(cache, key) == "static assertion failed: BLOCK must be at most 256"
    attempts = []
    compile_source = fetch.compile_source
    monkeypatch.setattr(
        fetch, "compile_source", lambda *a: attempts.append(1) or compile_source(*a)
    )
    for forged in ({"format": 1, "of": "0" * 64, "reason": "x"}, {"format": 1, "of": key}):
        path.unlink()
        path.with_suffix(".json").unlink()
        forget_lowerings(cache.root)
        cache.put(derived_key(key, "failure"), "failure", json.dumps(forged).encode(), {})
        assert failures.remembered(cache, key) is None
        FETCHED.clear()
        attempts.clear()
        (call,) = decoded(copy_call(K.bounded_copy, cache), F32)
        assert len(attempts) == 1  # that config was compiled again, and is still left out
        assert len(configs_of(call)) == 2


def test_failure_entries_travel_in_bundles(tmp_path, monkeypatch):
    here = kernelcache.Cache(tmp_path / "here", readonly_roots=(), remote="")
    decoded(copy_call(K.bounded_copy, here), F32)
    bundle = tmp_path / "kernels.tar"
    assert kc(Path(here.root), "export", str(bundle)).returncode == 0
    there = tmp_path / "there"
    there.mkdir()
    assert kc(there, "import", str(bundle)).returncode == 0
    attempts = []
    compile_source = fetch.compile_source
    monkeypatch.setattr(
        fetch, "compile_source", lambda *a: attempts.append(1) or compile_source(*a)
    )
    FETCHED.clear()
    cache = kernelcache.Cache(there, readonly_roots=(), remote="")
    (call,) = decoded(copy_call(K.bounded_copy, cache), F32)
    assert len(configs_of(call)) == 2 and not attempts  # nothing compiled, nothing tried


@pytest.mark.parametrize(
    "data",
    [b"", b"[", b"\xff", b"{}", b'{"format": 2}', b'{"format": 1, "of": "k", "reason": ""}'],
)
def test_failure_documents_are_checked(data):
    assert failures.parse(data, "k") is None
    good = {"format": 1, "of": "k", "reason": "static assertion failed: x"}
    assert failures.parse(json.dumps(good).encode(), "k") == good["reason"]
    assert failures.parse(json.dumps({**good, "reason": "a\nb"}).encode(), "k") is None


def test_what_is_left_out_is_what_tritons_autotuner_skips():
    import ast

    from triton.compiler.errors import CompilationError, CompileTimeAssertionFailure
    from triton.runtime.errors import OutOfResources, PTXASError

    oor = OutOfResources(300_000, 232_448, "shared memory")
    assert failures.reason_of(oor).startswith("out of resource: shared memory, Required: 300000")
    ptxas = PTXASError(
        "`ptxas` failed with error code 255\n`ptxas` stderr:\nptxas error   : Entry function "
        "'k' uses too much data\n\nRepro command: ptxas -v k.ptx\n"
    )
    reason = (
        "`ptxas` failed with error code 255; ptxas error : Entry function 'k' uses too much data"
    )
    assert failures.reason_of(ptxas) == reason and failures.lasting(ptxas)
    for crash in ("`ptxas` raised SIGSEGV", "`ptxas` failed with error code -9"):
        assert failures.reason_of(PTXASError(crash)) and not failures.lasting(PTXASError(crash))
    node = ast.parse("x").body[0]
    inner = CompileTimeAssertionFailure("x", node, "too big")
    outer = CompilationError("x", node, None)
    outer.__cause__ = inner  # how Triton reports a failure inside a called @jit function
    assert failures.reason_of(outer) == "static assertion failed: too big"
    for other in (
        CompilationError("x", node, "NameError"),
        RuntimeError("AMD LLVM 21: error: cannot select"),  # the AMD backend's codegen errors
        ValueError("num_ctas > 1 not supported on gfx942"),
    ):
        assert failures.reason_of(other) is None


def test_a_ptxas_crash_leaves_the_config_out_but_is_not_remembered(tmp_path, monkeypatch):
    from triton.runtime.errors import PTXASError

    real, tries = fetch.compile_source, []

    def crashing(src, target, backend, options):
        if src.constants.get((3,)) == 128:  # BLOCK
            tries.append(1)
            raise PTXASError("`ptxas` raised SIGSEGV\n`ptxas` stderr:\n")
        return real(src, target, backend, options)

    monkeypatch.setattr(fetch, "compile_source", crashing)
    cache = kernelcache.Cache(tmp_path / "root", readonly_roots=(), remote="")
    for _ in range(2):
        FETCHED.clear()
        (call,) = decoded(copy_call(K.bounded_copy, cache), F32)
        assert call.HasField("kernel_call") and call.kernel_call.grid_0 == 16  # BLOCK 256
    assert len(tries) == 2  # tried again by the next lowering
    assert len(list(Path(cache.root).glob("*.failure"))) == 2  # the static assertions only


# -- 3. configs that cannot launch ---------------------------------------------------------------
H = jax.ShapeDtypeStruct((512, 512), jnp.float16)


def matmul_call(kernel, cache, target):
    return lambda a, b: bridge.triton_call(
        a,
        b,
        512,
        512,
        512,
        kernel=kernel,
        out_shape=a,
        grid=K.matmul_grid,
        target=target,
        embed="inline",
        cache=cache,
    )


@pytest.mark.parametrize(
    "target, platform, needs, limit",
    [("cuda:90", "cuda", "524,288", "232,448"), ("hip:gfx942", "rocm", "393,216", "65,536")],
)
def test_a_config_over_the_shared_memory_limit_is_left_out(
    cache, target, platform, needs, limit, warnings_
):
    (call,) = decoded(matmul_call(K.matmul_huge, cache, target), H, H, platform=platform)
    assert call.HasField("kernel_call")  # one config left: a plain kernel call
    assert call.kernel_call.kernel.shared_mem_bytes <= int(limit.replace(",", ""))
    (warning,) = left_out_warnings(warnings_)
    assert "BM: 256, BN: 256, BK: 128" in warning
    assert f"needs {needs} bytes of shared memory per block; {target} has {limit}" in warning
    with pytest.raises(bridge.NoConfigError, match=f"needs {needs} bytes of shared memory"):
        decoded(matmul_call(K.matmul_only_huge, cache, target), H, H, platform=platform)


@pytest.mark.parametrize(
    "target, platform, kept, left",
    [("cuda:90", "cuda", [4, 32], [64]), ("hip:gfx942", "rocm", [4], [32, 64])],
)
def test_a_config_with_more_threads_than_a_block_is_left_out(
    cache, target, platform, kept, left, warnings_
):
    """As a config over the shared-memory limit is: never compiled, named in one warning in
    the same words on every vendor; none left, the call fails naming each."""
    (call,) = decoded(copy_call(K.wide_copy, cache, target), F32, platform=platform)
    wave = 32 if platform == "cuda" else 64
    assert {k.num_warps for k in kernels_of(call)} == set(kept)
    (warning,) = left_out_warnings(warnings_)
    for w in left:
        assert f"num_warps={w} on {target} means {w * wave} threads per block" in warning
    with pytest.raises(bridge.NoConfigError, match="threads per block; the limit is 1024"):
        decoded(copy_call(K.only_too_wide, cache, target), F32, platform=platform)


def test_the_limit_comes_from_the_target_and_is_unknown_for_others():
    t90, t75 = bridge.parse_target("cuda:90"), bridge.parse_target("cuda:75")
    assert variants.launch_problem({"shared": 232_448}, t90) is None
    assert "232,449 bytes" in variants.launch_problem({"shared": 232_449}, t90)
    assert variants.launch_problem({"shared": 10**9}, t75) is None  # not in the table
    assert "tensor memory" in variants.launch_problem({"shared": 0, "tmem_size": 513}, t90)


# -- 4. pre_hooks ---------------------------------------------------------------------------
X = jax.ShapeDtypeStruct((128, 256), jnp.float16)


def tma_call(cache, descriptor=True, target="cuda:90", kernel=K.tma_double, **kw):
    def f(x):
        arg = bridge.TensorDescriptor.from_array(x, [1, 1]) if descriptor else x
        return bridge.triton_call(
            arg,
            128,
            256,
            kernel=kernel,
            out_shape=x,
            grid=K.tma_grid,
            target=target,
            cache=cache,
            **kw,
        )

    return f


def test_a_pre_hook_gives_each_config_its_descriptor_block(cache, jaxlib_0112):
    (call,) = decoded(tma_call(cache), X)
    seen = []
    for config in call.autotuned_kernel_call.configs:
        kc_ = config.kernel_call
        desc = kc_.parameters[0].tensor_descriptor.nvidia
        assert list(desc.shape) == [128, 256] and list(desc.strides) == [256, 1]
        seen.append((list(desc.block_shape), kc_.grid_0, kc_.grid_1))
    # Triton loads a 128-element fp16 row in two 64-element TMA boxes (128-byte swizzle)
    assert seen == [([32, 64], 4, 4), ([64, 32], 2, 8), ([16, 64], 8, 2)]
    assert len({k.ptx for k in kernels_of(call)}) == 3


@pytest.mark.parametrize("target, platform", TARGETS)
def test_a_descriptor_hook_returns_at_once_for_pointers(cache, target, platform):
    (call,) = decoded(tma_call(cache, descriptor=False, target=target), X, platform=platform)
    assert [c.split(",")[:2] for c in configs_of(call)] == [
        ["BM: 32", " BN: 64"],
        ["BM: 64", " BN: 32"],
        ["BM: 16", " BN: 128"],
    ]


Q = jax.ShapeDtypeStruct((2, 256, 64), jnp.float16)


def descriptor_blocks(call) -> list[list[list[int]]]:
    """The TMA block of each host descriptor parameter, config by config."""
    return [
        [
            list(p.tensor_descriptor.nvidia.block_shape)
            for p in config.kernel_call.parameters
            if p.HasField("tensor_descriptor")
        ]
        for config in call.autotuned_kernel_call.configs
    ]


@pytest.mark.parametrize("causal", [False, True])
def test_descriptors_passed_by_keyword_get_the_blocks_their_pre_hook_sets(
    cache, jaxlib_0112, causal
):
    """K.attention's descriptors are made with a dummy [1, 1] block and passed by keyword
    (jax-triton 0.4 style); each config's pre_hook sets the blocks its tl.dot needs (K >= 16),
    and the lowering is the one of the same descriptors passed positionally."""

    def attention(by_keyword):
        return lambda q, k, v: K.attention(
            q, k, v, causal, by_keyword, target="cuda:90", cache=cache
        )

    (call,) = decoded(attention(True), Q, Q, Q)
    assert descriptor_blocks(call) == [[[m, 64], [n, 64], [n, 64]] for m, n in K.ATTENTION_BLOCKS]
    ((by_keyword,), (positional,)) = (
        custom_calls(lowered_module(attention(b), Q, Q, Q)) for b in (True, False)
    )
    assert by_keyword["opaque"] == positional["opaque"]


@pytest.mark.parametrize("target, platform", TARGETS)
def test_a_hook_probing_an_array_for_a_block_shape_finds_none(cache, jaxlib_0112, target, platform):
    """hasattr(nargs["x_desc"], "block_shape") is False for an array, as for a tensor: the hook
    leaves a pointer alone and shapes a descriptor."""
    pointer = tma_call(cache, descriptor=False, target=target, kernel=K.tma_double_duck)
    (call,) = decoded(pointer, X, platform=platform)
    assert [c.split(",")[:2] for c in configs_of(call)] == [
        ["BM: 32", " BN: 64"],
        ["BM: 64", " BN: 32"],
    ]
    (call,) = decoded(tma_call(cache, kernel=K.tma_double_duck), X)
    assert descriptor_blocks(call) == [[[32, 64]], [[64, 32]]]


def test_a_hooks_arrays_answer_attribute_probes_as_tensors_do(cache):
    seen = {}

    def probe(nargs):
        x = nargs["x_ptr"]
        seen.update(
            block_shape=hasattr(x, "block_shape"),
            base=getattr(x, "base", None),
            data_ptr=hasattr(x, "data_ptr"),
            copy_=hasattr(x, "copy_"),
            shape=x.shape,
        )

    kernel = triton.autotune(configs=[triton.Config({"BLOCK": 128}, pre_hook=probe)], key=["n"])(
        K.sum_kernel
    )
    decoded(sum_call(kernel, cache), F32)
    assert seen == {
        "block_shape": False,
        "base": None,
        "data_ptr": True,
        "copy_": True,
        "shape": (4096,),
    }

    def unguarded(nargs):
        nargs["x_ptr"].block_shape = list(nargs["x_ptr"].block_shape)

    kernel = triton.autotune(
        configs=[triton.Config({"BLOCK": 128}, pre_hook=unguarded)], key=["n"]
    )(K.sum_kernel)
    with pytest.raises(AttributeError, match="x_ptr has no attribute 'block_shape'"):
        decoded(sum_call(kernel, cache), F32)


def sum_call(kernel, cache, target="cuda:90", **kw):
    return lambda x: bridge.triton_call(
        x, x.size, kernel=kernel, out_shape=ONE, grid=K.sum_grid, target=target, cache=cache, **kw
    )


def opaque(fn, platform="cuda"):
    (cc,) = custom_calls(lowered_module(fn, F32, platform=platform))
    return cc["opaque"]


@pytest.mark.parametrize("target, platform", TARGETS)
def test_a_zeroing_pre_hook_lowers_as_zeroed_outputs(cache, target, platform):
    hooked = opaque(sum_call(K.sum_zeroing, cache, target), platform)
    assert hooked == opaque(sum_call(K.sum_plain, cache, target, zeroed_outputs=[0]), platform)
    assert hooked == opaque(sum_call(K.sum_reset, cache, target), platform)
    assert hooked != opaque(sum_call(K.sum_plain, cache, target), platform)
    (call,) = decoded(sum_call(K.sum_zeroing, cache, target), F32, platform=platform)
    for config in call.autotuned_kernel_call.configs:
        assert config.kernel_call.parameters[2].array.bytes_to_zero == 4


def test_the_autotuners_own_pre_hook_runs_too(cache):
    def zero(nargs, reset_only=False):
        nargs["out_ptr"].zero_()

    own = triton.autotune(configs=K.PLAIN_CONFIGS, key=["n"], pre_hook=zero)(K.sum_kernel)
    assert opaque(sum_call(own, cache)) == opaque(sum_call(K.sum_reset, cache))


def test_a_post_hook_that_does_nothing_is_accepted(cache):
    quiet = triton.autotune(
        configs=K.PLAIN_CONFIGS, key=["n"], post_hook=lambda nargs, exception: None
    )(K.sum_kernel)
    assert opaque(sum_call(quiet, cache)) == opaque(sum_call(K.sum_plain, cache))

    def restore(nargs, exception):
        nargs["out_ptr"].zero_()

    busy = triton.autotune(configs=K.PLAIN_CONFIGS, key=["n"], post_hook=restore)(K.sum_kernel)
    with pytest.raises(bridge.KernelArgumentError, match=r"post_hook .*restore zeroed out_ptr"):
        decoded(sum_call(busy, cache), F32)


def test_a_pre_hook_that_reads_data_is_an_error_naming_it(cache):
    with pytest.raises(bridge.KernelArgumentError) as info:
        decoded(sum_call(K.sum_reading, cache), F32)
    message = str(info.value)
    assert "pre_hook autotuner_kernels.read_data used x_ptr.data_ptr" in message
    assert "zeroed_outputs" in message and "input_output_aliases" in message


def _caught(nargs):
    try:
        nargs["x_ptr"].copy_(nargs["out_ptr"])
    except Exception:
        pass  # the hook swallowed it: still an error


@pytest.mark.parametrize(
    "hook, tried",
    [
        (lambda nargs: nargs["x_ptr"][0], r"read x_ptr\[\.\.\.\]"),
        (lambda nargs: nargs["out_ptr"].fill_(0.0), r"used out_ptr\.fill_"),
        (lambda nargs: nargs["out_ptr"].__iadd__(1), r"updated out_ptr in place"),
        (lambda nargs: float(nargs["x_ptr"]), r"read x_ptr as a number"),
        (_caught, r"_caught used x_ptr\.copy_"),
        (lambda nargs: nargs["x_ptr"].device, r"used x_ptr\.device"),
    ],
)
def test_what_a_hook_may_not_do(cache, hook, tried):
    kernel = triton.autotune(configs=[triton.Config({"BLOCK": 128}, pre_hook=hook)], key=["n"])(
        K.sum_kernel
    )
    with pytest.raises(bridge.KernelArgumentError, match=tried):
        decoded(sum_call(kernel, cache), F32)


def test_a_hooks_own_error_is_raised_as_it_is(cache):
    kernel = triton.autotune(
        configs=[triton.Config({"BLOCK": 128}, pre_hook=lambda nargs: nargs["BLOCK_M"])],
        key=["n"],
    )(K.sum_kernel)
    with pytest.raises(KeyError, match="BLOCK_M"):
        decoded(sum_call(kernel, cache), F32)


def test_a_hook_may_zero_only_outputs_and_set_only_block_shapes(cache, jaxlib_0112):
    zero_input = triton.autotune(
        configs=[triton.Config({"BLOCK": 128}, pre_hook=lambda n: n["x_ptr"].zero_())], key=["n"]
    )(K.sum_kernel)
    with pytest.raises(bridge.KernelArgumentError, match="x_ptr is zeroed before each launch"):
        decoded(sum_call(zero_input, cache), F32)

    def reshape(nargs):
        nargs["x_desc"].shape = [64, 64]

    bad = triton.autotune(
        configs=[triton.Config({"BM": 32, "BN": 64}, pre_hook=reshape)], key=["M", "N"]
    )(K.tma_double_kernel.fn)
    with pytest.raises(bridge.KernelArgumentError, match=r"reshape set x_desc\.shape"):
        decoded(
            lambda x: bridge.triton_call(
                bridge.TensorDescriptor.from_array(x, [1, 1]),
                128,
                256,
                kernel=bad,
                out_shape=x,
                grid=K.tma_grid,
                target="cuda:90",
                cache=cache,
            ),
            X,
        )


# -- 5. autotune decisions -------------------------------------------------------------------
def record_manifest(tmp_path: Path, cache, monkeypatch) -> Path:
    manifest = tmp_path / "manifest.jsonl"
    monkeypatch.setenv("KERNELCACHE_RECORD", str(manifest))
    decoded(copy_call(K.bounded_copy, cache, autotune="runtime"), F32)
    monkeypatch.delenv("KERNELCACHE_RECORD")
    return manifest


@pytest.fixture
def fresh(tmp_path) -> kernelcache.Cache:
    return kernelcache.Cache(tmp_path / "root", readonly_roots=(), remote="")


def test_a_pin_of_a_left_out_config_is_refused(tmp_path, fresh, monkeypatch):
    manifest = record_manifest(tmp_path, fresh, monkeypatch)
    (refused,) = tune.tune(str(manifest), fresh, pins={"bounded_copy_kernel": 1})
    assert refused.status == "skipped"
    assert "BLOCK: 512" in refused.detail and "static assertion failed" in refused.detail
    (pinned,) = tune.tune(str(manifest), fresh, pins={"bounded_copy_kernel": 2})
    assert pinned.status == "pinned" and pinned.decision.config.startswith("BLOCK: 256")
    assert sorted(pinned.decision.reasons) == [1, 3]  # BLOCK 512 and 1024
    assert "static assertion failed" in pinned.line()
    (call,) = decoded(copy_call(K.bounded_copy, fresh, autotune="require"), F32)
    assert call.HasField("kernel_call") and call.kernel_call.grid_0 == 16  # 4096 / 256
    tests = str(HELPERS)
    human = kc(
        Path(fresh.root),
        "tune",
        str(manifest),
        "--pin",
        "bounded_copy_kernel=0",
        env={"PYTHONPATH": f"{tests}:{child_env()['PYTHONPATH']}"},
    ).stdout
    assert "BLOCK: 1024" in human and "static assertion failed" in human


def test_a_kernel_entry_wins_over_a_failure_entry(tmp_path, fresh, monkeypatch):
    """A config whose kernel is in the cache runs, whatever a failure entry beside it says."""
    from bridge import warm
    from bridge.cli import explain

    manifest = record_manifest(tmp_path, fresh, monkeypatch)
    (group,) = tune.recorded_calls(str(manifest))
    specs = tune._specs(group, bridge.parse_target("cuda:90"), fresh)
    assert fresh.get(specs[0].key, specs[0].ext) is not None  # BLOCK 128 compiled
    failures.remember(fresh, specs[0].key, "static assertion failed: forged", {})
    assert failures.remembered(fresh, specs[0].key) == "static assertion failed: forged"
    (pinned,) = tune.tune(str(manifest), fresh, pins={"bounded_copy_kernel": 0})
    assert pinned.status == "pinned", pinned.detail
    assert pinned.decision.chosen == 0 and sorted(pinned.decision.reasons) == [1, 3]
    (call,) = decoded(copy_call(K.bounded_copy, fresh, autotune="require"), F32)
    assert call.HasField("kernel_call") and call.kernel_call.grid_0 == 32  # 4096 / 128
    report = warm.warm(manifest, ["cuda:90"], cache=fresh, jobs=1)
    assert [r.status for r in report.results] == ["present"]  # the decided config only
    (told,) = [
        e for e in explain.explain(str(manifest), fresh, ["cuda:90"]) if e.key == specs[0].key
    ]
    assert told.status == "hit"


def test_a_stale_entrys_launch_limits_leave_no_config_out(tmp_path, fresh, monkeypatch):
    """The entry under a config's key whose reads find something else now is not what a
    lowering runs: what it says of shared memory does not leave the config out of a pin."""
    manifest = record_manifest(tmp_path, fresh, monkeypatch)
    (group,) = tune.recorded_calls(str(manifest))
    specs = tune._specs(group, bridge.parse_target("cuda:90"), fresh)
    art = fresh.get(specs[0].key, specs[0].ext)
    assert art is not None  # BLOCK 128 compiled
    reserved = ("digest", "entry_digest", "ext", "format", "key", "size")
    stale = {k: v for k, v in art.meta.items() if k not in reserved}
    reads = json.loads(art.meta["reads"])
    first = reads["rows"][0]
    first[-1] = "0" * len(first[-1])  # what another version's first read found
    stale.update(shared=10**6, reads=json.dumps(reads))
    Store(fresh.root).publish(specs[0].key, specs[0].ext, art.data, stale, replace=True)
    later = kernelcache.Cache(fresh.root, readonly_roots=(), remote="")  # another process's
    assert later.get(specs[0].key, specs[0].ext).meta["shared"] == 10**6
    assert variants.launch_problem(stale, specs[0].target) is not None
    assert 0 not in variants.known_left_out(specs, later)
    (pinned,) = tune.tune(str(manifest), later, pins={"bounded_copy_kernel": 0})
    assert pinned.status == "pinned", pinned.detail


def test_a_tuning_job_never_measures_or_chooses_a_left_out_config(fresh):
    # a GPU that finds the left-out configs fastest (it is never asked to run them)
    stand_in = TableMeasurer([1e-6 if i in (1, 3) else 1e-3 * (4 - i) for i in range(4)])
    previous = measure.use(stand_in)
    try:
        (call,) = decoded(copy_call(K.bounded_copy, fresh, autotune="job"), F32)
    finally:
        measure.use(previous)
    assert stand_in.benched == [[0, 2]] and {i for i, _, _ in stand_in.runs} == {0, 2}
    assert call.HasField("kernel_call") and call.kernel_call.grid_0 == 16  # BLOCK 256: 2 ms
    (entry,) = Path(fresh.root).glob("*.decision")
    made = json.loads(entry.read_bytes())
    assert made["chosen"] == 2 and made["times"][1] is None and made["times"][3] is None
    assert "static assertion failed" in made["reasons"]["1"]


def test_a_decision_for_a_left_out_config_is_ignored(tmp_path, fresh, monkeypatch, warnings_):
    manifest = record_manifest(tmp_path, fresh, monkeypatch)
    (group,) = tune.recorded_calls(str(manifest))
    target = bridge.parse_target("cuda:90")
    specs = tune._specs(group, target, fresh)
    named, _, _ = group.call.revived(target, [0])
    wrong = decisions.Decision(
        kernel=group.call.kernel,
        target="cuda:90",
        device=decisions.ANY_DEVICE,
        variants=tuple(s.key for s in specs),
        configs=tuple(s.variant.description for s in specs),
        chosen=3,
        pinned=True,
    )
    key = decisions.keys_of(specs[0].parts, named, specs)[0]
    DECISION.put(fresh, key, wrong.to_bytes(), wrong.metadata())
    (call,) = decoded(copy_call(K.bounded_copy, fresh), F32)
    assert len(configs_of(call)) == 2
    assert any("chooses config 3" in r.getMessage() for r in warnings_.records)
    with pytest.raises(bridge.AutotuneError, match="no autotune decision"):
        decoded(copy_call(K.bounded_copy, fresh, autotune="require"), F32)


def test_warm_does_not_compile_what_the_cache_knows_cannot_compile(tmp_path, fresh, monkeypatch):
    from bridge import warm

    manifest = record_manifest(tmp_path, fresh, monkeypatch)
    elsewhere = kernelcache.Cache(tmp_path / "elsewhere", readonly_roots=(), remote="")
    first = warm.warm(manifest, ["cuda:90", "hip:gfx942"], cache=elsewhere, jobs=1)
    statuses = sorted(r.status for r in first.results)
    assert statuses == ["compiled"] * 4 + ["left-out"] * 4 and first.ok
    assert first.as_json()["left_out"] == 4
    assert "static assertion failed" in first.summary()
    again = warm.warm(manifest, ["cuda:90", "hip:gfx942"], cache=elsewhere, jobs=1)
    assert sorted(r.status for r in again.results) == ["left-out"] * 4 + ["present"] * 4
    assert again.workers == 0  # nothing to compile
    # the lowering's own cache remembered its failures: warming it compiles nothing
    here = warm.warm(manifest, ["cuda:90"], cache=fresh, jobs=1)
    assert here.workers == 0 and here.count("left-out") == 2
    assert warm.compile_manifest(manifest, ["cuda:90"], cache=fresh)["cuda:90"] == [
        r.key for r in here.results if r.status == "present"
    ]


def test_a_pinned_config_keeps_the_block_its_pre_hook_set(
    tmp_path, fresh, monkeypatch, jaxlib_0112
):
    from bridge import warm

    manifest = tmp_path / "tma.jsonl"
    monkeypatch.setenv("KERNELCACHE_RECORD", str(manifest))
    decoded(tma_call(fresh, autotune="runtime"), X)
    monkeypatch.delenv("KERNELCACHE_RECORD")
    records = [json.loads(line) for line in manifest.read_text().splitlines()]
    assert [r["variant"]["args"]["x_desc"]["tensordesc"]["block_shape"] for r in records] == [
        [32, 64],
        [64, 32],
        [16, 128],
    ]
    # one record warms the very kernel its lowering compiled
    assert [warm.compile_record(r, "cuda:90", fresh) for r in records] == [
        r["key"] for r in records
    ]
    (pinned,) = tune.tune(str(manifest), fresh, pins={"tma_double_kernel": 1})
    assert pinned.status == "pinned", pinned.detail
    (call,) = decoded(tma_call(fresh, autotune="require"), X)
    desc = call.kernel_call.parameters[0].tensor_descriptor.nvidia
    assert list(desc.block_shape) == [64, 32]
    assert (call.kernel_call.grid_0, call.kernel_call.grid_1) == (2, 8)


# == autotune decisions of examples' matmul ===================================================
A = jax.ShapeDtypeStruct((512, 256), jnp.bfloat16)
B = jax.ShapeDtypeStruct((256, 384), jnp.bfloat16)
MATMUL = "examples.kernels:matmul_kernel"


def lower(cache, **kw):
    (call,) = decoded(lambda x, y: ops.matmul(x, y, target="cuda:90", cache=cache, **kw), A, B)
    return call


def record_matmul_manifest(tmp_path: Path, cache, monkeypatch) -> Path:
    manifest = tmp_path / "manifest.jsonl"
    monkeypatch.setenv("KERNELCACHE_RECORD", str(manifest))
    lower(cache, autotune="runtime")
    monkeypatch.delenv("KERNELCACHE_RECORD")
    return manifest


# -- the decision document ---------------------------------------------------------------------
def _decision(**kw) -> Decision:
    base = dict(
        kernel=MATMUL,
        target="cuda:90",
        device="NVIDIA H200",
        variants=("a" * 32, "b" * 32, "c" * 32),
        configs=("BM: 128", "BM: 64", "BM: 32"),
        chosen=1,
        times=(2.0e-3, 1.0e-3, None),
        margin=1.0,
        noise=0.01,
        reasons={2: "out of resources"},
    )
    return Decision(**{**base, **kw})


def test_a_decision_reads_back_as_written():
    made = _decision()
    assert decisions.parse(made.to_bytes(), made.variants) == made
    assert made.config == "BM: 64" and made.metadata()["kind"] == "decision"


@pytest.mark.parametrize(
    "edit, why",
    [
        ({"variants": ["a" * 32]}, "other variants"),
        ({"chosen": 3}, "out of range"),
        ({"chosen": True}, "out of range"),
        ({"times": [1.0, float("nan"), None]}, "not durations"),
        ({"times": [1.0, -1.0, None]}, "not durations"),
        ({"configs": ["x"]}, "configs"),
        ({"reasons": {"7": "x"}}, "reasons"),
        ({"margin": "big"}, "margin"),
        ({"device": ""}, "device"),
        ({"format": 2}, "format"),
        ({"reasons": {"\u00b2": "x"}}, "reasons"),  # a digit, but not one int() reads
        ({"reasons": {"1": "out of resources"}}, "says cannot run"),
        ({"pinned": True}, "pinned but names a device"),
        ({"device": decisions.ANY_DEVICE}, "names no device"),
        ({"times": []}, "has no time"),
        ({"times": [1.0, None, None]}, "has no time"),
        # numbers Python cannot read or compare as floats: an error raised, not a reason
        ({"reasons": {"1" * 4400: "x"}}, "reasons"),
        ({"spent": 10**400}, "measuring time"),
        ({"times": [1.0, 10**400, None]}, "not durations"),
        ({"noise": 10**400}, "margin, noise"),
    ],
)
def test_an_odd_decision_is_refused_with_a_reason(edit, why):
    made = _decision()
    doc = {**made.to_json(), **edit}
    found = decisions.parse(json.dumps(doc).encode(), made.variants)
    assert isinstance(found, str) and why in found


@pytest.mark.parametrize("raw", [b"", b"[", b"[]", b"\xff", b"1e999", b"{" * 5000])
def test_garbage_is_refused_never_raised(raw):
    assert isinstance(decisions.parse(raw, ["a" * 32]), str)


def test_ties_within_the_tolerance_go_to_the_earliest_config():
    assert decisions.choose([1.0, 0.5, 0.505]) == 1
    assert decisions.choose([0.51, 0.5]) == 0  # within 2 %: the kernel's own order decides
    assert decisions.choose([None, 2.0, 1.0]) == 2
    assert decisions.choose([None, None]) is None
    assert decisions.margin([1.0, 0.5, 0.75], 1) == pytest.approx(0.5)
    assert decisions.margin([None, 0.5], 1) is None


def test_the_key_depends_on_variants_inputs_and_device():
    v, inputs = ["a" * 32, "b" * 32], {"arrays": {"x": [[4], "float32"]}, "key": {"n": 4}}
    key = decisions.decision_key(v, inputs, "NVIDIA H200")
    assert len(key) == 64 and key == decisions.decision_key(v, inputs, "NVIDIA H200")
    steps = decisions.decision_steps(v, inputs, "NVIDIA H200")
    assert key == digest_of(steps) and set(steps) == {"format", "variants", "inputs", "device"}
    assert key != decisions.decision_key(v[::-1], inputs, "NVIDIA H200")
    assert key != decisions.decision_key(v, {**inputs, "key": {"n": 8}}, "NVIDIA H200")
    assert key != decisions.decision_key(v, inputs, "NVIDIA H100")


# -- lowering -----------------------------------------------------------------------------------
def test_without_a_decision_every_config_is_lowered(fresh):
    call = lower(fresh)
    assert len(call.autotuned_kernel_call.configs) == 4


def test_require_without_a_decision_names_kernelcache_tune(fresh):
    with pytest.raises(bridge.AutotuneError, match="kernelcache tune"):
        lower(fresh, autotune="require")
    with pytest.raises(bridge.KernelArgumentError, match="not one of"):
        lower(fresh, autotune="sometimes")


def test_a_pinned_decision_lowers_the_one_chosen_kernel(tmp_path, fresh, monkeypatch):
    every = lower(fresh, autotune="runtime").autotuned_kernel_call.configs
    manifest = record_matmul_manifest(tmp_path, fresh, monkeypatch)
    (result,) = tune.tune(str(manifest), fresh, pins={"matmul_kernel": 2})
    assert result.status == "pinned" and result.decision.chosen == 2
    assert result.decision.device == decisions.ANY_DEVICE and result.decision.pinned
    for mode in ("decided", "require", "job"):
        call = lower(fresh, autotune=mode)
        assert call.HasField("kernel_call"), mode  # one plain kernel call: nothing to autotune
        assert call.kernel_call.kernel == every[2].kernel_call.kernel
        assert call.kernel_call.grid_0 == every[2].kernel_call.grid_0
    assert len(lower(fresh, autotune="runtime").autotuned_kernel_call.configs) == 4
    # another shape is another decision
    (other,) = decoded(
        lambda x, y: ops.matmul(x, y, target="cuda:90", cache=fresh),
        A,
        jax.ShapeDtypeStruct((256, 512), jnp.bfloat16),
    )
    assert len(other.autotuned_kernel_call.configs) == 4


def test_a_pin_outside_the_kernels_configs_is_refused(tmp_path, fresh, monkeypatch):
    manifest = record_matmul_manifest(tmp_path, fresh, monkeypatch)
    from bridge.exceptions import PinError

    with pytest.raises(PinError, match="4 configs"):  # a usage error: nothing is stored
        tune.tune(str(manifest), fresh, pins={MATMUL: 4})


def test_a_decision_for_pruned_variants_is_not_used(tmp_path, fresh, monkeypatch):
    """Pinning BM=64 drops two configs: the pinned decision was for the four."""
    manifest = record_matmul_manifest(tmp_path, fresh, monkeypatch)
    tune.tune(str(manifest), fresh, pins={MATMUL: 0})
    call = lower(fresh, BM=64)
    assert len(call.autotuned_kernel_call.configs) == 2


# -- the command --------------------------------------------------------------------------------
LOWER_MATMUL = """
import json, sys, jax, jax.numpy as jnp
sys.path.insert(0, {tests!r})
from bridge_helpers import decoded, kernels_of
from examples import ops
a = jax.ShapeDtypeStruct((512, 256), jnp.bfloat16)
b = jax.ShapeDtypeStruct((256, 384), jnp.bfloat16)
(call,) = decoded(lambda x, y: ops.matmul(x, y, target="cuda:90"), a, b)
print(json.dumps({{"kernels": [k.num_warps for k in kernels_of(call)],
                  "plain": call.HasField("kernel_call")}}))
"""


def test_kernelcache_tune_pin_and_a_job_that_requires_decisions(tmp_path, fresh, monkeypatch):
    manifest = record_matmul_manifest(tmp_path, fresh, monkeypatch)
    root = Path(fresh.root)
    bad = kc(root, "tune", str(manifest), "--pin", "nosuchkernel=1")
    assert bad.returncode == 2 and "nosuchkernel" in bad.stderr
    for index in ("9", "-1"):  # a config the kernel does not have: nothing is stored
        bad = kc(root, "tune", str(manifest), "--pin", f"matmul_kernel={index}")
        assert bad.returncode == 2, bad.stdout + bad.stderr
        assert "the kernel has 4 configs (0 to 3)" in bad.stderr or "INDEX" in bad.stderr
    assert not list(root.glob("*.decision")), "a bad pin stores no decision"
    for gpus in ("0", "-1", "two"):
        bad = kc(root, "tune", str(manifest), "--gpus", gpus)
        assert bad.returncode == 2 and "--gpus" in bad.stderr and "1 or more" in bad.stderr
    doc = kc_json(root, "tune", str(manifest), "--pin", "matmul_kernel=1")
    (result,) = doc["results"]
    assert result["status"] == "pinned" and result["decision"]["chosen"] == 1
    assert len(list(root.glob("*.decision"))) == 1
    assert result["decision"]["configs"][1].startswith("BM: 128, BN: 64")
    human = kc(root, "tune", str(manifest), "--pin", "matmul_kernel=1").stdout
    assert "pinned config 1" in human
    # a pattern selects among the recorded targets; one that selects none is a usage error
    picked = kc_json(root, "tune", str(manifest), "--pin", "matmul_kernel=1", "--target", "cu*")
    assert [r["target"] for r in picked["results"]] == ["cuda:90"]
    none = kc(root, "tune", str(manifest), "--pin", "matmul_kernel=1", "--target", "hip:*")
    assert none.returncode == 2
    assert "hip:* matches no target" in none.stderr and "recorded: cuda:90" in none.stderr
    code = LOWER_MATMUL.format(tests=str(HELPERS))
    env = child_env(KERNELCACHE_DIR=str(root), KERNELCACHE_AUTOTUNE="require")
    proc = checked(
        subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=240
        )
    )
    out = json.loads(proc.stdout.splitlines()[-1])
    assert out == {"kernels": [4], "plain": True}
    listed = kc_json(root, "ls", "--kind", "all")
    kinds = [e.get("kind") for e in listed["entries"]]
    assert kinds.count("decision") == 1
    assert kc(root, "verify").returncode == 0


def test_decisions_travel_like_entries(tmp_path, fresh, monkeypatch):
    """A read-only layer and a bundle carry decisions as they carry kernels."""
    manifest = record_matmul_manifest(tmp_path, fresh, monkeypatch)
    tune.tune(str(manifest), fresh, pins={"matmul_kernel": 3})
    bundle = tmp_path / "decisions.tar"
    assert kc(Path(fresh.root), "export", str(bundle)).returncode == 0
    other = tmp_path / "fresh"
    other.mkdir()
    assert kc(other, "import", str(bundle)).returncode == 0
    for layered in (
        kernelcache.Cache(other, readonly_roots=(), remote=""),
        kernelcache.Cache(tmp_path / "empty", readonly_roots=(fresh.root,), remote=""),
    ):
        call = lower(layered)
        assert call.HasField("kernel_call") and call.kernel_call.kernel.num_warps == 4


# -- the ranks of a job decide together -----------------------------------------------------------
JOB = """
import json, os, sys
sys.path.insert(0, {tests!r})
from bridge.tune import measure
from stand_in_gpu import TableMeasurer, read_log

measure.use(TableMeasurer([3e-3, 1e-3, 2e-3, 4e-3], [os.environ["LANE"]],
                          sleep=float(os.environ["MEASURE_SECONDS"]), log={log!r}))
import jax, jax.numpy as jnp
from bridge_helpers import decoded, kernels_of
from examples import ops
a = jax.ShapeDtypeStruct((512, 256), jnp.bfloat16)
b = jax.ShapeDtypeStruct((256, 384), jnp.bfloat16)
(call,) = decoded(lambda x, y: ops.matmul(x, y, target="cuda:90", autotune="job"), a, b)
print(json.dumps({{"kernels": [k.num_warps for k in kernels_of(call)],
                  "grid": call.kernel_call.grid_1 if call.HasField("kernel_call") else None}}))
"""


def _job(
    root: Path, log: Path, seconds: float, lane: str = "node/gpu0", readonly: str = ""
) -> subprocess.Popen:
    code = JOB.format(tests=str(HELPERS), log=str(log))
    env = child_env(KERNELCACHE_DIR=str(root), MEASURE_SECONDS=str(seconds), LANE=lane)
    if readonly:
        env["KERNELCACHE_READONLY_DIRS"] = readonly
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _result(proc: subprocess.Popen) -> dict:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out.splitlines()[-1])


def _screeners(log: Path) -> dict[int, set[int]]:
    """{config: the processes that screened it} (a screening is three timings in a row; the
    final rounds come after every screening)."""
    found: dict[int, list[int]] = {}
    for pid, _, index, what, _ in read_log(log):
        if what == "begin":
            found.setdefault(index, []).append(pid)
    return {index: set(pids[:3]) for index, pids in found.items()}


def _final_runners(log: Path) -> set[int]:
    """The processes that timed a config after its screening (the final rounds)."""
    seen: dict[int, int] = {}
    found = set()
    for pid, _, index, what, _ in read_log(log):
        if what == "begin":
            seen[index] = seen.get(index, 0) + 1
            if seen[index] > 3:
                found.add(pid)
    return found


def _started(log: Path, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 240
    while not (log.exists() and log.read_text().strip()):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
        time.sleep(0.05)


def test_the_ranks_of_a_job_share_the_screening_and_run_one_decision(tmp_path):
    root, log = tmp_path / "root", tmp_path / "measured"
    slow = _job(root, log, 2.0, "node/gpu0")  # its first config keeps it busy for 6 s
    _started(log, slow)
    others = [_job(root, log, 0.05, f"node/gpu{i}") for i in (1, 2, 3)]
    results = [_result(p) for p in (slow, *others)]
    assert results == [{"kernels": [4], "grid": 6}] * 4  # config 1 (BM 128, BN 64): 1 ms
    screened = _screeners(log)
    assert sorted(screened) == [0, 1, 2, 3]
    assert all(len(pids) == 1 for pids in screened.values()), screened  # once per job
    assert len(set().union(*screened.values())) >= 2, "the waiting ranks helped"
    (entry,) = root.glob("*.decision")
    made = json.loads(entry.read_bytes())
    assert made["chosen"] == 1 and {b for b in made["by"]} >= {"node/gpu0"}
    # the final rounds: run by the rank that took the decision's lock, which may have come
    # after every config was screened (and screened none)
    assert len(set(made["by"])) >= 2 and made["final_by"] in {f"node/gpu{i}" for i in range(4)}
    assert sum(made["launches"]) > 4 * 3 and made["spent"] > 0
    assert len(_final_runners(log)) == 1, "one rank ran the final rounds"


def test_ranks_sharing_one_gpu_never_measure_at_once(tmp_path):
    root, log = tmp_path / "root", tmp_path / "measured"
    procs = [_job(root, log, 0.1, "node/shared") for _ in range(3)]
    assert [_result(p) for p in procs] == [{"kernels": [4], "grid": 6}] * 3
    spans = []
    open_at: dict[int, float] = {}
    for pid, _, _, what, at in read_log(log):
        if what == "begin":
            open_at[pid] = at
        else:
            spans.append((open_at.pop(pid), at))
    spans.sort()
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans)), "two ranks measured at once"


def test_a_killed_screener_is_taken_over(tmp_path):
    root, log = tmp_path / "root", tmp_path / "measured"
    first = _job(root, log, 600.0, "node/gpu0")
    _started(log, first)
    (killed_config,) = {index for _, _, index, _, _ in read_log(log)}
    others = [_job(root, log, 0.05, f"node/gpu{i}") for i in (1, 2)]
    time.sleep(2.0)
    os.kill(first.pid, signal.SIGKILL)
    first.wait()
    assert [_result(p) for p in others] == [{"kernels": [4], "grid": 6}] * 2
    screened = _screeners(log)
    assert first.pid in screened[killed_config] and len(screened[killed_config]) == 2


def StandIn() -> TableMeasurer:
    """Plays a GPU: config 1 is fastest (milliseconds per config: 3, 1, 2), config 3 cannot
    be launched."""
    return TableMeasurer((3e-3, 1e-3, 2e-3, None))


@pytest.fixture
def stand_in():
    measurer = StandIn()
    previous = measure.use(measurer)
    yield measurer
    measure.use(previous)


def test_a_forced_tune_replaces_the_measured_decision(tmp_path, fresh, monkeypatch, stand_in):
    manifest = record_matmul_manifest(tmp_path, fresh, monkeypatch)
    assert [r.decision.chosen for r in tune.tune(str(manifest), fresh)] == [1]
    stand_in.times = [3e-3, 2e-3, 1e-3, 4e-3]  # the GPU changed its mind: config 2 is fastest
    (kept,) = tune.tune(str(manifest), fresh)
    assert kept.status == "present" and kept.decision.chosen == 1
    assert lower(fresh, autotune="require").kernel_call.grid_1 == 6  # config 1: BN 64
    (forced,) = tune.tune(str(manifest), fresh, force=True)
    assert forced.status == "tuned" and forced.decision.chosen == 2
    call = lower(fresh, autotune="require")
    assert call.HasField("kernel_call") and call.kernel_call.grid_1 == 3  # config 2: BN 128


def test_tune_spreads_the_configs_over_gpus_into_one_decision(tmp_path, fresh, monkeypatch):
    manifest = record_matmul_manifest(tmp_path, fresh, monkeypatch)
    lanes = ("node/gpu0", "node/gpu1")
    previous = measure.use(TableMeasurer((3e-3, 1e-3, 2e-3, None), lanes, sleep=0.05))
    try:
        (result,) = tune.tune(str(manifest), fresh, gpus=2)
    finally:
        measure.use(previous)
    made = result.decision
    assert result.status == "tuned" and made.chosen == 1
    assert set(made.by[:3]) == set(lanes) and made.by[3] in lanes  # each config screened
    assert made.final_by == "node/gpu0" and made.launches[3] == 0 and made.spent > 0
    assert made.wall is not None and made.wall < made.spent  # two GPUs at once
    assert "on node/gpu0, node/gpu1" in result.line()
    stored = decisions.find(fresh, [tune_key(result, fresh)], made.variants)
    assert stored == made


def tune_key(result, cache) -> str:
    (entry,) = Path(cache.root).glob(f"*.{DECISION.ext}")
    return entry.name.split(".")[0]


def test_tune_replays_recorded_calls_and_measures_them(tmp_path, fresh, monkeypatch, stand_in):
    manifest = record_matmul_manifest(tmp_path, fresh, monkeypatch)
    (result,) = tune.tune(str(manifest), fresh)
    assert result.status == "tuned" and stand_in.benched == [[0, 1, 2, 3]]
    made = result.decision
    assert made.device == "Stand-in GPU" and made.chosen == 1
    assert made.reasons == {3: "the stand-in cannot launch config 3"}
    assert made.margin == pytest.approx(1.0) and not made.pinned
    assert "* " in result.line() and "margin 100.0%" in result.line()
    assert [r.status for r in tune.tune(str(manifest), fresh)] == ["present"]
    assert [r.status for r in tune.tune(str(manifest), fresh, force=True)] == ["tuned"]
    call = lower(fresh, autotune="require")  # this "device" has its decision now
    assert call.HasField("kernel_call") and call.kernel_call.grid_1 == 6


def test_a_replayed_call_keys_like_the_lowering(tmp_path, fresh, monkeypatch):
    manifest = record_matmul_manifest(tmp_path, fresh, monkeypatch)
    (group,) = tune.recorded_calls(str(manifest))
    assert group.targets == ["cuda:90"] and group.outputs == ["c_ptr"]
    target = bridge.parse_target("cuda:90")
    replayed = tune.traced_call(group, target, fresh)
    specs = tune.specialize_call(
        replayed.parts, replayed.named, replayed.kwargs, replayed.options, target, fresh
    )
    recorded = [json.loads(line)["key"] for line in manifest.read_text().splitlines()]
    assert [s.key for s in specs] == recorded
    assert len(group.grids) == 4


def test_a_call_with_constexpr_keywords_replays_each_configs_grid(tmp_path, fresh, monkeypatch):
    sys.path.insert(0, str(REPO / "benchmarks"))
    import triton
    from tuned_models import attention_fwd_kernel

    q = jax.ShapeDtypeStruct((4, 256, 64), jnp.bfloat16)

    def attention(q, k, v, **kw):
        return bridge.triton_call(
            q,
            k,
            v,
            256,
            kernel=attention_fwd_kernel,
            out_shape=q,
            grid=lambda meta: (triton.cdiv(256, meta["BLOCK_M"]), 4),
            HEAD_DIM=64,
            SM_SCALE=0.125,
            target="cuda:90",
            cache=fresh,
            **kw,
        )

    manifest = tmp_path / "attention.jsonl"
    monkeypatch.setenv("KERNELCACHE_RECORD", str(manifest))
    (every,) = decoded(attention, q, q, q)
    monkeypatch.delenv("KERNELCACHE_RECORD")
    (group,) = tune.recorded_calls(str(manifest))
    target = bridge.parse_target("cuda:90")
    replayed = tune.traced_call(group, target, fresh)
    lowered = tune.specialize_call(
        replayed.parts, replayed.named, replayed.kwargs, replayed.options, target, fresh
    )
    grids = [kernel_objects.eval_grid(replayed.grid, s.bound.bound_args) for s in lowered]
    want = [
        (c.kernel_call.grid_0, c.kernel_call.grid_1, 1) for c in every.autotuned_kernel_call.configs
    ]
    assert grids == want and len(set(grids)) == 2


def test_warm_compiles_only_decided_configs_unless_told(tmp_path, fresh, monkeypatch):
    from bridge.warm import warm

    manifest = record_matmul_manifest(tmp_path, fresh, monkeypatch)
    image = kernelcache.Cache(tmp_path / "image", readonly_roots=(), remote="")
    tune.tune(str(manifest), image, pins={"matmul_kernel": 2})
    report = warm(str(manifest), ["cuda:90"], cache=image, jobs=1)
    assert [o.status for o in report.results] == ["compiled"]
    assert report.results[0].config.startswith("BM: 64, BN: 128")
    report = warm(str(manifest), ["cuda:90"], cache=image, jobs=1, all_configs=True)
    assert sorted(o.status for o in report.results) == ["compiled"] * 3 + ["present"]


@pytest.mark.skipif(REDIS_SERVER is None, reason=SKIP_REASON)
def test_decisions_travel_through_redis_signed(tmp_path, fresh, monkeypatch):
    """One machine pins; another, with an empty root and the same signing key, lowers the
    decided kernel from the shared tier; with another key the value is refused."""
    monkeypatch.setenv("KERNELCACHE_SIGNING_KEY", "k" * 32)
    manifest = record_matmul_manifest(tmp_path, fresh, monkeypatch)
    with RedisServer(tmp_path / "redis") as server:
        first = kernelcache.Cache(tmp_path / "one", readonly_roots=(), remote=server.url)
        (result,) = tune.tune(str(manifest), first, pins={"matmul_kernel": 3})
        assert result.status == "pinned"
        other = kernelcache.Cache(tmp_path / "two", readonly_roots=(), remote=server.url)
        call = lower(other)
        assert call.HasField("kernel_call") and call.kernel_call.grid_0 == 8
        assert list((tmp_path / "two").glob("*.decision")), "published locally"
        monkeypatch.setenv("KERNELCACHE_SIGNING_KEY", "z" * 32)
        third = kernelcache.Cache(tmp_path / "three", readonly_roots=(), remote=server.url)
        assert len(lower(third).autotuned_kernel_call.configs) == 4


# -- replaced and ignored decisions -------------------------------------------------------------
def test_tune_pins_in_place_of_the_decision_a_lowering_runs(tmp_path, fresh, monkeypatch):
    every = lower(fresh, autotune="runtime").autotuned_kernel_call.configs
    manifest = record_matmul_manifest(tmp_path, fresh, monkeypatch)
    root = Path(fresh.root)
    for args, index in (
        (["--pin", "matmul_kernel=0"], 0),
        (["--pin", "matmul_kernel=3", "--force"], 3),
        (["--pin", "matmul_kernel=2"], 2),
    ):
        done = kc(root, "tune", str(manifest), *args)
        assert done.returncode == 0 and f"pinned config {index}" in done.stdout, done.stderr
        call = lower(fresh)  # this process read the decision before: it reads the new one
        assert call.HasField("kernel_call"), args
        assert call.kernel_call.kernel == every[index].kernel_call.kernel
        assert call.kernel_call.grid_0 == every[index].kernel_call.grid_0
    (entry,) = root.glob("*.decision")
    assert json.loads(entry.read_bytes())["chosen"] == 2
    assert not (root / ".quarantine").exists() and kc(root, "verify").returncode == 0


@pytest.fixture(scope="module")
def pinned(tmp_path_factory):
    """A root holding the kernels of the matmul call, the document of a decision pinning its
    config 1, that decision's key, and the key of a decision for the stand-in GPU."""
    base = tmp_path_factory.mktemp("pinned")
    kernels = kernelcache.Cache(base / "kernels", readonly_roots=(), remote="")
    with pytest.MonkeyPatch.context() as patch:
        manifest = record_matmul_manifest(base, kernels, patch)
    scratch = kernelcache.Cache(base / "scratch", readonly_roots=(kernels.root,), remote="")
    tune.tune(str(manifest), scratch, pins={"matmul_kernel": 1})
    (entry,) = Path(scratch.root).glob("*.decision")
    (group,) = tune.recorded_calls(str(manifest))
    target = bridge.parse_target("cuda:90")
    specs = tune._specs(group, target, kernels)
    named, _, _ = group.call.revived(target, [0])
    device, anywhere = decisions.keys_of(specs[0].parts, named, specs, ["Stand-in GPU"])
    assert entry.name == f"{anywhere}.decision"
    return kernels.root, json.loads(entry.read_bytes()), anywhere, device


def _doc(doc: dict, **edit) -> bytes:
    return json.dumps({**doc, **edit}).encode()


#: decision documents a lowering ignores, and why (as the warning says)
MALFORMED = {
    "chosen out of range": (lambda d: _doc(d, chosen=4), "out of range"),
    "chosen negative": (lambda d: _doc(d, chosen=-1), "out of range"),
    "chosen as a string": (lambda d: _doc(d, chosen="1"), "out of range"),
    "variants reordered": (lambda d: _doc(d, variants=d["variants"][::-1]), "other variants"),
    "a variant replaced": (lambda d: _doc(d, variants=[*d["variants"][:3], "f" * 64]), "other"),
    "stale times": (lambda d: _doc(d, times=[1e-3, 2e-3, 3e-3]), "stale times"),
    "2 MB": (lambda d: _doc(d, padding="x" * (2 << 20)), "too large"),
    "deeply nested": (
        lambda d: _doc(d)[:-1] + b', "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        "nested too deeply",
    ),
    "truncated": (lambda d: _doc(d)[:-3], "not JSON"),
    "another format": (lambda d: _doc(d, format=2), "unknown format"),
    "a reason keyed by a digit int() cannot read": (
        lambda d: _doc(d, reasons={"\u00b2": "x"}),
        "reasons are malformed",
    ),
    "chooses a config it says cannot run": (
        lambda d: _doc(d, reasons={"1": "out of resources"}),
        "says cannot run",
    ),
    "launches for other variants": (lambda d: _doc(d, launches=[3, 4]), "launches do not match"),
    "launches negative": (lambda d: _doc(d, launches=[0, -1, 0, 0]), "launches are not counts"),
    "measurers not text": (lambda d: _doc(d, by=[1, 2, 3, 4]), "measurers do not match"),
    "negative GPU time": (lambda d: _doc(d, spent=-1.0), "measuring time"),
    "a final measurer not text": (lambda d: _doc(d, final_by=7), "final measurer"),
}
DECISION_META = {"kind": "decision", "name": "matmul_kernel"}


def decision_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "bridge.entries.decisions"]


@pytest.mark.parametrize("name", list(MALFORMED))
def test_an_ignored_decision_is_warned_about_once(name, pinned, tmp_path, caplog):
    kernels, doc, key, _ = pinned
    make, why = MALFORMED[name]
    cache = kernelcache.Cache(tmp_path / "root", readonly_roots=(kernels,), remote="")
    cache.put(key, DECISION.ext, make(doc), DECISION_META)
    caplog.set_level(logging.WARNING, logger="bridge")
    for _ in range(2):
        assert len(lower(cache).autotuned_kernel_call.configs) == 4  # as without a decision
    (said,) = decision_warnings(caplog)
    assert key in said and why in said
    with pytest.raises(bridge.AutotuneError, match="no autotune decision"):
        lower(cache, autotune="require")
    assert len(decision_warnings(caplog)) == 1


@pytest.mark.parametrize("name", ["chosen out of range", "deeply nested", "a variant replaced"])
def test_job_mode_measures_in_place_of_a_malformed_decision(
    name, pinned, tmp_path, caplog, stand_in
):
    kernels, doc, _, key = pinned
    cache = kernelcache.Cache(tmp_path / "root", readonly_roots=(kernels,), remote="")
    cache.put(key, DECISION.ext, MALFORMED[name][0](doc), DECISION_META)
    caplog.set_level(logging.WARNING, logger="bridge")
    call = lower(cache, autotune="job")
    assert stand_in.benched == [[0, 1, 2, 3]]  # measured, as for an absent decision
    assert call.HasField("kernel_call") and call.kernel_call.grid_1 == 6  # config 1: 1 ms
    (said,) = decision_warnings(caplog)
    assert key in said and MALFORMED[name][1] in said
    made = decisions.parse(cache.get(key, DECISION.ext).data, doc["variants"])
    assert made.chosen == 1 and made.device == "Stand-in GPU"  # stored in its place
    assert lower(cache, autotune="job").HasField("kernel_call")
    assert stand_in.benched == [[0, 1, 2, 3]]


def test_a_job_measures_once_in_place_of_a_malformed_decision(pinned, tmp_path):
    kernels, doc, _, key = pinned
    root, marker = tmp_path / "root", tmp_path / "measured"
    bad = MALFORMED["chosen out of range"][0](doc)
    kernelcache.Cache(root, readonly_roots=(), remote="").put(key, "decision", bad, DECISION_META)
    procs = [_job(root, marker, 0.2, f"node/gpu{i}", str(kernels)) for i in range(3)]
    results = [_result(p) for p in procs]
    screened = _screeners(marker)
    assert all(len(pids) == 1 for pids in screened.values()), "each config screened once"
    assert len(_final_runners(marker)) == 1, "one process ran the final rounds"
    assert results == [{"kernels": [4], "grid": 6}] * 3
    fixed = kernelcache.Cache(root, readonly_roots=(), remote="").get(key, "decision")
    assert decisions.parse(fixed.data, doc["variants"]).chosen == 1
