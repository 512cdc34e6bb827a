"""Reading what others may have planted, safely: files and the JSON in them.

Files under a shared root are opened with :data:`READ_FLAGS`: no symlink is followed and a
planted FIFO cannot block the open; one that is written, or whose mode or times are set, is
opened with :func:`open_planted`, which also refuses anything but a regular file of one link
(a hard link planted under its name would have this process change a file elsewhere, that it
owns). Files named on a command line are opened with
:func:`open_regular`, which refuses anything but a regular file. JSON from outside the process
(files in a shared root, bundles, manifests, remote values) is parsed with :func:`load_json`,
whose every failure is a ValueError: hostile input is unreadable data, never a crash. A file
of a process's own that others may lock too is locked with :func:`flock_by`, which waits
until a deadline, never for ever.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import stat
import time
from typing import IO, Any

from .errors import NotRegularFile, UnreadableFile

#: how housekeeping reads open files: no symlinks, and a planted FIFO cannot block the open
READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


def open_regular(path: str) -> IO[bytes]:
    """``path`` opened for reading in binary mode, if it is a regular file.

    Input named on a command line (a bundle, a manifest) is opened this way: a FIFO or a
    device is refused at once instead of blocking the reader (or reading forever).

    Raises:
        NotRegularFile: it is not a regular file.
        OSError: it cannot be opened.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotRegularFile(errno.EINVAL, "not a regular file", path)
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def open_planted(name: str, flags: int, mode: int = 0o666, *, dir_fd: int | None = None) -> int:
    """A descriptor of ``name`` (``os.open`` with ``flags``, under ``dir_fd``) where anyone
    who writes the directory may have planted something under that name: no symlink is
    followed, a FIFO cannot block the open, and anything but a regular file with one link is
    refused. The descriptor is blocking, as a file's always is. A file another process
    replaced between the open and the check (no links left) is opened again.

    Raises:
        NotRegularFile: ``name`` is a FIFO, a device, a directory or a hard link.
        OSError: it cannot be opened (a FIFO with no reader: ENXIO).
    """
    flags |= os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    for _ in range(_REOPENS):
        fd = os.open(name, flags, mode, dir_fd=dir_fd)
        try:
            st = os.fstat(fd)
            if stat.S_ISREG(st.st_mode) and st.st_nlink == 0:  # (replaced as it was opened)
                os.close(fd)
                continue
            if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
                what = "a hard link" if stat.S_ISREG(st.st_mode) else "not a regular file"
                raise NotRegularFile(errno.EINVAL, what, name)
            return fd
        except BaseException:
            os.close(fd)
            raise
    raise NotRegularFile(errno.EINVAL, f"replaced each of {_REOPENS} times it was opened", name)


#: how many times :func:`open_planted` opens a name that another process replaces each time
#: between the open and the check (a file replaced so is unlinked: no links left)
_REOPENS = 5


def changed_at(st: os.stat_result) -> float:
    """When a file last changed, for age limits (grace periods, ``--quarantine-age``): its
    mtime, or its ctime where that is earlier. An mtime in the future (set by a tool, or by a
    host whose clock is ahead) would otherwise keep a file young forever; the ctime is set by
    the file system when the file changes and cannot be set back or forward by ``utime``."""
    return min(st.st_mtime, st.st_ctime)


def read_exact(fd: int, size: int) -> bytes | None:
    """Read exactly ``size`` bytes from ``fd``; None if the file is shorter."""
    first = os.read(fd, size)
    if len(first) == size:
        return first
    chunks = [first]
    remaining = size - len(first)
    while remaining > 0:
        chunk = os.read(fd, remaining)
        if not chunk:
            return None
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def load_json(raw: bytes | str) -> Any:
    """``json.loads`` whose every failure is a ValueError.

    Deeply nested input makes ``json.loads`` raise RecursionError; planted in a cache root it
    must read as unreadable data, never crash the reader.
    """
    try:
        return json.loads(raw)
    except RecursionError:
        raise UnreadableFile("JSON nested too deeply") from None


def flock_by(fd: int, deadline: float, *, poll: float = 0.002) -> bool:
    """The exclusive ``flock`` on ``fd``, tried until the monotonic time ``deadline``: False
    if another holder kept it that long; True once had, or where flock does not work on the
    file's filesystem (there is nothing to wait for)."""
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(poll)
        except OSError:
            return True
