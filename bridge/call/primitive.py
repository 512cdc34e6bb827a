"""The ``triton_call`` primitive and its rules: abstract evaluation, no differentiation,
batching by running the kernel once per batch element, and dead-code elimination that keeps
every call. Its lowerings live in :mod:`bridge.lowering.lower`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax

try:  # the public homes of the primitive registries (jax 0.8 - 0.11)
    from jax.interpreters import ad, batching
    from jax.interpreters import partial_eval as pe

    _ = (ad.primitive_jvps, batching.primitive_batchers, pe.dce_rules)
except (ImportError, AttributeError):  # pragma: no cover - later releases
    from jax._src.interpreters import ad, batching  # type: ignore[no-redef]
    from jax._src.interpreters import partial_eval as pe  # type: ignore[no-redef]

from ..errors import UnsupportedTransformation
from .tracing import CallSpec


def _primitive_class() -> Any:
    """``jax.extend.core.Primitive``, without importing all of ``jax.extend`` where JAX's own
    class is at hand (``import jax.extend`` loads Pallas too)."""
    try:
        from jax._src.core import Primitive
    except ImportError:  # pragma: no cover - a JAX that moved it: the public path
        import jax.extend

        return jax.extend.core.Primitive
    return Primitive


triton_call_p = _primitive_class()("kernelcache_triton_call")
triton_call_p.multiple_results = True


def _impl(*args: Any, call: CallSpec, has_side_effect: bool) -> Any:
    return jax.jit(lambda *a: triton_call_p.bind(*a, call=call, has_side_effect=has_side_effect))(
        *args
    )


triton_call_p.def_impl(_impl)


@triton_call_p.def_abstract_eval
def _abstract_eval(*avals: Any, call: CallSpec, has_side_effect: bool) -> tuple[Any, ...]:
    return call.out_avals


def _no_jvp(primals: Any, tangents: Any, *, call: CallSpec, has_side_effect: bool) -> Any:
    raise UnsupportedTransformation(
        f"cannot differentiate the Triton kernel {call.parts.qualname}: JAX cannot see inside "
        "it. Wrap the call in jax.custom_vjp (or custom_jvp) with a backward kernel or a jnp rule"
    )


def _vmap(args: Sequence[Any], dims: Sequence[Any], **params: Any) -> Any:
    """Batching by running the kernel once per batch element (``lax.map``): exactly the
    results of separate calls, in sequence. Write a batched kernel for speed."""
    batched = [i for i, d in enumerate(dims) if d is not None]
    moved = [jax.numpy.moveaxis(args[i], dims[i], 0) for i in batched]

    def one(xs: Sequence[Any]) -> Any:
        full = list(args)
        for i, x in zip(batched, xs, strict=True):
            full[i] = x
        return tuple(triton_call_p.bind(*full, **params))

    outs = jax.lax.map(one, tuple(moved))
    return list(outs), [0] * len(outs)


def _keep(used_outputs: list[bool], eqn: Any) -> tuple[list[bool], Any]:
    """JAX's dead-code elimination keeps every kernel call, as jax-triton 0.4 does. (Without
    ``has_side_effect=True``, XLA may still remove a call whose results are all unused.)"""
    return [True] * len(eqn.invars), eqn


ad.primitive_jvps[triton_call_p] = _no_jvp
batching.primitive_batchers[triton_call_p] = _vmap
pe.dce_rules[triton_call_p] = _keep
