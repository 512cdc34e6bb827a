"""Which convention reads an ``out_shape=`` call: jax-triton 0.3's (positional arguments
flattened as a pytree, so a ``None`` vanishes; a dict alias keeps its output parameter) or the
ROCm fork's (Triton's binding; an input aliased through a dict ``input_output_aliases`` has no
output parameter: the kernel writes through it), and ``convention=`` where both fit.

Lowered on the CPU for cuda:90, hip:gfx942 and hip:gfx950, reading the custom call's operands,
aliases and kernel parameters; the ``gpu`` tests run the same calls on an NVIDIA GPU against
NumPy.

Run the GPU tests with:  python -m pytest -m gpu tests/bridge/call/test_conventions.py -v
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import triton
import triton.language as tl
from bridge_helpers import cuda_devices, custom_calls, lowered_module

import bridge
import kernelcache
from bridge.lowering import proto

TARGETS = [("cuda:90", "cuda"), ("hip:gfx942", "rocm"), ("hip:gfx950", "rocm")]
HAS_GPU = bool(cuda_devices())
N = 1000
LIMIT = tl.constexpr(N)
F = jax.ShapeDtypeStruct((N,), jnp.float32)


@triton.jit
def shift_kernel(x_ptr, shift_ptr, n, out_ptr, BLOCK: tl.constexpr):
    """out = x (+ shift, when a shift is bound)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    x = tl.load(x_ptr + offs, mask=m)
    if shift_ptr is not None:
        x += tl.load(shift_ptr + offs, mask=m)
    tl.store(out_ptr + offs, x, mask=m)


