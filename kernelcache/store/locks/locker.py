"""Per-key locks under ``<root>/.locks/``, the readers' shared flock on an artifact, and the
wait budget of a call.

Two mechanisms, chosen per root:

* ``flock`` (default where it works): ``<key>.lock``, locked exclusively by writers, prune and
  repair, and ``<key>.build.lock``, locked exclusively by the single builder of a key. Readers
  do not use these files: they hold a shared flock on the artifact they read, which deletion
  and quarantine take exclusively first (:func:`exclude_readers`). The kernel drops a flock
  when its process dies, so a killed process never leaves a stale one.
* ``soft`` (filesystems where flock does not work: NFS without lockd, some FUSE mounts):
  ``<key>.softlock``, created exclusively and holding ``{host, pid, time, token}``. Only
  exclusive holders use it; readers rely on digest verification. A holder refreshes the file's
  mtime while it holds the lock. A lock is stale, and is broken, when its holder is a dead
  process on this host or its mtime is older than ``stale_after`` seconds.

``auto`` probes flock once per root and process and falls back to ``soft`` on ENOLCK, ENOSYS,
EOPNOTSUPP or EINVAL. All processes sharing a root must end up in the same mode.

Invariants: lock files are opened and held to the store's trust policy as
:mod:`.lockfiles` says; a lock file of a user the policy does not trust is never waited on: the
lock is unavailable, and the caller works without it. Waits are bounded per call, in total: a
:class:`WaitBudget` is what one call may still spend waiting, for every lock, reader and remote
claim it waits on. The exclusive flock is filelock's descriptor lock, so a tool locking
``.locks/<key>.lock`` with ``filelock.FileLock`` excludes kernelcache's writers and the other
way round. Why the rest is not filelock's: docs/reliability.md, "Locks".
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ...config import DEFAULTS, LOCK_MODES
from ...errors import InvalidValue, LockTimeout, LockUnavailable
from ...process import HOST
from ..layout import LOCK_DIR, open_subdir
from .flock import FLOCK_UNSUPPORTED, flock_holder, try_flock, unflock
from .lockfiles import open_lock_dir, open_lock_file, same_file, unlink_lock_file
from .soft import MAX_HEARTBEAT, create_soft_lock, read_soft_record, soft_lock_stale

if TYPE_CHECKING:
    from ..trust import TrustPolicy

logger = logging.getLogger(__name__)


@dataclass
class Held:
    """A lock that is held. Release it with :meth:`release` (or use it as a context manager)."""

    locker: Locker
    name: str
    fd: int = -1  # flock: the lock file's descriptor; -1 for a soft lock or no lock
    shared: bool = False  # flock: a shared lock
    token: str = ""  # soft: the token written into the lock file
    _stop: threading.Event | None = None
    #: flock, exclusive: the lock directory, kept open to unlink the lock file at release
    dir_fd: int = -1

    def release(self, *, remove: bool = False) -> None:
        """Release the lock; with ``remove``, unlink the lock file first (exclusive holders only)."""
        if self._stop is not None:
            self._stop.set()
        if self.fd >= 0:
            try:
                if remove:
                    unlink_lock_file(self.locker.root, self.name + ".lock", self.dir_fd)
                unflock(self.fd, shared=self.shared)
            finally:
                os.close(self.fd)
                self.fd = -1
                if self.dir_fd >= 0:
                    os.close(self.dir_fd)
                    self.dir_fd = -1
        elif self.token:
            self.locker._release_soft(self.name, self.token)
            self.token = ""

    def __enter__(self) -> Held:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class Locker:
    """Locks for one root. Safe to share between threads; each acquire is independent."""

    def __init__(
        self,
        root: str,
        *,
        mode: str = "auto",
        stale_after: float = DEFAULTS.lock_stale,
        trust: TrustPolicy | None = None,
    ) -> None:
        if mode not in LOCK_MODES:
            raise InvalidValue(f"lock mode {mode!r} is not one of {', '.join(LOCK_MODES)}")
        self.root = root
        self.requested_mode = mode
        self.stale_after = stale_after
        #: whose lock files are waited on, and the bits this process's lock files keep
        self.trust = trust
        self._mode: str | None = None if mode == "auto" else mode

    # -- public ---------------------------------------------------------------------------
    @property
    def mode(self) -> str:
        """``flock`` or ``soft``; probes the filesystem on first use in ``auto`` mode."""
        if self._mode is None:
            probed = self._probe()
            if probed is None:
                return "flock"  # inconclusive (no lock directory yet): probe again next time
            self._mode = probed
        return self._mode

    def acquire(self, name: str, *, shared: bool, timeout: float) -> Held:
        """Take the lock ``name`` (a validated key), waiting at most ``timeout`` seconds.

        ``timeout=0`` tries once. Shared soft locks are free (readers verify digests instead).

        Raises:
            LockTimeout: another holder kept it for the whole timeout.
            LockUnavailable: locks cannot be created here (unwritable or missing lock directory).
        """
        if timeout > 0 and _quiet(self.root):
            timeout = 0.0  # (a holder outlasted a call's whole wait here just now: WaitBudget)
        deadline = time.monotonic() + timeout
        if self.mode == "flock":
            return self._acquire_flock(name, shared, deadline)
        if shared:
            return Held(self, name)
        return self._acquire_soft(name, deadline)

    def acquire_soft(self, name: str, *, timeout: float) -> Held:
        """Take the soft lock ``name`` whatever this root's mode, breaking it if it is stale
        (prune removes the soft locks of gone holders this way).

        Raises:
            LockTimeout: a live holder kept it for the whole timeout.
            LockUnavailable: the soft lock cannot be created here.
        """
        return self._acquire_soft(name, time.monotonic() + timeout)

    def holder(self, name: str) -> dict[str, Any] | None:
        """Who holds the lock ``name``, where it can be told: ``{"pid", "host", "since"}``
        (``since``, the Unix time it was taken, is known for soft locks only); None if nobody
        is found."""
        try:
            dfd = open_subdir(self.root, LOCK_DIR, create=False)
        except OSError:
            return None
        try:
            if self.mode == "soft":
                record = read_soft_record(dfd, name + ".softlock")
                if record is None or not isinstance(record.get("pid"), int):
                    return None
                since = record.get("time")
                return {
                    "pid": record["pid"],
                    "host": str(record.get("host")),
                    "since": since if isinstance(since, (int, float)) else None,
                }
            pid = flock_holder(dfd, name + ".lock")
            return None if pid is None else {"pid": pid, "host": HOST, "since": None}
        finally:
            os.close(dfd)

    # -- flock ----------------------------------------------------------------------------
    def _acquire_flock(self, name: str, shared: bool, deadline: float) -> Held:
        filename = name + ".lock"
        delay = 0.0005
        while True:
            dfd = open_lock_dir(self.root)
            kept = False
            try:
                fd = open_lock_file(self.root, dfd, filename, self.trust)
                try:
                    locked = try_flock(fd, shared=shared)
                except OSError as e:
                    os.close(fd)
                    if e.errno in FLOCK_UNSUPPORTED:
                        raise LockUnavailable(
                            e.errno, f"flock does not work under {self.root}"
                        ) from e
                    raise
                if not locked:
                    os.close(fd)
                elif shared:
                    return Held(self, name, fd=fd, shared=True)
                elif same_file(dfd, filename, fd):
                    kept = True  # (the release unlinks the lock file relative to it)
                    return Held(self, name, fd=fd, dir_fd=dfd)
                else:
                    # The file was unlinked (by a prune) between our open and our lock: retry.
                    os.close(fd)
                    continue
            finally:
                if not kept:
                    os.close(dfd)
            delay = self._wait(name, deadline, delay, cap=0.01)

    def _wait(self, name: str, deadline: float, delay: float, *, cap: float) -> float:
        """Sleep before the next try (exponential back-off up to ``cap``); return the next delay.

        Raises:
            LockTimeout: the deadline has passed.
        """
        now = time.monotonic()
        if now >= deadline:
            raise LockTimeout(errno.EAGAIN, f"timed out waiting for lock {name} under {self.root}")
        time.sleep(min(delay, deadline - now))
        return min(delay * 2, cap)

    def _probe(self) -> str | None:
        """``flock`` or ``soft`` for this root's filesystem; None if it cannot be told yet."""
        try:
            dfd = open_lock_dir(self.root)
        except LockUnavailable:
            return None
        try:
            fd = open_lock_file(self.root, dfd, ".probe", self.trust)
            try:
                if try_flock(fd, shared=False):  # else someone else holds the probe: it works
                    unflock(fd, shared=False)
            except OSError as e:
                if e.errno in FLOCK_UNSUPPORTED:
                    logger.warning(
                        "flock does not work under %s (%s); using soft lock files", self.root, e
                    )
                    return "soft"
                raise
            finally:
                os.close(fd)
        except LockUnavailable:
            return None
        finally:
            os.close(dfd)
        return "flock"

    # -- soft -----------------------------------------------------------------------------
    def _acquire_soft(self, name: str, deadline: float) -> Held:
        filename = name + ".softlock"
        token = uuid.uuid4().hex
        record = json.dumps({"host": HOST, "pid": os.getpid(), "time": time.time(), "token": token})
        delay = 0.001
        while True:
            dfd = open_lock_dir(self.root)
            try:
                try:
                    fd = create_soft_lock(dfd, filename, record.encode(), self._prepare_soft)
                except FileExistsError:
                    if self._break_if_stale(dfd, filename):
                        continue  # broken: try again now, even with no time left to wait
                except OSError as e:
                    raise LockUnavailable(
                        e.errno,
                        f"cannot create soft lock {filename} under {self.root}: {e.strerror}",
                    ) from e
                else:
                    stop = threading.Event()
                    held = Held(self, name, token=token, _stop=stop)
                    self._start_heartbeat(filename, fd, stop)
                    return held
            finally:
                os.close(dfd)
            delay = self._wait(name, deadline, delay, cap=0.05)

    def _prepare_soft(self, fd: int) -> None:
        if self.trust is not None:  # (others read it to judge staleness)
            self.trust.limit_write_bits(fd)

    def _break_if_stale(self, dfd: int, filename: str) -> bool:
        """Move a stale lock out of the way; whether one was broken.

        Raises:
            LockUnavailable: the lock file belongs to a user the trust policy does not trust.
        """
        record = read_soft_record(dfd, filename)
        if record is None:
            return False
        if self.trust is not None and not self.trust.trusts(record["uid"]):
            raise LockUnavailable(
                errno.EPERM,
                f"soft lock {filename} under {self.root}/{LOCK_DIR} belongs to user "
                f"{record['uid']}, whom KERNELCACHE_TRUST={self.trust.policy} does not trust; "
                "not waiting for it",
            )
        if not soft_lock_stale(record, self.stale_after):
            return False
        # Move it aside under a unique name, then check we moved the lock we judged stale: a
        # concurrent breaker may have broken it and a new holder taken it in between.
        aside = f"{filename}.broken-{uuid.uuid4().hex}"
        try:
            os.rename(filename, aside, src_dir_fd=dfd, dst_dir_fd=dfd)
        except FileNotFoundError:
            return True  # someone else broke it
        moved = read_soft_record(dfd, aside)
        fresh = moved is not None and moved.get("token") != record.get("token")
        if fresh:
            # We took a fresh lock: put it back unless yet another holder arrived meanwhile.
            with contextlib.suppress(FileExistsError):
                os.link(aside, filename, src_dir_fd=dfd, dst_dir_fd=dfd)
        else:
            logger.warning(
                "broke stale lock %s under %s (holder %s pid %s)",
                filename,
                self.root,
                record.get("host"),
                record.get("pid"),
            )
        # (OSError: a directory planted under the lock's name stays aside; the name is free)
        with contextlib.suppress(OSError):
            os.unlink(aside, dir_fd=dfd)
        return not fresh

    def _start_heartbeat(self, filename: str, fd: int, stop: threading.Event) -> None:
        """Refresh the lock file open as ``fd`` (this holder's own, whatever its name leads to
        now) until ``stop`` is set, then close ``fd``."""
        interval = min(max(self.stale_after / 4, 0.05), MAX_HEARTBEAT)

        def beat() -> None:
            try:
                while not stop.wait(interval):
                    os.utime(fd)
            except OSError:
                pass  # (gone stale on its own: others may break it)
            finally:
                os.close(fd)

        threading.Thread(target=beat, name=f"kernelcache-lock-{filename}", daemon=True).start()

    def _release_soft(self, name: str, token: str) -> None:
        filename = name + ".softlock"
        try:
            dfd = open_subdir(self.root, LOCK_DIR, create=False)
        except OSError:
            return
        try:
            record = read_soft_record(dfd, filename)
            if record is not None and record.get("token") == token:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(filename, dir_fd=dfd)
            else:
                logger.warning("soft lock %s under %s was broken while held", filename, self.root)
        finally:
            os.close(dfd)


