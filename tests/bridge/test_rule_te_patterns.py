"""``bridge.triton_call_lowering`` on every calling pattern of TransformerEngine's own callers,
with kernels whose signatures interleave pointers, sizes, strides, ``None`` pointers and metas as
TE's do (tests/helpers/te_patterns.py; docs/bridge.md lists the patterns): scalars named in
``constexprs`` bound at compile time and keyed, absent optional inputs and outputs given as
``None``, results written in place through the operand they alias (in the rule's order),
autotuned kernels with a pinned block size or a callable grid, Gluon with a layout constexpr,
``enable_fp_fusion``. Lowered for cuda:90, hip:gfx942 and hip:gfx950 on a machine with no GPU,
again in a second process (no compile), and run on the GPU machine against ``jnp``."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import te_patterns as P
import triton.language as tl
from bridge_helpers import cuda_devices, kernels_of, lowered_module, run_child
from support import HELPERS
from te_primitives import (
    AXPY_ALPHA,
    PLATFORMS,
    absmax_p,
    axpy_p,
    lowered,
    make_primitive,
    same_shape,
)

import bridge
from bridge.call.plain import plain
from bridge.compile import compiler as bridge_compile
from bridge.lowering import proto

#: pattern -> (operands, results, pointer parameters the kernel is launched with)
SHAPES = {
    "block_count": (1, 2, 3),
    "add_offsets": (2, 2, 2),
    "bump": (2, 2, 2),
    "gate": (1, 1, 2),
    "gate_bias": (2, 1, 3),
    "rownorm": (1, 1, 2),
    "rownorm_sumsq": (1, 2, 3),
    "scatter": (4, 2, 6),
    "scatter_probs": (4, 2, 6),
    "unpermute": (4, 2, 6),
    "axpy": (2, 1, 3),
    "axpy_fused": (2, 1, 3),
}


@pytest.fixture
def root(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNELCACHE_DIR", str(tmp_path / "root"))
    return tmp_path / "root"


def kernel_calls(call):
    message = proto.decode_opaque(call["opaque"])
    if message.HasField("kernel_call"):
        return [message.kernel_call]
    return [c.kernel_call for c in message.autotuned_kernel_call.configs]


def test_every_pattern_is_tested():
    assert set(SHAPES) == set(P.patterns("cuda:90"))


@pytest.mark.parametrize("pattern", list(SHAPES))
@pytest.mark.parametrize("target", list(PLATFORMS))
def test_a_te_pattern_lowers_with_its_scalars_compiled_in(root, monkeypatch, target, pattern):
    """One custom call of the rule's operands and results, launching the kernel with its
    pointers only (every scalar is in the kernel), compiled once, then found in the cache."""
    fn, avals = P.patterns(target)[pattern]
    n_in, n_out, n_pointers = SHAPES[pattern]
    compiles = bridge_compile.compile_count()
    (call,) = lowered(fn, target, *avals, monkeypatch=monkeypatch)
    assert (call["operands"], call["results"]) == (n_in, n_out)
    for kc in kernel_calls(call):
        assert [p.WhichOneof("value") for p in kc.parameters] == ["array"] * n_pointers
    assert bridge_compile.compile_count() - compiles == 1
    (again,) = lowered(fn, target, *avals, monkeypatch=monkeypatch)
    assert again["opaque"] == call["opaque"] and bridge_compile.compile_count() - compiles == 1


@pytest.mark.parametrize("target", ["cuda:90", "hip:gfx942"])
def test_a_scalar_in_constexprs_is_part_of_the_kernels_key(root, monkeypatch, target):
    """The same call with another value of a scalar runtime parameter is another kernel."""

    def rule(scale):
        def lowering(ctx, s):
            T, H = ctx.avals_in[0].shape
            return bridge.triton_call_lowering(
                ctx, P.gate_kernel, s, grid=(T // 64 + 1, H),
                constexprs={
                    "scale": scale, "lower_bound": 0.0, "T": T, "H": H, "BLOCK": 64,
                    "HAS_BIAS": False, "USE_LOWER": False, "CACHE": "", "offsets_ptr": None,
                    "bias_ptr": None,
                },
            )  # fmt: skip

        return make_primitive(f"kc_te_gate_scale_{scale}", same_shape, lowering)

    compiles = bridge_compile.compile_count()
    opaques = set()
    for scale in (0.5, 0.25):
        p = rule(scale)
        (call,) = lowered(lambda s, p=p: p.bind(s), target, P.GATE_S, monkeypatch=monkeypatch)
        opaques.add(call["opaque"])
    assert len(opaques) == 2 and bridge_compile.compile_count() - compiles == 2


def test_a_bound_scalar_and_a_runtime_one_are_different_lowerings(root, monkeypatch):
    """``bridge.triton_call`` passing a scalar runtime parameter as itself (a launch argument)
    and as ``tl.constexpr`` (bound at compile time, as the rule binds it) in one cache: two
    kernels, two lowerings; neither is served the other's stored lowering."""
    monkeypatch.setenv("KERNELCACHE_TARGET", "cuda:90")

    def call(wrap):
        def fn(x):
            return bridge.triton_call(
                x, kernel=P.rownorm_kernel, out_shape=x, out_names=("y_ptr",), grid=(64,),
                eps=wrap(P.NORM_EPS), n_cols=wrap(P.HIDDEN), sumsq_ptr=None, BD=256,
            )  # fmt: skip

        (message,) = [proto.decode_opaque(c["opaque"]) for c in _calls(fn, P.NORM_X)]
        return message

    compiles = bridge_compile.compile_count()
    runtime, bound = call(lambda v: v), call(tl.constexpr)
    assert bridge_compile.compile_count() - compiles == 2
    kinds = [[p.WhichOneof("value") for p in m.kernel_call.parameters] for m in (runtime, bound)]
    assert kinds == [["array", "array", "f32", "i32"], ["array", "array"]]
    assert call(lambda v: v) == runtime and call(tl.constexpr) == bound


