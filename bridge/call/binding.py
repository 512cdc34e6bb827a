"""Binding a kernel call to Triton's specialization, for abstract JAX arrays.

The bridge does not re-implement Triton's rules: arguments go through the binder that Triton
itself generates for the kernel (``create_function_from_signature``: defaults, constexprs,
``do_not_specialize``, tuples, the ``== 1`` and divisibility-by-16 specializations), and the
result through the kernel's own ``_pack_args`` (options, signature, constexprs, attributes).
A variant (:class:`~.kernel_objects.Variant`: an autotune config after heuristics) is bound
with the options Triton's launcher adds (:func:`~.kernel_objects.launch_options`).

Arrays are represented by placeholders (:class:`~.placeholders.ArgArray`) that answer what
Triton asks of a tensor: its dtype, a data pointer (XLA buffers are at least 16-byte aligned;
jaxlib checks the alignment the kernel was specialized for at launch) and its size in bytes.

A bound call (:class:`Bound`) has its runtime arguments as jaxlib's Triton call passes them
(:class:`Leaf`): every runtime argument in the order of the kernel's ABI (tuples flattened depth
first, constexprs left out), with its Triton type, its value and the divisibility the kernel was
specialized for. The lowering makes each one parameter of jaxlib's ``TritonKernelCall``.

Invariants, checked by :func:`abi_leaves` before anything is keyed or compiled: a pointer
parameter holds an array placeholder and no other parameter does; a scalar's type is one of
:data:`SCALAR_FIELDS`, those jaxlib can pass; an integer fits its type, and a Python float
passed as fp32 does not overflow it; a host-side tensor descriptor passes as it is. A pointer's
divisibility is 16 where Triton's specialization says so, else 0. Nothing here imports jax.
"""

from __future__ import annotations

import functools
import importlib.abc
import logging
import math
import sys
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..exceptions import KernelArgumentError
from .kernel_objects import KernelParts, Variant, launch_options
from .placeholders import ArgArray

logger = logging.getLogger(__name__)


#: Triton scalar type -> field of jaxlib's TritonKernelCall.Parameter
SCALAR_FIELDS = {
    "i1": "bool_",
    "u1": "bool_",
    "i32": "i32",
    "u32": "u32",
    "i64": "i64",
    "u64": "u64",
    "fp32": "f32",
    "fp64": "f64",
}
#: the values each integer type holds
_INT_RANGES = {
    "i32": (-(2**31), 2**31 - 1),
    "u32": (0, 2**32 - 1),
    "i64": (-(2**63), 2**63 - 1),
    "u64": (0, 2**64 - 1),
}
#: the largest finite fp32
_FP32_MAX = float(np.finfo(np.float32).max)


@dataclass(frozen=True)
class Leaf:
    """A runtime argument of the compiled kernel, in the order of the kernel's ABI."""

    path: tuple[int, ...]
    type: str
    value: Any  # ArgArray for pointers, a Python scalar otherwise
    divisibility: int = 0

    @property
    def is_array(self) -> bool:
        return self.type.startswith("*")

    @property
    def is_descriptor(self) -> bool:
        """A host-side tensor descriptor (``value`` is Triton's descriptor object)."""
        return self.type.startswith("tensordesc")


def abi_leaves(
    parts: KernelParts,
    bound_args: Mapping[str, Any],
    signature: Mapping[str, Any],
    attrs: Mapping[tuple[int, ...], Any],
) -> Iterator[Leaf]:
    """The runtime arguments of ``bound_args`` (every parameter's value, as Triton's binder
    gives them), by the ``signature`` and ``attrs`` Triton's ``_pack_args`` returns for them.

    Raises:
        KernelArgumentError: a pointer given anything but an array, a scalar given an array, a
            scalar type jaxlib's Triton call cannot pass, or a value its type does not hold.
    """

    def walk(value: Any, typ: Any, path: tuple[int, ...], name: str):
        if isinstance(typ, tuple):
            for j, (v, t) in enumerate(zip(value, typ, strict=True)):
                yield from walk(v, t, (*path, j), name)
            return
        if typ == "constexpr":
            return
        if typ.startswith("tensordesc"):
            yield Leaf(path, typ, value)
            return
        if typ.startswith("*"):
            if not isinstance(value, ArgArray):
                raise KernelArgumentError(
                    f"{parts.qualname}: parameter {name} is a pointer ({typ}) but got {value!r}; "
                    "pass a JAX array"
                )
            divisible = ["tt.divisibility", 16] in list(attrs.get(path, []))
            yield Leaf(path, typ, value, 16 if divisible else 0)
            return
        if isinstance(value, ArgArray):
            raise KernelArgumentError(
                f"{parts.qualname}: parameter {name} is annotated as the scalar type {typ} but got "
                "an array"
            )
        if typ not in SCALAR_FIELDS:
            raise KernelArgumentError(
                f"{parts.qualname}: parameter {name} has type {typ}, which jaxlib's Triton call "
                f"cannot pass; runtime scalars may be {', '.join(sorted(SCALAR_FIELDS))}: make "
                "it a tl.constexpr or change its annotation"
            )
        if typ in _INT_RANGES:
            lo, hi = _INT_RANGES[typ]
            if not lo <= int(value) <= hi:
                raise KernelArgumentError(f"{parts.qualname}: {name}={value} does not fit {typ}")
        if typ == "fp32" and math.isfinite(value) and abs(value) > _FP32_MAX:
            raise KernelArgumentError(
                f"{parts.qualname}: {name}={value} overflows fp32 (the type Triton gives a Python "
                f"float): annotate the parameter ({name}: tl.float64) to pass it as fp64"
            )
        yield Leaf(path, typ, value)

    for i, (name, value) in enumerate(bound_args.items()):
        yield from walk(value, signature[name], (i,), name)


