"""What a kernel object is: a Triton or Gluon ``JITFunction``, possibly wrapped in
``@triton.autotune`` and ``@triton.heuristics`` layers (in any order and number)."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from ..errors import KernelArgumentError
from ..vendors.backends import triton


@dataclass(frozen=True)
class KernelParts:
    """A kernel taken apart: the layers from the outside in, and the JIT function inside.

    ``layers`` holds Triton's own ``Autotuner`` and ``Heuristics`` objects; the bridge reads
    their configuration and applies it the way Triton's launcher does.
    """

    layers: tuple[Any, ...]
    fn: Any  # triton.runtime.jit.JITFunction (GluonJITFunction for Gluon)

    @property
    def name(self) -> str:
        return self.fn.__name__

    @property
    def qualname(self) -> str:
        """``module:qualname`` of the kernel function (how a manifest names it)."""
        return f"{self.fn.__module__}:{self.fn.__qualname__}"

    @property
    def is_gluon(self) -> bool:
        return bool(getattr(self.fn, "is_gluon", lambda: False)())

    @property
    def language(self) -> str:
        return "gluon" if self.is_gluon else "triton"

    @property
    def arg_names(self) -> list[str]:
        return list(self.fn.arg_names)


@functools.cache
def _classes() -> tuple[Any, Any]:
    """Triton's layer classes (autotune, heuristics) and its JIT function class."""
    triton()
    from triton.runtime.autotuner import Autotuner, Heuristics
    from triton.runtime.jit import JITFunction

    return (Autotuner, Heuristics), JITFunction


def decompose(kernel: Any) -> KernelParts:
    """Split ``kernel`` into its autotune/heuristics layers and its JIT function.

    Raises:
        KernelArgumentError: ``kernel`` is not a Triton or Gluon kernel.
    """
    layered, JITFunction = _classes()
    layers: list[Any] = []
    current: Any = kernel
    while isinstance(current, layered):
        layers.append(current)
        current = current.fn
    if not isinstance(current, JITFunction):
        raise KernelArgumentError(
            f"kernel={kernel!r} is not a Triton kernel: pass a function decorated with "
            "@triton.jit or @gluon.jit (optionally wrapped in @triton.autotune / "
            "@triton.heuristics)"
        )
    return KernelParts(tuple(layers), current)
