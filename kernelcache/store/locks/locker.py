"""Per-key locks under ``<root>/.locks/``, and the readers' shared flock on an artifact.

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

Invariants: lock files are opened relative to the directory's descriptor with ``O_NOFOLLOW``
and ``O_NONBLOCK``, read-only, so a planted symlink is never followed, a FIFO never hangs an
open, and a lock file is never written. With a trust policy (a store's), a lock file keeps only
the read and write bits of the users the policy trusts (whoever can open it can hold it), and a
lock file of a user the policy does not trust is never waited on: the lock is unavailable, and
the caller works without it. Waits are bounded per call, in total (:class:`WaitBudget`). The exclusive flock is filelock's descriptor lock, so a
tool locking ``.locks/<key>.lock`` with ``filelock.FileLock`` excludes kernelcache's writers
and the other way round. Why the rest is not filelock's: docs/reliability.md, "Locks".
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import json
import logging
import os
import stat
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ...errors import InvalidValue, LockTimeout, LockUnavailable
from ...fsio import READ_FLAGS  # a FIFO planted as a lock file must not hang the open
from ...jsonio import load_json
from ...keys import KEY_PATTERN
from ...process import HOST
from ..layout import LOCK_DIR, create_exclusive, open_subdir

if TYPE_CHECKING:
    from ..trust import TrustPolicy

logger = logging.getLogger(__name__)

#: the lock files of a key: its writers', its builder's and its soft lock
LOCK_SUFFIXES = (".build.lock", ".lock", ".softlock")
_FLOCK_UNSUPPORTED = {errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL}
#: a soft lock file still without its holder record this long after it was made or touched
#: lost its holder between creating it and writing the record (done at once): it is stale
UNWRITTEN_STALE = 5.0
#: the longest pause between two refreshes of a held soft lock, whatever the staleness time
MAX_HEARTBEAT = 60.0


class WaitBudget:
    """The time one call may still spend waiting, over all of its waits together (for locks,
    for readers, for the remote tier's lock): :meth:`remaining` counts down while the call
    waits, and stands still while it works (:meth:`paused`, around a build)."""

    __slots__ = ("_end",)

    def __init__(self, seconds: float) -> None:
        self._end = time.monotonic() + seconds

    def remaining(self) -> float:
        """Seconds left to wait (0 once spent: try once, never wait)."""
        return max(0.0, self._end - time.monotonic())

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Work that is not waiting: its time is given back to the budget."""
        started = time.monotonic()
        try:
            yield
        finally:
            self._end += time.monotonic() - started


def _try_flock(fd: int, *, shared: bool) -> bool:
    """One non-blocking try at the flock on ``fd``; False while another holder has it.

    Exclusive: filelock's descriptor lock. Shared: ``flock(LOCK_SH)`` (filelock has none).

    Raises:
        OSError: flock failed otherwise (ENOLCK and the like where it does not work).
    """
    if shared:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True
    return _descriptor_lock()[0](fd)


def _unflock(fd: int, *, shared: bool) -> None:
    if shared:
        fcntl.flock(fd, fcntl.LOCK_UN)
    else:
        _descriptor_lock()[1](fd)


@functools.cache
def _descriptor_lock() -> tuple[Callable[[int], bool], Callable[[int], None]]:
    """filelock's (try once, unlock) of a descriptor's exclusive lock.

    Imported on first use: filelock takes longer to import than kernelcache, and a process that
    only reads never takes an exclusive lock.

    Raises:
        LockUnavailable: filelock is missing or older than 3.30.
    """
    try:
        from filelock import lock_descriptor, unlock_descriptor
    except ImportError as e:
        raise LockUnavailable(
            f"kernelcache's locks need filelock 3.30 or later ({e}); "
            "pip install 'filelock>=3.30,<5'"
        ) from e
    return functools.partial(lock_descriptor, blocking=False), unlock_descriptor


#: above any pid Linux hands out (pid_max is at most 2**22)
MAX_PID = 1 << 22


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists on this host (a pid read from a file is
    untrusted: anything but a plausible pid is no live process)."""
    if type(pid) is not int or not 0 < pid <= MAX_PID:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return not _exited(pid)


def _exited(pid: int) -> bool:
    """Whether the process ``pid`` has exited and waits to be reaped (a zombie): it holds no
    lock and will never refresh one. False where /proc cannot tell."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read(4096).rpartition(b")")[2].split()[:1]
    except OSError:
        return False
    return state in ([b"Z"], [b"X"])


