"""jax-triton's name for the bridge: code that imports ``jax_triton`` reaches the bridge with no
edit of its own, as programs reach ccache through a compiler's name or sccache through
``RUSTC_WRAPPER``.

This folder holds a package named ``jax_triton`` (:mod:`bridge.masquerade.jax_triton`) and nothing
else importable by that name: with the folder first on the module search path, ``import
jax_triton`` anywhere in a process (its own code, its dependencies', its child processes') gives
the bridge. Two ways to put it there: ``kernelcache run -- COMMAND ...`` (``PYTHONPATH`` of the
command and everything it starts) and :func:`install` (``bridge.install_jax_triton()``, in a
program's own entry point, before anything imports ``jax_triton``).

Which jax-triton it is (0.3's or 0.4's API: what ``out_shape=`` means, which names it has) is
:func:`api_version`: ``$KERNELCACHE_JAX_TRITON`` (:mod:`bridge.settings`) if set, else the release of the real jax-triton
installed beside it, else 0.4. The real jax-triton, if installed, is hidden, not changed.

A command run so that is often ``python``: the one found on ``PATH`` may not be the one the
``kernelcache`` command runs from (outside an activated environment, the system's), and lack
jax. :func:`interpreter_problem` says which interpreter was found and what to run instead.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..exceptions import MasqueradeError

#: the folder whose only package is ``jax_triton``
FOLDER = str(Path(__file__).resolve().parent)


def real_version() -> str | None:
    """The release of the real jax-triton installed here (from its metadata; not imported)."""
    try:
        return importlib.metadata.version("jax-triton")
    except importlib.metadata.PackageNotFoundError:
        return None


def api_version() -> str:
    """Which jax-triton's API the masquerade offers: "0.3" or "0.4" (see the module docstring).

    Raises:
        MasqueradeError: ``$KERNELCACHE_JAX_TRITON`` names another.
    """
    from kernelcache import ConfigError

    from ..settings import setting_value

    try:
        chosen = setting_value("KERNELCACHE_JAX_TRITON")  # (the others are not read here)
    except ConfigError as e:
        raise MasqueradeError(str(e)) from None
    if chosen is not None:
        return chosen
    real = real_version()
    if real is not None and real.split(".")[:2] == ["0", "3"]:
        return "0.3"
    return "0.4"


def active() -> bool:
    """Whether ``import jax_triton`` gives the bridge in this process."""
    found = sys.modules.get("jax_triton")
    if found is not None:
        return getattr(found, "__bridge__", False) is True
    spec = importlib.util.find_spec("jax_triton")
    return spec is not None and spec.origin is not None and spec.origin.startswith(FOLDER)


def install() -> None:
    """Make ``import jax_triton`` give the bridge in this process (``bridge.install_jax_triton``).

    Raises:
        MasqueradeError: the real jax-triton was imported already (its kernels would keep
            going through it): call this first, before anything imports jax_triton.
    """
    found = sys.modules.get("jax_triton")
    if found is not None and getattr(found, "__bridge__", False) is not True:
        where = getattr(found, "__file__", None) or "a module"
        raise MasqueradeError(
            f"jax_triton was imported before install_jax_triton() (from {where}): call "
            "bridge.install_jax_triton() at the start of the program, before anything imports "
            "jax_triton, or run it under `kernelcache run -- ...`"
        )
    api_version()  # (a bad $KERNELCACHE_JAX_TRITON is said now)
    if FOLDER not in sys.path:
        sys.path.insert(0, FOLDER)
    importlib.invalidate_caches()
    importlib.import_module("jax_triton")


def report() -> tuple[dict[str, Any], list[Any]]:
    """``kernelcache doctor``'s view: which jax_triton ``import jax_triton`` gives a process
    started with this environment, and what is installed (nothing is imported)."""
    from kernelcache.cli import Check

    real = real_version()
    try:
        api: str | None = api_version()
    except MasqueradeError as e:
        return {"api": None, "real": real}, [Check("jax_triton", "fail", str(e))]
    ours = active()
    info = {"bridge": ours, "api": api if ours else None, "real": real}
    if ours:
        hidden = f" (the real jax-triton {real} is hidden)" if real else ""
        detail = f"import jax_triton gives the bridge, with jax-triton {api}'s API{hidden}"
        return info, [Check("jax_triton", "ok", detail)]
    if real is None:
        detail = "no jax_triton here; code that imports it runs through the bridge under `kernelcache run -- ...`"
        return info, [Check("jax_triton", "ok", detail)]
    detail = (
        f"import jax_triton gives the real jax-triton {real}: its kernels bypass the kernel "
        "cache; run the program under `kernelcache run -- ...`, or call "
        "bridge.install_jax_triton() at its start"
    )
    return info, [Check("jax_triton", "warn", detail)]


def environment(env: dict[str, str]) -> dict[str, str]:
    """``env`` with the masquerade's folder first on ``PYTHONPATH`` (for ``kernelcache run``)."""
    path = env.get("PYTHONPATH")
    parts = [p for p in (path or "").split(os.pathsep) if p and p != FOLDER]
    return {**env, "PYTHONPATH": os.pathsep.join([FOLDER, *parts])}


#: asks an interpreter, without importing it, whether it can import jax (exit 0: it can)
_HAS_JAX = "import importlib.util, sys; sys.exit(importlib.util.find_spec('jax') is None)"


def interpreter_problem(command: Sequence[str], env: Mapping[str, str]) -> str | None:
    """Why ``command`` (a Python interpreter named by name, such as ``python``) cannot run a
    program of the bridge: the interpreter found on ``env``'s ``PATH`` and that it cannot import
    jax, with what to run instead; None when it can (or ``command`` is not an interpreter, or
    cannot be found or asked: running it says what is wrong)."""
    if not command or not re.fullmatch(r"python[0-9.]*", os.path.basename(command[0])):
        return None
    found = shutil.which(command[0], path=env.get("PATH"))
    if found is None:
        return None
    try:
        asked = subprocess.run(
            [found, "-c", _HAS_JAX], env=dict(env), capture_output=True, timeout=60
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if asked.returncode == 0:
        return None
    said = f"{command[0]!r} is {found}, which cannot import jax (the bridge runs on jax)"
    if importlib.util.find_spec("jax") is None:
        return said + "; install jax into that environment (pip install 'kernelcache[bridge]')"
    ours = sys.executable
    activate = Path(sys.prefix) / "bin" / "activate"
    hint = f"run `kernelcache run -- {ours} ...`"
    if sys.prefix != sys.base_prefix and activate.exists():
        hint += f", or activate the environment kernelcache runs from (source {activate})"
    return f"{said}; {hint}"
