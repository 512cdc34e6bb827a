"""Circuit breakers and first contacts shared by the processes of a node: a tier (or one of its
shards) that failed is skipped by every process using the same cache root, not only by the one
that waited for it, and the first request of the node's processes to a tier is made by one of
them while the others wait for its answer (:mod:`.contact` decides who asks and who waits).

A tripped breaker is a file ``<root>/.breakers/<digest>`` (a digest of the tier's label and the
shard) whose modification time is the wall-clock time until which the tier is skipped: tripping
creates the file if it is absent and sets that time; asking is one ``stat``. So whatever the
faults, a tier that times out costs each node about one timeout per breaker period, not one per
process.

A first contact in flight is the file ``<digest>.probe``, created only if absent by the process
that makes it, its modification time the wall-clock time by which it ends (one past that time is
stale: its maker died or hangs, and another process takes over); ``<digest>.alive`` has the
time the tier last answered such a request.

The directory is hostile territory: nothing is followed through a symlink, a file another
user owns is read but not changed (the breaker then stays in this process), and a time further
ahead than the breaker's own length (a clock, or a neighbour, gone wrong) counts as that
length from now. A root where the file cannot be written keeps each breaker, and each first
contact, in its process.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
import time

from ..fsio import open_planted
from ..store.layout import BREAKER_DIR, create_exclusive, open_subdir

#: a first contact in flight, as another process sees it: (inode, modification time in ns)
ProbeId = tuple[int, int]
#: seconds past its end after which a first contact in flight is taken for a dead one
STALE_AFTER = 1.0


class SharedBreakers:
    """The breakers of one tier (``label``) in the root ``root`` (None: none are shared)."""

    def __init__(self, root: str | None, label: str) -> None:
        self.root = root if root and os.path.isabs(root) else None  # not a root: "remote:..."
        self.label = label
        self._dfd: int | None = None
        #: shard -> the first contact this process has in flight (its file's identity)
        self._probes: dict[str, ProbeId] = {}

    def _name(self, shard: str) -> str:
        return hashlib.sha256(f"{self.label}\0{shard}".encode()).hexdigest()[:32]

    def _dir(self, create: bool) -> int | None:
        if self._dfd is None and self.root is not None:
            with contextlib.suppress(OSError):
                if create:  # as the store makes a root at its first write
                    os.makedirs(self.root, exist_ok=True)
                self._dfd = open_subdir(self.root, BREAKER_DIR, create=create)
        return self._dfd

    def _stat(self, name: str) -> os.stat_result | None:
        """The status of the regular file ``name`` of the directory, or None (absent, a link,
        not a file, or no directory)."""
        dfd = self._dir(create=False)
        if dfd is None:
            return None
        try:
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        except OSError:
            return None
        return st if stat.S_ISREG(st.st_mode) else None

    def until(self, shard: str, longest: float) -> float:
        """The wall-clock time until which ``shard`` ("" for the whole tier) is skipped by
        the processes of this root (0.0: it is not), at most ``longest`` seconds from now."""
        st = self._stat(self._name(shard))
        if st is None:
            return 0.0
        now = time.time()
        return min(st.st_mtime, now + longest) if st.st_mtime > now else 0.0

    def _set_time(self, name: str, when: float) -> bool:
        """Create ``name`` if absent and set its time to ``when``; whether it was set."""
        dfd = self._dir(create=True)
        if dfd is None:
            return False
        try:  # (a planted FIFO, directory or hard link is refused: the time is not shared)
            fd = open_planted(name, os.O_WRONLY | os.O_CREAT, dir_fd=dfd)
        except OSError:
            return False
        try:
            os.utime(fd, (when, when))
            return True
        except OSError:  # another user's file: read by all, changed by its owner only
            return False
        finally:
            os.close(fd)

    def trip(self, shard: str, seconds: float) -> bool:
        """Skip ``shard`` for ``seconds`` in every process of this root; whether it is
        shared (False: the root cannot hold it)."""
        return self._set_time(self._name(shard), time.time() + seconds)

    # -- first contacts ---------------------------------------------------------------------
    def begin_probe(self, shard: str, seconds: float) -> ProbeId | None:
        """Start the node's first contact with ``shard``, to end within ``seconds``: None when
        this process makes it (or the root cannot share it: then each process makes its own),
        else the identity of another process's first contact in flight. One past its end by
        :data:`STALE_AFTER` is removed, and this process takes over."""
        dfd = self._dir(create=True)
        if dfd is None:
            return None
        name = self._name(shard) + ".probe"
        for _ in range(3):
            try:
                fd = create_exclusive(name, dfd)
            except FileExistsError:
                try:
                    st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                except FileNotFoundError:
                    continue  # ended meanwhile: try again
                except OSError:
                    return None
                if not stat.S_ISREG(st.st_mode):
                    return None  # a link or a directory planted there: nothing is shared
                if st.st_mtime + STALE_AFTER > time.time():
                    return (st.st_ino, st.st_mtime_ns)
                with contextlib.suppress(OSError):  # stale (another user's stays: see below)
                    os.unlink(name, dir_fd=dfd)
                continue
            except OSError:
                return None
            try:
                until = time.time() + seconds
                os.utime(fd, (until, until))
                st = os.fstat(fd)
                self._probes[shard] = (st.st_ino, st.st_mtime_ns)
            except OSError:
                return None
            finally:
                os.close(fd)
            return None
        return None  # a stale one this user cannot remove: this process makes its own

    def probe_state(self, shard: str) -> tuple[ProbeId | None, float]:
        """``(the first contact with shard in flight, or None; the wall-clock time the shard
        last answered one, 0.0 for never)``."""
        probe = self._stat(self._name(shard) + ".probe")
        alive = self._stat(self._name(shard) + ".alive")
        return (
            None if probe is None else (probe.st_ino, probe.st_mtime_ns),
            0.0 if alive is None else alive.st_mtime,
        )

    def end_probe(self, shard: str, answered: bool) -> None:
        """End this process's first contact with ``shard``; ``answered``: the shard answered
        it (the time is noted for the processes waiting)."""
        mine = self._probes.pop(shard, None)
        if answered:
            self._set_time(self._name(shard) + ".alive", time.time())
        dfd = self._dir(create=False)
        if mine is None or dfd is None:
            return
        name = self._name(shard) + ".probe"
        st = self._stat(name)
        if st is not None and (st.st_ino, st.st_mtime_ns) == mine:
            with contextlib.suppress(OSError):
                os.unlink(name, dir_fd=dfd)

    def close(self) -> None:
        if self._dfd is not None:
            with contextlib.suppress(OSError):
                os.close(self._dfd)
            self._dfd = None
