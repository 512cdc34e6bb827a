"""Soft locks for filesystems where flock does not work (NFS without lockd, some FUSE mounts).

A soft lock is a file created exclusively that holds ``{host, pid, time, token}``. It is stale,
and is broken, when its holder is a dead process on this host or its mtime is older than the
staleness time; a holder refreshes the mtime while it holds the lock.

A lock file is put in place with its record already in it (:func:`create_soft_lock`: written to
a staged file, then hard-linked to the lock's name, atomic on NFS where ``O_EXCL`` may not be),
so a holder that stalls never leaves a lock without a record for another to break. Only where
the filesystem has no hard links is it created exclusively and written at once.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import time
import uuid
from collections.abc import Callable

from ...fsio import (
    READ_FLAGS,  # a FIFO planted as a lock file must not hang the open
    load_json,
)
from ...process import HOST, pid_alive
from ..layout import create_exclusive

#: a soft lock file still without its holder record this long after it was made or touched
#: lost its holder between creating it and writing the record (only where the filesystem has
#: no hard links; done at once): it is stale
UNWRITTEN_STALE = 5.0
#: what a staged soft lock file's name holds between the lock's name and a unique suffix
STAGED = ".staged-"
#: link(2) errors that mean the filesystem has no hard links
NO_LINKS = frozenset({errno.EPERM, errno.EOPNOTSUPP, errno.ENOSYS, errno.EMLINK, errno.EXDEV})


def create_soft_lock(
    dfd: int, filename: str, record: bytes, prepare: Callable[[int], object]
) -> int:
    """Create the soft lock file ``filename`` in ``dfd`` holding ``record`` (``prepare`` is
    given each new file's descriptor first), and return a descriptor open on it: its holder
    refreshes that file, never whatever later takes its name.

    Raises:
        FileExistsError: someone holds the lock.
        OSError: whatever else the system says.
    """
    staged = f"{filename}{STAGED}{uuid.uuid4().hex}"
    fd = _write_new(dfd, staged, record, prepare)
    try:
        os.link(staged, filename, src_dir_fd=dfd, dst_dir_fd=dfd, follow_symlinks=False)
    except FileExistsError:
        if os.fstat(fd).st_nlink != 2:
            os.close(fd)
            raise
        # (NFS: the link was made, and the reply saying so was lost)
    except OSError as e:
        os.close(fd)
        if e.errno not in NO_LINKS:
            raise
        fd = _write_new(dfd, filename, record, prepare)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(staged, dir_fd=dfd)
    return fd


def _write_new(dfd: int, name: str, data: bytes, prepare: Callable[[int], object]) -> int:
    """A new file ``name`` holding ``data``, open for writing."""
    fd = create_exclusive(name, dfd)
    try:
        prepare(fd)
        os.write(fd, data)
    except BaseException:
        os.close(fd)
        raise
    return fd


#: the longest pause between two refreshes of a held soft lock, whatever the staleness time
MAX_HEARTBEAT = 60.0


def read_soft_record(dfd: int, filename: str) -> dict | None:
    """The holder record of the soft lock file ``filename`` in ``dfd``, with its ``mtime``;
    None if it is gone or cannot be opened.

    Anything but a regular file holding a record (a planted FIFO or device, unreadable
    bytes) reads as a file without a holder record: stale after ``UNWRITTEN_STALE``.
    """
    try:
        fd = os.open(filename, READ_FLAGS, dir_fd=dfd)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        raw = b""
        if stat.S_ISREG(st.st_mode):
            with contextlib.suppress(OSError):
                raw = os.read(fd, 4096)
    finally:
        os.close(fd)
    try:
        record = load_json(raw)
    except ValueError:
        record = {}
    if not isinstance(record, dict):
        record = {}
    record["mtime"] = st.st_mtime
    record["uid"] = st.st_uid
    return record


def soft_lock_stale(record: dict, stale_after: float) -> bool:
    """Whether a soft lock's holder is gone: a dead pid on this host, or no sign of life for
    ``stale_after`` seconds."""
    age = time.time() - float(record.get("mtime", 0))
    if "token" not in record:  # no holder record: written at once, so its writer died
        return age > min(stale_after, UNWRITTEN_STALE)
    if record.get("host") == HOST and isinstance(record.get("pid"), int):
        if not pid_alive(record["pid"]):
            return True
    return age > stale_after