def _calls(fn, *avals):
    from bridge_helpers import custom_calls

    return custom_calls(lowered_module(fn, *avals))


def test_results_aliasing_operands_come_back_in_the_rules_order(root, monkeypatch):
    """``input_output_aliases={0: 1, 1: 0}`` on a kernel with no result parameters: the rule's
    result 0 is the buffer of operand 1, result 1 that of operand 0."""
    from jax._src.lib.mlir import ir

    monkeypatch.setenv("KERNELCACHE_TARGET", "cuda:90")
    module = lowered_module(P.bump_p.bind, P.VEC, P.SMALL).compiler_ir("stablehlo")
    found = {}

    def visit(op):
        if op.name in ("stablehlo.custom_call", "func.return"):
            found[op.name] = op
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    call, ret = found["stablehlo.custom_call"], found["func.return"]
    with module.context:
        aliases = str(call.attributes["output_operand_aliases"])
        shown = [ir.OpResult(v).result_number for v in ret.operands]
        owners = {ir.OpResult(v).owner == call for v in ret.operands}
    assert shown == [1, 0] and owners == {True}
    assert "output_tuple_indices = [0], operand_index = 0" in aliases
    assert "output_tuple_indices = [1], operand_index = 1" in aliases


@pytest.mark.parametrize("target", ["cuda:90", "hip:gfx950"])
def test_a_pinned_block_size_keeps_its_config_and_the_fixed_grid(root, monkeypatch, target):
    """TE's permutation: ``BLOCK`` pinned to the smallest config's, the grid computed from it;
    the config with that block size is the one compiled."""
    fn, avals = P.patterns(target)["scatter"]
    (call,) = lowered(fn, target, *avals, monkeypatch=monkeypatch)
    grids = {(kc.grid_0, kc.grid_1) for kc in kernel_calls(call)}
    assert grids == {(P.ROWS, -(-P.HIDDEN // P.SMALLEST_BLOCK))}


@pytest.mark.parametrize("target", ["cuda:90", "hip:gfx942"])
def test_num_warps_given_to_an_autotuned_kernel_is_ignored(root, monkeypatch, target):
    """TE's indexer passes ``num_warps=4, num_stages=2`` with an autotuned kernel: every
    config is compiled with its own (a callable grid per config)."""
    (call,) = lowered(lambda x: absmax_p.bind(x), target, P.VEC, monkeypatch=monkeypatch)
    message = proto.decode_opaque(call["opaque"])
    assert sorted({k.num_warps for k in kernels_of(message)}) == [4, 8]


@pytest.mark.parametrize("target", list(PLATFORMS))
def test_jax_typed_scalars_bind_as_the_plain_values_they_are(root, monkeypatch, target):
    """TE's permutation rules pass scalars as jax's ``TypedInt``: the kernel is the one plain
    ints give (one compile, the same module), and its read set is exact, not partial."""
    import json

    fn, avals = P.patterns(target)["unpermute"]
    compiles = bridge_compile.compile_count()
    (typed,) = lowered(fn, target, *avals, monkeypatch=monkeypatch)
    monkeypatch.setattr(P, "typed", int)
    (plain_ints,) = lowered(fn, target, *avals, monkeypatch=monkeypatch)
    assert typed["opaque"] == plain_ints["opaque"]
    assert bridge_compile.compile_count() - compiles == 1
    docs = [json.loads(p.read_text()) for p in root.glob("*.json")]
    (entry,) = [d for d in docs if d.get("ext") in ("cubin", "hsaco")]
    assert json.loads(entry["reads"])["partial"] == []


def test_fp_fusion_is_the_callers_choice(root, monkeypatch):
    fused = {}
    for flag in (False, True):
        fn, avals = P.patterns("cuda:90")["axpy_fused" if flag else "axpy"]
        (call,) = lowered(fn, "cuda:90", *avals, monkeypatch=monkeypatch)
        (kc,) = kernel_calls(call)
        fused[flag] = "fma.rn.f32" in kc.kernel.ptx
    assert fused == {False: False, True: True}


@pytest.mark.parametrize(
    ("constexprs", "message"),
    [
        ({"n_a": 1, "n_b": 1, "BLOCK": 256, "nope": 1}, "'nope', which is not a parameter"),
        ({"n_a": 1, "BLOCK": 256}, "n_b is neither an operand nor a result"),
        ({"n_a": 1, "n_b": 1, "a_ptr": None}, "result 0 lands on BLOCK, a tl.constexpr"),
    ],
)
def test_a_call_that_does_not_fit_is_named(root, monkeypatch, constexprs, message):
    def lowering(ctx, a):
        return bridge.triton_call_lowering(ctx, P.bump_kernel, a, grid=(1,), constexprs=constexprs)

    p = make_primitive("kc_te_misfit", same_shape, lowering)
    with pytest.raises(bridge.KernelArgumentError, match=message):
        lowered(lambda a: p.bind(a), "cuda:90", P.VEC, monkeypatch=monkeypatch)


def test_a_result_with_no_parameter_must_alias_an_operand(root, monkeypatch):
    def lowering(ctx, a, b):
        return bridge.triton_call_lowering(
            ctx, P.bump_kernel, a, b, grid=(1,), constexprs={"n_a": 1, "n_b": 1, "BLOCK": 256}
        )

    p = make_primitive("kc_te_unaliased", lambda a, b: same_shape(a), lowering)
    with pytest.raises(bridge.KernelArgumentError, match=r"result\(s\) 0 have no parameter"):
        lowered(lambda a, b: p.bind(a, b), "cuda:90", P.VEC, P.VEC, monkeypatch=monkeypatch)


def test_a_recorded_bound_scalar_is_revived_bound():
    from bridge.warm.manifest import revive

    assert plain({"n": tl.constexpr(7)}) == {"n": {"constexpr": 7}}
    value = revive({"constexpr": 7}, [0])
    assert isinstance(value, tl.constexpr) and value.value == 7


def test_a_second_process_lowers_the_same_modules_without_compiling(root):
    code = f"""
    import hashlib, json, sys
    sys.path.insert(0, {str(HELPERS)!r})
    import te_patterns as P, te_primitives as T
    from bridge.compile import compiler
    digests = {{}}
    for target in T.PLATFORMS:
        for name, (fn, avals) in P.patterns(target).items():
            (call,) = T.lowered(fn, target, *avals, monkeypatch=T.Env())
            digests[target + " " + name] = hashlib.sha256(call["opaque"]).hexdigest()
    print(json.dumps([digests, compiler.compile_count()]))
    """
    first = run_child(code, KERNELCACHE_DIR=str(root))
    second = run_child(code, KERNELCACHE_DIR=str(root))
    assert first[0] == second[0] and len(first[0]) == 3 * len(SHAPES)
    assert (first[1], second[1]) == (3 * len(SHAPES), 0)


# -- on the GPU machine ------------------------------------------------------------------------
def _block_reference(mask):
    nb = P.COUNTS.shape[1]
    padded = jnp.zeros((nb * P.BLOCK_ROWS, P.COLS), mask.dtype).at[: P.ROWS].set(mask)
    blocks = padded.reshape(nb, P.BLOCK_ROWS, P.COLS)
    cum = jnp.cumsum(blocks, axis=1).reshape(-1, P.COLS)[: P.ROWS]
    return cum, jnp.sum(blocks, axis=1).T


@pytest.mark.gpu
@pytest.mark.skipif(not cuda_devices(), reason="needs an NVIDIA GPU")
def test_te_patterns_compute_what_jnp_computes_on_the_gpu(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNELCACHE_DIR", str(tmp_path / "root"))
    keys = iter(jax.random.split(jax.random.PRNGKey(0), 8))
    mask = jax.random.bernoulli(next(keys), 0.3, (P.ROWS, P.COLS)).astype(jnp.int32)
    cum, counts = jax.jit(P.block_count_p.bind)(mask)
    want_cum, want_counts = _block_reference(mask)
    np.testing.assert_array_equal(cum, want_cum)
    np.testing.assert_array_equal(counts, want_counts)
    total, same = jax.jit(P.add_offsets_p.bind)(cum, counts)
    np.testing.assert_array_equal(total, jnp.cumsum(mask, axis=0))
    np.testing.assert_array_equal(same, want_counts)

    a, b = jnp.arange(4096, dtype=jnp.float32), jnp.arange(1000, dtype=jnp.int32)
    b_out, a_out = jax.jit(P.bump_p.bind)(a, b)
    np.testing.assert_array_equal(b_out, b + 10)
    np.testing.assert_array_equal(a_out, a + 1)

    s = jax.random.normal(next(keys), P.GATE_S.shape, jnp.float32)
    bias = jax.random.normal(next(keys), P.GATE_BIAS.shape, jnp.float32)
    np.testing.assert_allclose(jax.jit(P.gate_p.bind)(s)[0], P.gate_reference(s), rtol=1e-6)
    np.testing.assert_allclose(
        jax.jit(P.gate_p.bind)(s, bias)[0], P.gate_reference(s, bias), rtol=1e-6
    )

    x = jax.random.normal(next(keys), P.NORM_X.shape, jnp.float32)
    y_want, ss_want = P.rownorm_reference(x)
    np.testing.assert_allclose(jax.jit(P.rownorm_p.bind)(x)[0], y_want, rtol=1e-5, atol=1e-6)
    y, ss = jax.jit(P.rownorm_sumsq_p.bind)(x)
    np.testing.assert_allclose(y, y_want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ss, ss_want, rtol=1e-5)

    inp = jax.random.normal(next(keys), (P.ROWS, P.HIDDEN), jnp.float32)
    dest = jax.random.permutation(next(keys), P.ROWS).astype(jnp.int32)
    probs = jax.random.uniform(next(keys), (P.ROWS,), jnp.float32)
    pad = jnp.zeros((0,), jnp.int32)
    out, none = jax.jit(P.scatter_p[False].bind)(inp, dest, jnp.zeros((0,), jnp.float32), pad)
    np.testing.assert_array_equal(out, jnp.zeros_like(inp).at[dest].set(inp))
    assert none.shape == (0,)
    out, out_probs = jax.jit(P.scatter_p[True].bind)(inp, dest, probs, pad)
    np.testing.assert_array_equal(out, jnp.zeros_like(inp).at[dest].set(inp))
    np.testing.assert_array_equal(out_probs, jnp.zeros_like(probs).at[dest].set(probs))

    u, v = a / 7.0, jnp.flip(a) / 3.0
    for fusion in (False, True):
        got = jax.jit(axpy_p[(32, fusion)].bind)(u, v)[0]
        np.testing.assert_allclose(got, AXPY_ALPHA * u + v, rtol=1e-6)


def test_what_a_run_records_warms_the_other_targets(root, tmp_path):
    """``$KERNELCACHE_RECORD`` keeps the scalars the rule bound as bound; ``kernelcache warm``
    compiles them so for the other targets, where lowering then compiles nothing (Gluon layouts
    written for a warp size aside: they are the caller's, per target)."""
    from cli_support import kc
    from support import REPO

    manifest = tmp_path / "run.jsonl"
    code = """
    import json, sys
    sys.path.insert(0, {helpers!r})
    import te_patterns as P, te_primitives as T
    from bridge.compile import compiler
    for target in {targets!r}:
        for name, (fn, avals) in P.patterns(target).items():
            if not name.startswith("axpy"):
                T.lowered(fn, target, *avals, monkeypatch=T.Env())
    print(json.dumps(compiler.compile_count()))
    """
    others = ["hip:gfx942", "hip:gfx950"]
    recorded = run_child(
        code.format(helpers=str(HELPERS), targets=["cuda:90"]),
        KERNELCACHE_DIR=str(root),
        KERNELCACHE_RECORD=str(manifest),
    )
    assert recorded == len(SHAPES) - 2
    args = ["warm", str(manifest), "--json", *(x for t in others for x in ("--target", t))]
    proc = kc(root, *args, env={"PYTHONPATH": f"{REPO}:{HELPERS}"}, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lowered_after = run_child(
        code.format(helpers=str(HELPERS), targets=others), KERNELCACHE_DIR=str(root)
    )
    assert lowered_after == 0