#: per root, until when (``time.monotonic()``) this process's calls wait for none of its locks
_QUIET: dict[str, float] = {}


def _quiet(root: str | os.PathLike[str]) -> bool:
    """Whether this process waits for no lock under ``root`` now (see :class:`WaitBudget`)."""
    return _QUIET.get(os.fspath(root), 0.0) > time.monotonic()


class WaitBudget:
    """The time one call may still spend waiting, over all of its waits together (for locks,
    for readers, for the remote tier's lock): :meth:`remaining` counts down while the call
    waits, and stands still while it works (:meth:`paused`, around a build).

    A call's budget (one given its ``root``) that ran out found a holder that outlasts a whole
    timeout (a stuck builder, or a squatter holding every lock): for as long again, the
    process's later calls on that root start with none and its lock waits there try once (they
    build privately, keep what they made in memory), so such a holder costs a job one timeout,
    not one per call. Shorter waits of a store's own (a prune's, a publish's) give no root."""

    __slots__ = ("_end", "_length", "_root")

    def __init__(self, seconds: float, root: str | os.PathLike[str] | None = None) -> None:
        self._root = None if root is None else os.fspath(root)
        if self._root is not None and _quiet(self._root):
            seconds = 0.0
        self._end = time.monotonic() + seconds
        self._length = seconds

    def remaining(self) -> float:
        """Seconds left to wait (0 once spent: try once, never wait)."""
        left = self._end - time.monotonic()
        if left > 0:
            return left
        if self._root is not None and self._length > 0:  # (spent: once, for the next calls)
            _QUIET[self._root] = max(_QUIET.get(self._root, 0.0), time.monotonic() + self._length)
            self._length = 0.0
        return 0.0

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Work that is not waiting: its time is given back to the budget."""
        started = time.monotonic()
        try:
            yield
        finally:
            self._end += time.monotonic() - started
