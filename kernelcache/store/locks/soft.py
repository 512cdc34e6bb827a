"""Soft locks for filesystems where flock does not work (NFS without lockd, some FUSE mounts).

A soft lock is a file created exclusively that holds ``{host, pid, time, token}``. It is stale,
and is broken, when its holder is a dead process on this host or its mtime is older than the
staleness time; a holder refreshes the mtime while it holds the lock.
"""

from __future__ import annotations

import contextlib
import os
import stat
import time

from ...fsio import READ_FLAGS  # a FIFO planted as a lock file must not hang the open
from ...jsonio import load_json
from ...process import HOST
from .liveness import pid_alive

#: a soft lock file still without its holder record this long after it was made or touched
#: lost its holder between creating it and writing the record (done at once): it is stale
UNWRITTEN_STALE = 5.0
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
