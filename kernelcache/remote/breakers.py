"""Circuit breakers shared by the processes of a node: a tier (or one of its shards) that failed
is skipped by every process using the same cache root, not only by the one that waited for it.

A tripped breaker is a file ``<root>/.breakers/<digest>`` (a digest of the tier's label and the
shard) whose modification time is the wall-clock time until which the tier is skipped: tripping
creates the file if it is absent and sets that time; asking is one ``stat``. So whatever the
faults, a tier that times out costs each node about one timeout per breaker period (the
processes that were waiting on it when it failed wait together), not one per process.

The directory is hostile territory: nothing is followed through a symlink, a file another
user owns is read but not changed (the breaker then stays in this process), and a time further
ahead than the breaker's own length (a clock, or a neighbour, gone wrong) counts as that
length from now. A root where the file cannot be written keeps each breaker in its process.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
import time

from ..store.layout import BREAKER_DIR, open_subdir


class SharedBreakers:
    """The breakers of one tier (``label``) in the root ``root`` (None: none are shared)."""

    def __init__(self, root: str | None, label: str) -> None:
        self.root = root if root and os.path.isabs(root) else None  # not a root: "remote:..."
        self.label = label
        self._dfd: int | None = None

    def _name(self, shard: str) -> str:
        return hashlib.sha256(f"{self.label}\0{shard}".encode()).hexdigest()[:32]

    def _dir(self, create: bool) -> int | None:
        if self._dfd is None and self.root is not None:
            with contextlib.suppress(OSError):
                if create:  # as the store makes a root at its first write
                    os.makedirs(self.root, exist_ok=True)
                self._dfd = open_subdir(self.root, BREAKER_DIR, create=create)
        return self._dfd

    def until(self, shard: str, longest: float) -> float:
        """The wall-clock time until which ``shard`` ("" for the whole tier) is skipped by
        the processes of this root (0.0: it is not), at most ``longest`` seconds from now."""
        dfd = self._dir(create=False)
        if dfd is None:
            return 0.0
        try:
            st = os.stat(self._name(shard), dir_fd=dfd, follow_symlinks=False)
        except OSError:
            return 0.0
        if not stat.S_ISREG(st.st_mode):
            return 0.0
        now = time.time()
        return min(st.st_mtime, now + longest) if st.st_mtime > now else 0.0

    def trip(self, shard: str, seconds: float) -> bool:
        """Skip ``shard`` for ``seconds`` in every process of this root; whether it is
        shared (False: the root cannot hold it)."""
        dfd = self._dir(create=True)
        if dfd is None:
            return False
        until = time.time() + seconds
        flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(self._name(shard), flags, 0o666, dir_fd=dfd)
        except OSError:
            return False
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return False
            os.utime(fd, (until, until))
            return True
        except OSError:  # another user's file: read by all, changed by its owner only
            return False
        finally:
            os.close(fd)

    def close(self) -> None:
        if self._dfd is not None:
            with contextlib.suppress(OSError):
                os.close(self._dfd)
            self._dfd = None
