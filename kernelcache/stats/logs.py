"""Reading one per-process log under ``<root>/.stats/`` as bytes, without trusting it.

A log is untrusted input: it is opened without following a symlink and without blocking, and a
log larger than :data:`MAX_LOG_BYTES` or not a regular file is refused; a line longer than
:data:`MAX_LINE_BYTES` is read as unreadable (what JSON makes of a line of ``[{},{},...]`` holds
thirty times its bytes in memory). What its lines hold is added up by
:mod:`kernelcache.stats.summary`.
"""

from __future__ import annotations

import errno
import os
import stat

from ..errors import FileTooLarge, NotRegularFile
from ..fsio import READ_FLAGS

#: a statistics log larger than this is not read (a process appends one line a minute)
MAX_LOG_BYTES = 256 << 20
#: the longest line of a log that is read (a process writes lines of a few hundred bytes)
MAX_LINE_BYTES = 64 << 10


def read_log_file(dfd: int, name: str, most: int = MAX_LOG_BYTES) -> bytes:
    """The bytes of the log ``name`` in the directory ``dfd``, read without blocking: no
    symlink is followed, and anything but a regular file (a planted FIFO or device) or a file
    over ``most`` bytes is refused.

    Raises:
        OSError: it cannot be read (the message says why).
    """
    fd = os.open(name, READ_FLAGS, dir_fd=dfd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFile(errno.EINVAL, "not a regular file")
        if st.st_size > most:
            raise FileTooLarge(errno.EFBIG, f"larger than {most >> 20} MiB")
        chunks = []
        remaining = most + 1
        while remaining > 0:
            chunk = os.read(fd, min(remaining, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            remaining -= len(chunk)
        if remaining <= 0:
            raise FileTooLarge(errno.EFBIG, f"larger than {most >> 20} MiB")
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_log_lines(dfd: int, name: str) -> list[bytes]:
    """The lines of the log ``name`` in ``dfd`` (:func:`read_log_file`), each one longer than
    :data:`MAX_LINE_BYTES` read as an empty line (unreadable, as JSON).

    Raises:
        OSError: it cannot be read (the message says why).
    """
    lines = read_log_file(dfd, name).splitlines()
    return [line if len(line) <= MAX_LINE_BYTES else b"" for line in lines]
