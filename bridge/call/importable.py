"""Whether another process can import a kernel: where a recorded kernel's module and qualified
name lead from ``sys.path``, as far as this process can tell.

A kernel defined inside a function, in the ``__main__`` of a script run as a file, or in a module
that is not importable from ``sys.path`` cannot be imported by ``kernelcache warm``; the reason is
recorded with the call (:mod:`bridge.lowering.record`). Answers are memoized per process and
kernel path. Nothing here imports jax or triton.
"""

from __future__ import annotations

import contextlib
import importlib.machinery
import os
import sys
from dataclasses import dataclass
from typing import Any

from .plain import source_digest


@dataclass(frozen=True)
class Located:
    """Where a recorded kernel can be imported from, as far as this process can tell."""

    path: str  # module:qualname under which another process imports it
    importable: bool
    problem: str | None = None
    source: str | None = None  # source_digest of the kernel function, when it was found


def _spec_on_path(name: str) -> Any:
    """The spec that a fresh import of top-level module ``name`` would find, or None."""
    with contextlib.suppress(ImportError, ValueError, AttributeError):
        spec = importlib.machinery.PathFinder.find_spec(name)
        if spec is not None:
            return spec
    for finder in sys.meta_path:
        if finder is importlib.machinery.PathFinder:
            continue
        find = getattr(finder, "find_spec", None)
        if find is None:
            continue
        try:
            spec = find(name, None)
        except (ImportError, ValueError, AttributeError, TypeError):
            continue
        if spec is not None:
            return spec
    return None


def _same_file(a: str | None, b: str | None) -> bool:
    if not a or not b:
        return False
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def _module_problem(module_name: str, module: Any) -> str | None:
    """Why a fresh process could not import ``module_name`` the way this one did, or None."""
    top_name = module_name.split(".")[0]
    top = sys.modules.get(top_name)
    spec = _spec_on_path(top_name)
    if spec is None:
        where = getattr(module, "__file__", None) or "(no file)"
        return (
            f"module {module_name} (loaded from {where}) cannot be imported from sys.path: "
            f"put its directory on PYTHONPATH where you warm, or install it as a package"
        )
    loaded = getattr(getattr(top, "__spec__", None), "origin", None) or getattr(
        top, "__file__", None
    )
    if spec.origin not in (None, "namespace") and loaded and not _same_file(spec.origin, loaded):
        return (
            f"module {top_name} was loaded from {loaded}, but importing it from sys.path finds "
            f"{spec.origin}: warm from an environment where the kernel's module is found first"
        )
    return None


def locate(path: str) -> Located:
    """Check that ``module:qualname`` names a kernel another process can import.

    Only this process's ``sys.modules`` and the import system's finders are consulted:
    nothing is imported or executed.
    """
    module_name, _, qualname = path.partition(":")
    if not qualname or "<locals>" in qualname or "<lambda>" in qualname:
        return Located(
            path,
            False,
            f"{path} is defined inside a function: another process cannot import it; "
            "define the kernel at module level",
        )
    module = sys.modules.get(module_name)
    if module_name == "__main__":
        spec = getattr(module, "__spec__", None)
        name = getattr(spec, "name", None)
        if not name or name == "__main__":
            script = getattr(module, "__file__", None) or "an interactive session"
            return Located(
                path,
                False,
                f"{path} is defined in {script}, which runs as __main__: another process "
                "cannot import it without running it; move the kernel into a module that "
                "the script imports",
                _source_of(module, qualname),
            )
        module_name = name  # `python -m pkg.mod`: importable as pkg.mod
        path = f"{name}:{qualname}"
    elif module is None:
        return Located(path, False, f"module {module_name} of {path} is not loaded")
    found = _source_of(module, qualname)
    if found is None:
        return Located(
            path,
            False,
            f"{path} cannot be found by name in module {module_name}: define the kernel at "
            "module level under the name it is defined with",
        )
    problem = _module_problem(module_name, module)
    return Located(path, problem is None, problem, found)


def _source_of(module: Any, qualname: str) -> str | None:
    obj = module
    try:
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except AttributeError:
        return None
    while hasattr(obj, "fn") and not hasattr(obj, "src"):  # autotune / heuristics layers
        obj = obj.fn
    return source_digest(obj) if hasattr(obj, "src") else None


_located: dict[str, Located] = {}


def located(path: str) -> Located:
    found = _located.get(path)
    if found is None:
        try:
            found = locate(path)
        except (OSError, ValueError, TypeError, AttributeError, ImportError) as e:
            found = Located(path, False, f"could not check whether {path} can be imported: {e}")
        _located[path] = found
    return found


# -- the record as written ----------------------------------------------------------------
