"""flock-based locks: taking and dropping a descriptor lock, the names of a key's lock files, and
probing whether a lock file is held (and by whom). (Waiting for an exclusive flock until a
deadline is :func:`kernelcache.fsio.flock_by`.)

The exclusive flock is filelock's descriptor lock, so a tool locking ``.locks/<key>.lock`` with
``filelock.FileLock`` excludes kernelcache's writers and the other way round.
"""

from __future__ import annotations

import errno
import fcntl
import functools
import os
from collections.abc import Callable

from ...errors import LockUnavailable
from ...fsio import READ_FLAGS  # a FIFO planted as a lock file must not hang the open
from ...keys import KEY_PATTERN

#: the lock files of a key: its writers', its builder's and its soft lock
LOCK_SUFFIXES = (".build.lock", ".lock", ".softlock")
FLOCK_UNSUPPORTED = {errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL}


def try_flock(fd: int, *, shared: bool) -> bool:
    """One non-blocking try at the flock on ``fd``; False while another holder has it.

    Exclusive: filelock's descriptor lock. Shared: ``flock(LOCK_SH)`` (filelock has none).

    Raises:
        OSError: flock failed otherwise (ENOLCK and the like where it does not work).
    """
    if shared:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True
    return _descriptor_lock()[0](fd)


def unflock(fd: int, *, shared: bool) -> None:
    if shared:
        fcntl.flock(fd, fcntl.LOCK_UN)
    else:
        _descriptor_lock()[1](fd)


@functools.cache
def _descriptor_lock() -> tuple[Callable[[int], bool], Callable[[int], None]]:
    """filelock's (try once, unlock) of a descriptor's exclusive lock.

    Imported on first use: filelock takes longer to import than kernelcache, and a process that
    only reads never takes an exclusive lock.

    Raises:
        LockUnavailable: filelock is missing or older than 3.30.
    """
    try:
        from filelock import lock_descriptor, unlock_descriptor
    except ImportError as e:
        raise LockUnavailable(
            f"kernelcache's locks need filelock 3.30 or later ({e}); "
            "pip install 'filelock>=3.30,<5'"
        ) from e
    return functools.partial(lock_descriptor, blocking=False), unlock_descriptor


#: above any pid Linux hands out (pid_max is at most 2**22)


def flock_holder(dfd: int, name: str) -> int | None:
    """The pid of a process holding a flock on the file ``name`` in ``dfd`` (from
    /proc/locks); None when none is found or it cannot be told."""
    try:
        st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        with open("/proc/locks", "rb") as f:
            lines = f.read(1 << 22).splitlines()
    except OSError:
        return None
    wanted = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}".encode()
    for line in lines:
        fields = line.split()
        if len(fields) >= 6 and fields[1] == b"FLOCK" and fields[5] == wanted:
            return int(fields[4]) if fields[4].isdigit() else None
    return None


def lock_name(filename: str) -> tuple[str, str] | None:
    """Split a lock file name into (key, suffix), or None if it is not a per-key lock."""
    for suffix in LOCK_SUFFIXES:
        if filename.endswith(suffix):
            key = filename[: -len(suffix)]
            if KEY_PATTERN.fullmatch(key) is not None:
                return key, suffix
            return None
    return None


def flock_held(dfd: int, name: str) -> bool:
    """Whether someone holds a flock on the lock file ``name`` in ``dfd`` (probed without
    blocking; a file that vanished or cannot be opened counts as held: leave it alone)."""
    try:
        fd = os.open(name, READ_FLAGS, dir_fd=dfd)
    except OSError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False  # flock does not work here: the file cannot be held through it
    finally:
        os.close(fd)  # closing drops our probe lock
    return False
