"""Turning on JAX's persistent compilation cache beside the kernel cache.

Lowering (and so the kernel-cache lookup) runs in every process; JAX's cache then saves XLA's
own compile. Because the bridge's opaque is byte-identical across processes, a second process
hits JAX's cache for computations containing Triton kernels.

:func:`enable_jax_cache` never overrides what the user set (``JAX_COMPILATION_CACHE_DIR`` and
the other ``JAX_*`` variables, or ``jax.config.update``): it keeps the user's values and says
so once when they differ from what it was asked. jax is imported only when it is called.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from kernelcache.plugin import parse_size, warn_once

logger = logging.getLogger(__name__)

#: the JAX settings enable_jax_cache makes: its name, environment variable, JAX's default
_SETTINGS = {
    "dir": ("jax_compilation_cache_dir", "JAX_COMPILATION_CACHE_DIR", None),
    "min_compile_time_secs": (
        "jax_persistent_cache_min_compile_time_secs",
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS",
        1.0,
    ),
    "min_entry_size_bytes": (
        "jax_persistent_cache_min_entry_size_bytes",
        "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES",
        0,
    ),
    "max_size": ("jax_compilation_cache_max_size", "JAX_COMPILATION_CACHE_MAX_SIZE", -1),
}
#: the values this process's enable_jax_cache set (a later call may change its own choices)
_ours: dict[str, Any] = {}


def default_dir(root: str | os.PathLike[str]) -> Path:
    """JAX's cache directory beside the kernel cache root ``root``: ``<parent>/<name>-jax``."""
    path = Path(root)
    return path.parent / f"{path.name}-jax"


def _size(value: int | str | None, what: str) -> int | None:
    if value is None or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    if isinstance(value, str):
        return parse_size(value)
    raise ValueError(f"{what} must be a size such as '50G' or a number of bytes, not {value!r}")


def enable_jax_cache(
    dir: str | os.PathLike[str] | None = None,
    *,
    min_compile_time_secs: float | None = None,
    min_entry_size_bytes: int | str | None = None,
    max_size: int | str | None = None,
) -> Path:
    """Turn on JAX's persistent compilation cache and return its directory.

    A setting the user already made (a ``JAX_*`` variable, or ``jax.config.update`` before
    this call) is kept: where it differs from a value asked for here, one warning says so.

    Args:
        dir: the cache directory; None for one beside the kernel cache:
            ``<parent of the kernel cache root>/<root name>-jax``.
        min_compile_time_secs: cache executables whose XLA compile took at least this long;
            None for 0 (everything; JAX's own default of 1 s skips most small programs).
        min_entry_size_bytes: cache executables at least this large, in bytes or a size such
            as ``"64K"``; None for 0 (all).
        max_size: a size cap, in bytes or a size such as ``"50G"`` (JAX then evicts least
            recently used entries under a file lock); None leaves JAX's default (unlimited).

    Raises:
        ValueError: a size that cannot be read (the message shows the accepted forms).
    """
    import jax

    asked: dict[str, Any] = {
        "dir": None if dir is None else str(Path(dir).expanduser()),
        "min_compile_time_secs": (
            None if min_compile_time_secs is None else float(min_compile_time_secs)
        ),
        "min_entry_size_bytes": _size(min_entry_size_bytes, "min_entry_size_bytes"),
        "max_size": _size(max_size, "max_size"),
    }
    fallback: dict[str, Any] = {"min_compile_time_secs": 0.0, "min_entry_size_bytes": 0}
    chosen: dict[str, Any] = {}
    users: set[str] = set()
    for name, (option, variable, default) in _SETTINGS.items():
        current = getattr(jax.config, option)
        ours = name in _ours and _ours[name] == current
        if not ours and (variable in os.environ or current != default):  # the user's
            wanted = asked[name]
            if wanted is not None and wanted != current:
                warn_once(
                    logger,
                    ("jax-cache", name, str(current), str(wanted)),
                    "bridge: keeping the %s you set (%s), not %r as enable_jax_cache was asked",
                    option,
                    f"{variable}={os.environ[variable]}"
                    if variable in os.environ
                    else repr(current),
                    wanted,
                )
            chosen[name] = current
            users.add(name)
        else:
            chosen[name] = asked[name] if asked[name] is not None else fallback.get(name)
    if chosen["dir"] is None:
        from ..settings import default_cache

        chosen["dir"] = str(default_dir(default_cache().root))
    path = Path(chosen["dir"]).expanduser()
    path.mkdir(parents=True, exist_ok=True)
    chosen["dir"] = str(path)
    for name, (option, _, _) in _SETTINGS.items():
        value = chosen[name]
        if value is None:
            continue
        if getattr(jax.config, option) != value:
            jax.config.update(option, value)
        if name in users:
            _ours.pop(name, None)
        else:
            _ours[name] = value
    try:
        jax.config.update("jax_enable_compilation_cache", True)
    except AttributeError:  # older JAX without the switch
        pass
    logger.info("JAX persistent compilation cache at %s", path)
    return path
