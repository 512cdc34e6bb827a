"""JAX's persistent compilation cache, beside the kernel cache: turning it on, and showing and
pruning its directory (``kernelcache jax-cache``).

Lowering (and so the kernel-cache lookup) runs in every process; JAX's cache then saves XLA's
own compile. Because the bridge's opaque is byte-identical across processes, a second process
hits JAX's cache for computations containing Triton kernels.

:func:`enable_jax_cache` never overrides what the user set (``JAX_COMPILATION_CACHE_DIR`` and
the other ``JAX_*`` variables, or ``jax.config.update``): it keeps the user's values and says
so once when they differ from what it was asked.

JAX's directory holds one file ``<key>-cache`` per executable and, when JAX evicts
(``jax_compilation_cache_max_size`` set), ``<key>-atime`` beside it (the last access, 8 bytes of
``time.time_ns()``, little-endian) and the lock ``.lockfile`` (a ``filelock.FileLock`` that JAX
holds while it reads, writes or evicts). :func:`prune_jax_cache` follows that format: it takes
the same lock, orders entries by their ``-atime`` (the ``-cache`` file's mtime where there is
none) and removes ``-cache`` before ``-atime``, as JAX's own eviction does. This module imports
neither jax nor triton at import time: the command runs on an operator's box.
"""

from __future__ import annotations

import logging
import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kernelcache import units
from kernelcache.process import warn_once

logger = logging.getLogger(__name__)

CACHE_SUFFIX = "-cache"
ATIME_SUFFIX = "-atime"
LOCK_NAME = ".lockfile"
#: seconds ``jax-cache`` waits for JAX's lock (JAX's own default for its readers and writers)
LOCK_TIMEOUT = 10.0

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
        return units.parse_size(value)
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
        from .caches import default_cache

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


# -- showing and pruning JAX's directory ---------------------------------------------------
@dataclass(frozen=True)
class JaxEntry:
    """One executable in JAX's cache: its key, the ``-cache`` file's size, its last use."""

    key: str
    size: int
    last_used: float


def scan_jax_cache(directory: str | os.PathLike[str]) -> tuple[list[JaxEntry], list[str]]:
    """The entries of JAX's cache ``directory``, least recently used first, and the ``-atime``
    files without a ``-cache`` file. What is there is untrusted: only regular files count, and
    an ``-atime`` that is not 8 bytes of a plausible time is ignored (the mtime is used)."""
    entries: list[JaxEntry] = []
    names = set()
    try:
        listing = list(os.scandir(directory))
    except FileNotFoundError:
        return [], []
    for item in listing:
        names.add(item.name)
    for item in listing:
        if not item.name.endswith(CACHE_SUFFIX) or item.name == CACHE_SUFFIX:
            continue
        try:
            st = item.stat(follow_symlinks=False)
        except OSError:
            continue
        if not stat.S_ISREG(st.st_mode):
            continue
        key = item.name[: -len(CACHE_SUFFIX)]
        last = st.st_mtime
        if key + ATIME_SUFFIX in names:
            last = _atime(os.path.join(directory, key + ATIME_SUFFIX)) or last
        entries.append(JaxEntry(key, st.st_size, last))
    entries.sort(key=lambda e: (e.last_used, e.key))
    stray = sorted(
        n
        for n in names
        if n.endswith(ATIME_SUFFIX) and n[: -len(ATIME_SUFFIX)] + CACHE_SUFFIX not in names
    )
    return entries, stray


def _atime(path: str) -> float | None:
    """The time in an ``-atime`` file (seconds), or None when it is not one."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        raw = os.read(fd, 9)
    except OSError:
        return None
    finally:
        os.close(fd)
    if len(raw) != 8:
        return None
    seconds = int.from_bytes(raw, "little") / 1e9
    return seconds if 0 < seconds < time.time() + 86400 else None


def plan_jax_prune(
    entries: list[JaxEntry],
    *,
    max_size: int | None,
    max_age: float | None,
    now: float | None = None,
) -> list[JaxEntry]:
    """The entries to remove: those not used for ``max_age`` seconds, then, least recently
    used first, as many as needed to bring the rest to at most ``max_size`` bytes."""
    now = time.time() if now is None else now
    doomed = [e for e in entries if max_age is not None and now - e.last_used > max_age]
    if max_size is not None:
        gone = {e.key for e in doomed}
        total = sum(e.size for e in entries if e.key not in gone)
        for e in entries:
            if total <= max_size:
                break
            if e.key not in gone:
                doomed.append(e)
                gone.add(e.key)
                total -= e.size
    return sorted(doomed, key=lambda e: (e.last_used, e.key))


def prune_jax_cache(
    directory: str | os.PathLike[str],
    doomed: list[JaxEntry],
    stray: list[str],
    *,
    timeout: float = LOCK_TIMEOUT,
    progress: Callable[[int], object] | None = None,
) -> tuple[int, int]:
    """Remove ``doomed`` entries (``-cache``, then ``-atime``) and the ``stray`` ``-atime``
    files under JAX's own lock; (entries removed, bytes freed). An entry whose ``-cache`` file
    changed since the scan (JAX rewrote it) is kept.

    Raises:
        TimeoutError: JAX's lock was held for ``timeout`` seconds.
        OSError: the lock cannot be taken.
    """
    import filelock

    lock = filelock.FileLock(os.path.join(directory, LOCK_NAME))
    try:
        lock.acquire(timeout=timeout)
    except filelock.Timeout:
        raise TimeoutError(
            f"JAX's cache lock {lock.lock_file} was held for {timeout:g} s"
        ) from None
    removed = freed = 0
    try:
        for entry in doomed:
            path = os.path.join(directory, entry.key + CACHE_SUFFIX)
            try:
                if os.stat(path, follow_symlinks=False).st_size != entry.size:
                    continue
                os.unlink(path)
                removed += 1
                freed += entry.size
            except FileNotFoundError:
                pass
            try:
                os.unlink(os.path.join(directory, entry.key + ATIME_SUFFIX))
            except FileNotFoundError:
                pass
            if progress is not None:
                progress(1)
        for name in stray:
            try:
                os.unlink(os.path.join(directory, name))
            except FileNotFoundError:
                pass
    finally:
        lock.release()
    return removed, freed
