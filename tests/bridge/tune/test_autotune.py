"""Triton's autotuner, faithfully: backend options in configs, configs that cannot compile or
launch left out (and remembered in the cache), pre_hooks run at lowering, and autotune
decisions that never choose a left-out config.

Lowered for cuda:90 and hip:gfx942 on this CPU machine; the kernels are in
tests/autotuner_kernels.py (importable by child processes and warm).
"""

from __future__ import annotations

import json
import logging
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
from conftest import child_env
from stand_in_gpu import TableMeasurer
from test_cli_support import kc, kc_json

import bridge
import kernelcache
from bridge import versions
from bridge.cli import tune
from bridge.compile import fetch, variants
from bridge.entries import decisions, failures
from bridge.entries.kinds import DECISION, derived_key
from bridge.lowering import lower as bridge_call
from bridge.tune import measure

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
    entries = kc_json(root, "ls")["entries"]
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
        bridge_call._memo.clear()
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
    bridge_call._memo.clear()
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
        bridge_call._memo.clear()
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
    tests = str(Path(__file__).parent)
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