def flock_holder(dfd: int, name: str) -> int | None:
    """The pid of a process holding a flock on the file ``name`` in ``dfd`` (from
    /proc/locks); None when none is found or it cannot be told."""
    try:
        st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        with open("/proc/locks", "rb") as f:
            lines = f.read(1 << 22).splitlines()
    except OSError:
        return None
    wanted = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}".encode()
    for line in lines:
        fields = line.split()
        if len(fields) >= 6 and fields[1] == b"FLOCK" and fields[5] == wanted:
            return int(fields[4]) if fields[4].isdigit() else None
    return None


def lock_name(filename: str) -> tuple[str, str] | None:
    """Split a lock file name into (key, suffix), or None if it is not a per-key lock."""
    for suffix in LOCK_SUFFIXES:
        if filename.endswith(suffix):
            key = filename[: -len(suffix)]
            if KEY_PATTERN.fullmatch(key) is not None:
                return key, suffix
            return None
    return None


def flock_held(dfd: int, name: str) -> bool:
    """Whether someone holds a flock on the lock file ``name`` in ``dfd`` (probed without
    blocking; a file that vanished or cannot be opened counts as held: leave it alone)."""
    try:
        fd = os.open(name, READ_FLAGS, dir_fd=dfd)
    except OSError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False  # flock does not work here: the file cannot be held through it
    finally:
        os.close(fd)  # closing drops our probe lock
    return False


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
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    for held in fds:
                        os.close(held)
                    return None
                time.sleep(0.002)
            except OSError:
                break  # no flock on this filesystem
    return fds


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
                    self.locker._unlink(self.name + ".lock", self.dir_fd)
                _unflock(self.fd, shared=self.shared)
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
        stale_after: float = 300.0,
        trust: TrustPolicy | None = None,
    ) -> None:
        if mode not in ("auto", "flock", "soft"):
            raise InvalidValue(f"lock mode {mode!r} is not one of auto, flock, soft")
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
    def _dir(self) -> int:
        try:
            try:
                return open_subdir(self.root, LOCK_DIR, create=True)
            except FileNotFoundError:
                os.makedirs(self.root, exist_ok=True)  # a fresh root: its first lock creates it
                return open_subdir(self.root, LOCK_DIR, create=True)
        except OSError as e:
            raise LockUnavailable(
                e.errno,
                f"cannot use lock directory {os.path.join(self.root, LOCK_DIR)}: "
                f"{e.strerror}; make it a writable directory (not a symlink)",
            ) from e

    def _open_lock_file(self, dfd: int, filename: str) -> int:
        try:
            fd = os.open(filename, READ_FLAGS | os.O_CREAT, 0o666, dir_fd=dfd)
        except PermissionError:
            # An existing lock file of another user in a sticky directory: open without O_CREAT.
            try:
                fd = os.open(filename, READ_FLAGS, dir_fd=dfd)
            except OSError as e:
                raise LockUnavailable(
                    e.errno, f"cannot open lock file {filename} under {self.root}: {e.strerror}"
                ) from e
        except OSError as e:
            raise LockUnavailable(
                e.errno,
                f"cannot open lock file {filename} under {self.root}/{LOCK_DIR}: {e.strerror}"
                + ("; a symlink was planted there, remove it" if e.errno == errno.ELOOP else ""),
            ) from e
        try:
            self._vet(fd, filename)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _vet(self, fd: int, filename: str) -> None:
        """Apply the trust policy to the open lock file ``fd``: a file of this user keeps only
        the bits of trusted users; a file of a user the policy does not trust is refused.

        Raises:
            LockUnavailable: the file belongs to an untrusted user (it may hold it for ever).
        """
        policy = self.trust
        if policy is None:
            return
        st = os.fstat(fd)
        if st.st_uid == os.geteuid():
            with contextlib.suppress(OSError):
                policy.limit_access(fd, st)
        elif not policy.trusts(st.st_uid):
            raise LockUnavailable(
                errno.EPERM,
                f"lock file {filename} under {self.root}/{LOCK_DIR} belongs to user "
                f"{st.st_uid}, whom KERNELCACHE_TRUST={policy.policy} does not trust; "
                "not waiting for it",
            )

    def _acquire_flock(self, name: str, shared: bool, deadline: float) -> Held:
        filename = name + ".lock"
        delay = 0.0005
        while True:
            dfd = self._dir()
            kept = False
            try:
                fd = self._open_lock_file(dfd, filename)
                try:
                    locked = _try_flock(fd, shared=shared)
                except OSError as e:
                    os.close(fd)
                    if e.errno in _FLOCK_UNSUPPORTED:
                        raise LockUnavailable(
                            e.errno, f"flock does not work under {self.root}"
                        ) from e
                    raise
                if not locked:
                    os.close(fd)
                elif shared:
                    return Held(self, name, fd=fd, shared=True)
                elif self._same_file(dfd, filename, fd):
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

    @staticmethod
    def _same_file(dfd: int, filename: str, fd: int) -> bool:
        try:
            on_disk = os.stat(filename, dir_fd=dfd, follow_symlinks=False)
        except FileNotFoundError:
            return False
        held = os.fstat(fd)
        return (on_disk.st_dev, on_disk.st_ino) == (held.st_dev, held.st_ino)

    def _unlink(self, filename: str, dir_fd: int = -1) -> None:
        """Unlink a lock file, relative to ``dir_fd`` (the lock directory the lock was taken
        in) when given."""
        dfd = dir_fd if dir_fd >= 0 else self._dir()
        try:
            # (PermissionError: another user's file in the sticky lock directory: it stays)
            with contextlib.suppress(FileNotFoundError, PermissionError):
                os.unlink(filename, dir_fd=dfd)
        finally:
            if dfd != dir_fd:
                os.close(dfd)

    def _probe(self) -> str | None:
        """``flock`` or ``soft`` for this root's filesystem; None if it cannot be told yet."""
        try:
            dfd = self._dir()
        except LockUnavailable:
            return None
        try:
            fd = self._open_lock_file(dfd, ".probe")
            try:
                if _try_flock(fd, shared=False):  # else someone else holds the probe: it works
                    _unflock(fd, shared=False)
            except OSError as e:
                if e.errno in _FLOCK_UNSUPPORTED:
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
            dfd = self._dir()
            try:
                try:
                    fd = create_exclusive(filename, dfd)
                except FileExistsError:
                    if self._break_if_stale(dfd, filename):
                        continue  # broken: try again now, even with no time left to wait
                except OSError as e:
                    raise LockUnavailable(
                        e.errno,
                        f"cannot create soft lock {filename} under {self.root}: {e.strerror}",
                    ) from e
                else:
                    try:
                        if self.trust is not None:  # (others read it to judge staleness)
                            self.trust.limit_write_bits(fd)
                        os.write(fd, record.encode())
                    finally:
                        os.close(fd)
                    stop = threading.Event()
                    held = Held(self, name, token=token, _stop=stop)
                    self._start_heartbeat(filename, stop)
                    return held
            finally:
                os.close(dfd)
            delay = self._wait(name, deadline, delay, cap=0.05)

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
        with contextlib.suppress(FileNotFoundError):
            os.unlink(aside, dir_fd=dfd)
        return not fresh

    def _start_heartbeat(self, filename: str, stop: threading.Event) -> None:
        interval = min(max(self.stale_after / 4, 0.05), MAX_HEARTBEAT)

        def beat() -> None:
            while not stop.wait(interval):
                try:
                    dfd = open_subdir(self.root, LOCK_DIR, create=False)
                except OSError:
                    return
                try:
                    os.utime(filename, dir_fd=dfd, follow_symlinks=False)
                except OSError:
                    return
                finally:
                    os.close(dfd)

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
