"""Reading and replacing small files in a shared root, safely.

Housekeeping (the scan index, the statistics summary, ``stats --output``) opens files with
:data:`READ_FLAGS` and replaces them with :func:`replace_file`: no symlink is followed, a planted
FIFO cannot block a reader, and a reader in another process sees the old file or the new one,
whole.
"""

from __future__ import annotations

import contextlib
import os
import uuid

#: how housekeeping reads open files: no symlinks, and a planted FIFO cannot block the open
READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


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
