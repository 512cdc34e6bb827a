"""Reading and replacing small files in a shared root, safely.

Housekeeping (the scan index, the statistics summary, ``stats --output``) opens files with
:data:`READ_FLAGS` and replaces them with :func:`replace_file`: no symlink is followed, a planted
FIFO cannot block a reader, and a reader in another process sees the old file or the new one,
whole.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
import uuid
from typing import IO

from .errors import NotRegularFile

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


def changed_at(st: os.stat_result) -> float:
    """When a file last changed, for age limits (grace periods, ``--quarantine-age``): its
    mtime, or its ctime where that is earlier. An mtime in the future (set by a tool, or by a
    host whose clock is ahead) would otherwise keep a file young forever; the ctime is set by
    the file system when the file changes and cannot be set back or forward by ``utime``."""
    return min(st.st_mtime, st.st_ctime)


def replace_file(dfd: int, name: str, data: bytes) -> None:
    """Write ``data`` to ``name`` in the directory ``dfd`` atomically: readers see the old file
    or the new one, whole. Staged under a hidden unique name (never followed if planted as a
    link), then ``os.replace``d; nothing is left behind on failure.

    Raises:
        OSError: it could not be written (the old file, if any, is intact).
    """
    tmp = f".{name}.{os.getpid()}-{uuid.uuid4().hex}.tmp"
    fd = os.open(
        tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666, dir_fd=dfd
    )
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
        os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dfd)
        raise