@triton.jit
def axpy_inplace_kernel(alpha, x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    """y += alpha * x, written through y: no output parameter."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    y = tl.load(y_ptr + offs, mask=m) + alpha * tl.load(x_ptr + offs, mask=m)
    tl.store(y_ptr + offs, y, mask=m)


@triton.jit
def splitk_reduce_kernel(
    parts_ptr, acc_ptr, K, N, sq_ptr, BLOCK_N: tl.constexpr, K_SPLIT: tl.constexpr
):
    """acc[n] += sum_k parts[k, n] (written through the aliased acc), sq[n] = sum_k parts^2."""
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, K_SPLIT)
    m = (offs_k[:, None] < K) & (offs_n[None, :] < N)
    tile = tl.load(parts_ptr + offs_k[:, None] * N + offs_n[None, :], mask=m, other=0.0)
    acc = tl.load(acc_ptr + offs_n, mask=offs_n < N)
    tl.store(acc_ptr + offs_n, acc + tl.sum(tile, axis=0), mask=offs_n < N)
    tl.store(sq_ptr + offs_n, tl.sum(tile * tile, axis=0), mask=offs_n < N)


@triton.jit
def pair_inc_kernel(pair, val_ptr, BLOCK: tl.constexpr):
    """pair[1] += val, written through the tuple's second pointer."""
    offs = tl.arange(0, BLOCK)
    tl.store(pair[1] + offs, tl.load(pair[1] + offs) + tl.load(val_ptr + offs))


@triton.jit
def pair_scale_kernel(pair, n, BLOCK: tl.constexpr = 8):
    """pair[0] *= 2 and pair[1] *= 3, in place."""
    offs = tl.arange(0, BLOCK)
    m = offs < n
    tl.store(pair[0] + offs, tl.load(pair[0] + offs, mask=m) * 2, mask=m)
    tl.store(pair[1] + offs, tl.load(pair[1] + offs, mask=m) * 3, mask=m)


@triton.jit
def either_kernel(a_ptr, b_ptr, c_ptr, d_ptr=None, BLOCK: tl.constexpr = 1024):
    """c = a + b when no d is bound; d = (a + b) * c when one is (a missing b adds nothing)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < LIMIT
    s = tl.load(a_ptr + offs, mask=m)
    if b_ptr is not None:
        s += tl.load(b_ptr + offs, mask=m)
    if d_ptr is None:
        tl.store(c_ptr + offs, s, mask=m)
    else:
        tl.store(d_ptr + offs, s * tl.load(c_ptr + offs, mask=m), mask=m)


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> kernelcache.Cache:
    return kernelcache.Cache(root=tmp_path_factory.mktemp("convention-kernels"))


def placed(cache, target):
    """Where a test call lowers: its target and cache, and inline HSACO on hip targets (one
    kernel call to decode, not the path hand-off's guarded pair); on the GPU (no target) the
    default embedding, whatever the installed jaxlib runs."""
    embed = "inline" if target and target.startswith("hip") else None
    return {"target": target, "embed": embed, "cache": cache}


def lowered(fn, *avals, target="cuda:90", platform="cuda"):
    """The one Triton custom call of ``fn`` lowered for ``platform``, and its kernel
    parameters (their kinds, ``array`` or a scalar type)."""
    (cc,) = custom_calls(lowered_module(fn, *avals, platform=platform))
    call = proto.decode_opaque(cc["opaque"])
    return cc, [p.WhichOneof("value") for p in call.kernel_call.parameters]


def aliased(cc) -> list[int]:
    """The operand index of each output_operand_alias of a custom call."""
    text = cc.get("aliases", "")
    return [int(part.split(",")[0]) for part in text.split("operand_index = ")[1:]]


def rand(shape, seed=0):
    return jax.random.normal(jax.random.PRNGKey(seed), shape, jnp.float32)


# -- jax-triton 0.3: a positional None vanishes --------------------------------------------------
def shift(cache, target, middle, **kw):
    """A call of shift_kernel on (x, *middle(s), N)."""
    return lambda x, s=None: bridge.triton_call(
        x,
        *middle(s),
        N,
        kernel=shift_kernel,
        grid=(1,),
        BLOCK=1024,
        **placed(cache, target),
        **kw,
    )


def shifted_03(cache, target):
    """A jax-triton 0.3 call site: the None vanishes, s fills shift_ptr, N fills n."""
    return shift(cache, target, lambda s: (None, s), out_shape=F)


def unshifted(cache, target, **kw):
    """The same kernel with the None bound to shift_ptr (Triton's binding)."""
    return shift(cache, target, lambda s: (None,), **kw)


@pytest.mark.parametrize("target, platform", TARGETS)
def test_03_positional_none_vanishes_and_out_type_keeps_tritons_binding(cache, target, platform):
    cc, params = lowered(shifted_03(cache, target), F, F, target=target, platform=platform)
    assert (cc["operands"], cc["results"], aliased(cc)) == (2, 1, [])
    assert params == ["array", "array", "i32", "array"]  # x, shift, n, out
    for kw in ({"out_type": F}, {"out_shape": F}, {"out_shape": F, "convention": "rocm"}):
        # out_type= and the fork bind the None to shift_ptr (a constexpr None: no parameter);
        # under out_shape= the 0.3 reading leaves out_ptr empty, so the fork's is taken
        cc, params = lowered(unshifted(cache, target, **kw), F, target=target, platform=platform)
        assert (cc["operands"], cc["results"], params) == (1, 1, ["array", "i32", "array"]), kw


def test_03_tuples_spread_over_parameters_and_04_reads_out_shape_as_out_type(cache):
    spread = lambda x, s: bridge.triton_call(  # noqa: E731
        (x, s),
        N,
        kernel=shift_kernel,
        out_shape=x,
        grid=(1,),
        BLOCK=1024,
        cache=cache,
        target="cuda:90",
    )
    cc, params = lowered(spread, F, F)
    assert (cc["operands"], params) == (2, ["array", "array", "i32", "array"])
    # jax-triton 0.4 deprecated out_shape= as a spelling of out_type=: convention="0.4" reads it so
    as_04 = unshifted(cache, "cuda:90", out_shape=F, convention="0.4")
    assert lowered(as_04, F)[1] == ["array", "i32", "array"]
    with pytest.raises(bridge.KernelArgumentError, match="1 unaliased outputs, but 0 kernel"):
        # read as 0.4, the 0.3 call's None binds to shift_ptr: no parameter is left for out
        jax.eval_shape(
            shift(cache, "cuda:90", lambda s: (None, s), out_shape=F, convention="0.4"), F, F
        )


# -- the ROCm fork: an aliased input has no output parameter -----------------------------------
def axpy_fork(cache, target, key):
    """y += 2x through y (parameter 2; array 1): the fork's {coordinate: out_shape index}."""
    return lambda x, y: bridge.triton_call(
        2.0,
        x,
        y,
        N,
        kernel=axpy_inplace_kernel,
        out_shape=y,
        input_output_aliases={key: 0},
        grid=(1,),
        BLOCK=1024,
        **placed(cache, target),
    )


def shifted_into_x(cache, target):
    """A jax-triton 0.3 call site: array 0 (x) starts output 0, which has its own pointer."""
    return shift(cache, target, lambda s: (s,), out_shape=F, input_output_aliases={0: 0})


@pytest.mark.parametrize("target, platform", TARGETS)
def test_a_dict_alias_is_read_the_way_the_kernel_fits(cache, target, platform):
    """The fork's in-place kernel has no output parameter: {2: 0} names parameter 2 (y, which
    is array 1), updated through its own pointer (0.3's reading finds no array 2). A kernel
    with an output parameter after the inputs reads {0: 0} as jax-triton 0.3 did (the fork's
    reading leaves out_ptr empty)."""
    cc, params = lowered(axpy_fork(cache, target, 2), F, F, target=target, platform=platform)
    assert (cc["operands"], cc["results"], aliased(cc)) == (2, 1, [1])
    assert params == ["f32", "array", "array", "i32"]
    for key in ("y_ptr", ("y_ptr",), (2,)):  # a name, and coordinates as tuples
        again, _ = lowered(axpy_fork(cache, target, key), F, F, target=target, platform=platform)
        assert again["opaque"] == cc["opaque"], key
    cc, params = lowered(shifted_into_x(cache, target), F, F, target=target, platform=platform)
    assert (cc["operands"], cc["results"], aliased(cc)) == (2, 1, [0])  # out starts as x
    assert params == ["array", "array", "i32", "array"]


def splitk(cache, target, aliases=None, **kw):
    """The fork's split-K reduce: the pure output (sq) first in out_shape, then the aliased acc."""
    return lambda parts, acc: bridge.triton_call(
        parts,
        acc,
        parts.shape[0],
        parts.shape[1],
        kernel=splitk_reduce_kernel,
        out_shape=(jax.ShapeDtypeStruct(acc.shape, acc.dtype), acc),
        input_output_aliases=aliases or {"acc_ptr": 1},
        grid=(triton.cdiv(parts.shape[1], 128),),
        BLOCK_N=128,
        K_SPLIT=8,
        **placed(cache, target),
        **kw,
    )


PARTS = jax.ShapeDtypeStruct((5, N), jnp.float32)


@pytest.mark.parametrize("target, platform", TARGETS)
def test_fork_reduce_writes_through_an_aliased_buffer(cache, target, platform):
    f = splitk(cache, target)
    cc, params = lowered(f, PARTS, F, target=target, platform=platform)
    assert (cc["operands"], cc["results"], aliased(cc)) == (2, 2, [1])  # acc; sq is a result
    assert params == ["array", "array", "i32", "i32", "array"]
    sq, acc = jax.eval_shape(f, PARTS, F)
    assert sq.shape == acc.shape == (N,)
    for key in (1, ("acc_ptr",)):
        again, _ = lowered(
            splitk(cache, target, {key: 1}), PARTS, F, target=target, platform=platform
        )
        assert again["opaque"] == cc["opaque"]


def pair_inc(cache, target):
    """b += v through the tuple's second pointer, named by the coordinate ("pair", 1)."""
    return lambda a, b, v: bridge.triton_call(
        (a, b),
        v,
        kernel=pair_inc_kernel,
        out_shape=b,
        input_output_aliases={("pair", 1): 0},
        grid=(1,),
        BLOCK=8,
        **placed(cache, target),
    )


def test_fork_tuple_coordinates_name_one_array_of_a_tuple(cache):
    s = jax.ShapeDtypeStruct((8,), jnp.float32)
    cc, params = lowered(pair_inc(cache, "cuda:90"), s, s, s)
    assert (cc["operands"], cc["results"], aliased(cc), params) == (3, 1, [1], ["array"] * 3)
    # a Triton tuple with a constexpr after it: spread out as 0.3 would, its items would leave
    # 8 on BLOCK, and 0.3 passed positional arguments as runtime parameters only
    g = lambda a, b: bridge.triton_call(  # noqa: E731
        (a, b),
        8,
        kernel=pair_scale_kernel,
        input_output_aliases=["pair"],
        grid=(1,),
        target="cuda:90",
        cache=cache,
    )
    cc, params = lowered(g, s, s)
    assert (cc["operands"], cc["results"], aliased(cc), params) == (
        2,
        2,
        [0, 1],
        ["array", "array", "i32"],
    )
    with pytest.raises(bridge.KernelArgumentError, match=r"lands on BLOCK, a tl\.constexpr"):
        jax.eval_shape(
            lambda a, b: bridge.triton_call(
                a, b, 8, kernel=pair_scale_kernel, out_shape=(), convention="0.3", grid=(1,)
            ),
            s,
            s,
        )


def test_fork_alias_errors_name_what_is_wrong():
    def call(aliases, out_shape=None, **kw):
        return lambda parts, acc: bridge.triton_call(
            parts,
            acc,
            5,
            N,
            kernel=splitk_reduce_kernel,
            out_shape=(acc, acc) if out_shape is None else out_shape,
            convention="rocm",
            input_output_aliases=aliases,
            grid=(1,),
            BLOCK_N=128,
            K_SPLIT=8,
            target="cuda:90",
            **kw,
        )

    cases = [
        ({"acc_ptr": 0}, None, "entries 1..1, after the 1 pure output"),
        ({"K": 1}, None, "names 0 input arrays"),
        ({("acc_ptr", 0): 1}, None, r"0 does not index the tuple argument"),
        ({"acc_ptr": 1, 1: 1}, (F, F, F), "bijection"),
        ({"acc_ptr": 1}, (F, jax.ShapeDtypeStruct((N,), jnp.int32)), "shapes and dtypes must"),
        ({"acc_ptr": 1}, {"sq_ptr": F}, "list the inputs updated in place"),
        ({"acc_ptr": 0, "parts_ptr": 1}, F, "the pure outputs, then one per aliased input"),
    ]
    for aliases, out_shape, message in cases:
        with pytest.raises(bridge.KernelArgumentError, match=message):
            jax.eval_shape(call(aliases, out_shape), PARTS, F)
    with pytest.raises(bridge.KernelArgumentError, match="out_names names"):
        jax.eval_shape(call({"acc_ptr": 1}, (F, F, F), out_names="sq_ptr"), PARTS, F)


# -- recognition: one fit, two fits, none -----------------------------------------------------------
def either(cache, target="cuda:90", **kw):
    return lambda x, y: bridge.triton_call(
        x,
        None,
        y,
        kernel=either_kernel,
        out_shape=x,
        grid=(1,),
        target=target,
        cache=cache,
        **kw,
    )


def test_a_call_both_conventions_fit_must_say_which(cache):
    """0.3 reads (x, None, y) as a=x, b=y, c=out (d keeps its default); the fork as a=x,
    b=None, c=y, d=out. Both fit the signature, so neither is guessed."""
    with pytest.raises(bridge.KernelArgumentError, match="fits two conventions") as e:
        jax.eval_shape(either(cache), F, F)
    message = str(e.value)
    assert "jax-triton 0.3 (a_ptr=input 0, b_ptr=input 1, c_ptr=output 0)" in message
    assert (
        "the ROCm fork of jax-triton (a_ptr=input 0, b_ptr=None, c_ptr=input 1, d_ptr=output 0)"
        in message
    )
    assert "convention='0.3' or convention='rocm'" in message
    cc03, _ = lowered(either(cache, convention="0.3"), F, F)
    fork, _ = lowered(either(cache, convention="rocm"), F, F)
    assert (cc03["operands"], cc03["results"]) == (fork["operands"], fork["results"]) == (2, 1)
    assert cc03["opaque"] != fork["opaque"]  # two specializations of the kernel


def test_a_call_no_convention_fits_names_each_and_why():
    @triton.jit
    def copy_kernel(in_ptr, out_ptr, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        tl.store(out_ptr + offs, tl.load(in_ptr + offs))

    f = lambda x, y: bridge.triton_call(  # noqa: E731
        x, None, y, kernel=copy_kernel, out_shape=x, grid=(1,), BLOCK=8, target="cuda:90"
    )
    with pytest.raises(bridge.KernelArgumentError, match="fits no convention") as e:
        jax.eval_shape(f, F, F)
    message = str(e.value)
    assert "jax-triton 0.3 (convention='0.3'): output BLOCK of" in message
    assert "the ROCm fork of jax-triton (convention='rocm'): " in message
    assert "3 positional argument(s) and 1 output(s) do not fit" in message.split("rocm'")[1]
    assert "out_type=" in message


def test_convention_keyword_is_checked(cache):
    with pytest.raises(bridge.KernelArgumentError, match=r"convention='0.5' is not one of '0.3'"):
        jax.eval_shape(either(cache, convention="0.5"), F, F)
    with pytest.raises(bridge.KernelArgumentError, match=r"out_type= is jax-triton 0\.4's keyword"):
        jax.eval_shape(
            lambda x: bridge.triton_call(
                x, N, kernel=shift_kernel, out_type=x, convention="rocm", grid=(1,), BLOCK=8
            ),
            F,
        )
    # @bridge.kernel carries it like any triton_call keyword
    k = bridge.kernel(either_kernel, convention="rocm", target="cuda:90", cache=cache)
    assert jax.eval_shape(lambda x, y: k[(1,)](x, None, y, out_shape=x), F, F).shape == (N,)


# -- on the GPU: outputs land where jax-triton 0.3 and the fork put them -------------------------------
@pytest.mark.gpu
@pytest.mark.skipif(not HAS_GPU, reason="needs an NVIDIA GPU")
def test_gpu_03_none_and_tritons_binding(cache):
    x, s = rand((N,)), rand((N,), seed=1)
    for launch in (shifted_03, shifted_into_x):  # the 0.3 dict alias: out starts as x
        out = jax.jit(launch(cache, None))(x, s)
        np.testing.assert_allclose(np.asarray(out), np.asarray(x) + np.asarray(s), rtol=1e-6)
    for kw in ({"out_type": x}, {"out_shape": x}):
        np.testing.assert_array_equal(np.asarray(jax.jit(unshifted(cache, None, **kw))(x)), x)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_GPU, reason="needs an NVIDIA GPU")
def test_gpu_fork_in_place_writes_through_the_donated_input(cache):
    x, y = rand((N,)), rand((N,), seed=1)
    want = np.asarray(y) + 2.0 * np.asarray(x)
    arg = y + 0
    pointer = arg.unsafe_buffer_pointer()
    out = jax.jit(axpy_fork(cache, None, "y_ptr"), donate_argnums=(1,))(x, arg)
    assert arg.is_deleted() and out.unsafe_buffer_pointer() == pointer
    np.testing.assert_allclose(np.asarray(out), want, rtol=1e-6, atol=1e-6)
    again = axpy_fork(cache, None, 2)(x, y)  # eagerly, without donation: y itself is kept
    np.testing.assert_allclose(np.asarray(again), want, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(y), np.asarray(rand((N,), seed=1)))


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_GPU, reason="needs an NVIDIA GPU")
def test_gpu_fork_split_k_reduce(cache):
    parts, acc = rand((5, N), seed=2), rand((N,), seed=3)
    sq, total = jax.jit(splitk(cache, None))(parts, acc)
    p = np.asarray(parts, np.float64)
    np.testing.assert_allclose(np.asarray(total), np.asarray(acc) + p.sum(0), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(sq), (p * p).sum(0), rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_GPU, reason="needs an NVIDIA GPU")
def test_gpu_explicit_conventions_and_tuple_coordinates(cache):
    x, y = rand((N,)), rand((N,), seed=1)
    a03 = jax.jit(either(cache, None, convention="0.3"))(x, y)
    fork = jax.jit(either(cache, None, convention="rocm"))(x, y)
    np.testing.assert_allclose(np.asarray(a03), np.asarray(x) + np.asarray(y), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(fork), np.asarray(x) * np.asarray(y), rtol=1e-6)
    a, b, v = rand((8,)), rand((8,), seed=1), rand((8,), seed=2)
    out = pair_inc(cache, None)(a, b, v)
    np.testing.assert_allclose(np.asarray(out), np.asarray(b) + np.asarray(v), rtol=1e-6)
