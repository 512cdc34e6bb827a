"""The targets the identity tests hold every guarantee on: cuda:90 and hip:gfx942, both
cross-compiled on this machine (and hip:gfx950 for the ROCm checks, where the installed Triton
knows it); the platform JAX lowers each for, the extension of its machine code, its warp size
(a Gluon kernel's layout is written for one: such a kernel takes it as ``TPW``), and pytest
parameters that run a test once per target, its id naming the target first.

Plain functions and constants, importable by child processes too (pytest is imported only by
:func:`each_target`, which tests call)."""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from typing import Any

#: the targets every identity test runs on (a test's id starts with one)
TARGETS = ("cuda:90", "hip:gfx942")


def platform_of(target: str) -> str:
    """The platform JAX lowers a call for ``target`` on: "cuda" or "rocm"."""
    return "cuda" if target.startswith("cuda") else "rocm"


def machine_ext(target: str) -> str:
    """The extension of ``target``'s machine code entries: "cubin" or "hsaco"."""
    return "cubin" if target.startswith("cuda") else "hsaco"


def warp_size(target: str) -> int:
    """Threads per warp on ``target`` (a wavefront of 64 on the CDNA architectures named here)."""
    return 32 if target.startswith("cuda") else 64


def target_params(kernel: Any, target: str) -> dict[str, int]:
    """What a call of ``kernel`` for ``target`` is given besides its own arguments: a Gluon
    layout is written for a warp size, so a kernel with a parameter ``TPW`` gets the target's
    threads per warp there."""
    return {"TPW": warp_size(target)} if "TPW" in getattr(kernel, "arg_names", ()) else {}


@functools.cache
def rocm_targets() -> tuple[str, ...]:
    """hip:gfx942, and hip:gfx950 where the installed Triton's AMD backend knows the
    architecture (its compiler names it)."""
    import inspect

    from triton.backends.amd import compiler

    return (
        ("hip:gfx942", "hip:gfx950") if "gfx950" in inspect.getsource(compiler) else ("hip:gfx942",)
    )


def each_target(
    names: Iterable[str] | None = None,
    failing: Mapping[tuple[str, str | None], str] | None = None,
    targets: Iterable[str] = TARGETS,
) -> list[Any]:
    """pytest parameters for ``@pytest.mark.parametrize("target,name", ...)`` (every name on
    every target), or for ``"target"`` alone when ``names`` is None; ``failing`` maps
    (target, name) (name None: every name) to why that pair cannot hold, a strict xfail."""
    import pytest

    failing = failing or {}

    def marks(target: str, name: str | None) -> Any:
        why = failing.get((target, name)) or failing.get((target, None))
        return [pytest.mark.xfail(strict=True, reason=why)] if why else []

    if names is None:
        return [pytest.param(t, marks=marks(t, None), id=t) for t in targets]
    return [pytest.param(t, n, marks=marks(t, n), id=f"{t}-{n}") for n in names for t in targets]