@dataclass(frozen=True)
class Bound:
    """A variant bound to Triton's specialization: everything needed to key and compile it."""

    variant: Variant
    bound_args: Mapping[str, Any]
    signature: Mapping[str, Any]
    constexprs: Mapping[tuple[int, ...], Any]
    attrs: Mapping[tuple[int, ...], Any]
    options: Any  # the backend's options dataclass (CUDAOptions / HIPOptions)
    leaves: tuple[Leaf, ...] = field(default=())


@functools.cache
def _binder(fn: Any, backend: Any) -> Any:
    from triton.runtime.jit import create_function_from_signature

    _prepare_specializer()
    return create_function_from_signature(fn.signature, fn.params, backend)


class _RefuseTorch(importlib.abc.MetaPathFinder):
    """Refuses ``import torch`` in one thread, and notes whether it was asked."""

    def __init__(self) -> None:
        self.thread = threading.get_ident()
        self.asked = False

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> None:
        if threading.get_ident() == self.thread and fullname.partition(".")[0] == "torch":
            self.asked = True
            raise ModuleNotFoundError(f"No module named {fullname!r}", name=fullname)
        return None


@functools.cache
def _prepare_specializer() -> None:
    """Initialise Triton's native argument specializer without importing PyTorch.

    Triton 3.6 and 3.7 import ``torch`` in the specializer's first call in a process, to
    recognise torch tensors: one to three seconds on a machine where PyTorch is installed, paid
    by every process at its first lowering. The bridge hands it placeholders for JAX arrays, never
    torch tensors. So unless torch is already imported, that first call runs with ``import torch``
    refused (in this thread only); Triton then treats torch tensors launched later in this
    process like any other object with ``data_ptr`` and ``dtype`` (the same results, a slightly
    slower path). Whether this Triton asks for torch at all is observed, not assumed from its
    version: later releases look torch up only where it is already imported, and then nothing
    is refused.
    """
    if "torch" in sys.modules:
        return
    # import what the specializer imports first, so that only its own import of torch is refused
    import triton._utils
    import triton.experimental.gluon.nvidia.hopper
    import triton.language
    import triton.runtime.jit
    import triton.tools.tensor_descriptor  # noqa: F401
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.compiler import BaseBackend

    refuse = _RefuseTorch()
    sys.meta_path.insert(0, refuse)
    try:
        native_specialize_impl(BaseBackend, 1, False, True, True)
    finally:
        sys.meta_path.remove(refuse)
    logger.debug(
        "Triton's specializer initialised; it %s",
        "asked for torch, which was refused" if refuse.asked else "does not import torch",
    )


def bound_arguments(
    parts: KernelParts, backend: Any, named: Mapping[str, Any], variant: Variant
) -> tuple[dict[str, Any], Any, Any]:
    """Triton's binder on one variant: every parameter's value (defaults applied), the
    specialization and the options it returns.

    Raises:
        KernelArgumentError: missing or surplus arguments.
    """
    call = variant.arguments(named)
    try:
        return _binder(parts.fn, backend)(**call, **launch_options(parts, variant))
    except TypeError as e:
        reason = str(e).replace("dynamic_func()", "the kernel")
        raise KernelArgumentError(
            f"{parts.qualname}: {reason}; pass every parameter positionally or by keyword"
        ) from None


def bind(parts: KernelParts, backend: Any, named: Mapping[str, Any], variant: Variant) -> Bound:
    """Bind one variant with Triton's binder and ``_pack_args`` for ``backend``.

    Raises:
        KernelArgumentError: missing or surplus arguments, or runtime arguments whose type
            jaxlib cannot pass.
    """
    fn = parts.fn
    call = variant.arguments(named)
    options = launch_options(parts, variant)
    bound_args, specialization, opts = bound_arguments(parts, backend, named, variant)
    triton_options, signature, constexprs, attrs = fn._pack_args(
        backend, {**call, **options}, bound_args, specialization, opts
    )
    leaves = tuple(abi_leaves(parts, bound_args, signature, attrs))
    return Bound(variant, bound_args, signature, constexprs, attrs, triton_options, leaves)
