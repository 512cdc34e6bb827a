"""``@bridge.kernel``: a Triton or Gluon kernel launched Triton-style from JAX.

    @bridge.kernel(out_names="out_ptr")
    @triton.jit
    def add(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr): ...

    out = add[(triton.cdiv(n, 1024),)](x, y, n=n, BLOCK=1024, out_shape=x)

Outputs are implicit: they are named by ``out_names`` (or by a dict ``out_shape``) and never
passed. Any ``triton_call`` keyword can be fixed at decoration time and overridden per launch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .api import triton_call
from .call.kernel_objects import decompose
from .exceptions import KernelArgumentError


class Kernel:
    """A kernel with default ``triton_call`` keywords; ``k[grid](*args, **kwargs)`` calls it."""

    kernel: Any
    defaults: dict[str, Any]

    def __init__(self, kernel: Any, **defaults: Any) -> None:
        if isinstance(kernel, Kernel):
            defaults = {**kernel.defaults, **defaults}
            kernel = kernel.kernel
        decompose(kernel)  # fail at decoration time for a non-kernel
        if "grid" in defaults:
            raise KernelArgumentError("the grid goes in brackets: k[grid](*args, **kwargs)")
        self.kernel = kernel
        self.defaults = defaults

    def __getitem__(self, grid: Any) -> Callable[..., Any]:
        def launch(*args: Any, **kwargs: Any) -> Any:
            return triton_call(*args, kernel=self.kernel, grid=grid, **{**self.defaults, **kwargs})

        return launch

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise KernelArgumentError("launch a kernel with a grid: k[grid](*args, **kwargs)")

    def __repr__(self) -> str:
        return f"bridge.Kernel({decompose(self.kernel).qualname})"


def kernel(fn: Any = None, /, **defaults: Any) -> Any:
    """Decorate a Triton/Gluon kernel (``@bridge.kernel`` or ``@bridge.kernel(out_names=...)``)."""
    if fn is None:
        return lambda f: Kernel(f, **defaults)
    return Kernel(fn, **defaults)
