"""The readers' shared flock on an artifact, and how removal keeps readers away.

A reader holds a shared flock on the artifact it reads; deleting or quarantining an entry takes
that flock exclusively first, so bytes are never removed under a reader that holds them.
"""

from __future__ import annotations

import os
import time

from ...fsio import (
    READ_FLAGS,  # a FIFO planted as a lock file must not hang the open
    flock_by,
)


def exclude_readers(dfd: int, names: list[str], *, wait: float) -> list[int] | None:
    """Lock every file of ``names`` in ``dfd`` exclusively (readers hold them shared).

    Returns the descriptors to close once the files are gone, or None if a reader kept a
    file for ``wait`` seconds. Links and missing files need no lock.
    """
    fds: list[int] = []
    deadline = time.monotonic() + wait
    for name in names:
        try:
            fd = os.open(name, READ_FLAGS, dir_fd=dfd)
        except OSError:
            continue
        fds.append(fd)
        if not flock_by(fd, deadline):
            for held in fds:
                os.close(held)
            return None
    return fds
