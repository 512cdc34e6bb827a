"""JAX's cache directory as ``kernelcache jax-cache`` shows and prunes it.

JAX's directory holds one file ``<key>-cache`` per executable and, when JAX evicts
(``jax_compilation_cache_max_size`` set), ``<key>-atime`` beside it (the last access, 8 bytes of
``time.time_ns()``, little-endian) and the lock ``.lockfile`` (a ``filelock.FileLock`` that JAX
holds while it reads, writes or evicts). :func:`prune_jax_cache` follows that format: it takes
the same lock, orders entries by their ``-atime`` (the ``-cache`` file's mtime where there is
none) and removes ``-cache`` before ``-atime``, as JAX's own eviction does. This module imports
neither jax nor triton: the command runs on an operator's box.
"""

from __future__ import annotations

import logging
import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass

logger = logging.getLogger(__name__)

CACHE_SUFFIX = "-cache"
ATIME_SUFFIX = "-atime"
LOCK_NAME = ".lockfile"
#: seconds ``jax-cache`` waits for JAX's lock (JAX's own default for its readers and writers)
LOCK_TIMEOUT = 10.0


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
        if item.is_file(follow_symlinks=False):  # (a directory planted: neither entry nor stray)
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
    changed since the scan (JAX rewrote it), or a file that cannot be removed (another user's,
    or a directory planted under its name), is kept.

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
                kept = os.stat(path, follow_symlinks=False).st_size != entry.size
            except OSError:
                kept = True
            if not kept and _unlink(path):
                removed += 1
                freed += entry.size
            _unlink(os.path.join(directory, entry.key + ATIME_SUFFIX))
            if progress is not None:
                progress(1)
        for name in stray:
            _unlink(os.path.join(directory, name))
    finally:
        lock.release()
    return removed, freed


def _unlink(path: str) -> bool:
    """Remove the file ``path``; whether it was (gone already, or not removable: False)."""
    try:
        os.unlink(path)
    except OSError:
        return False
    return True
