"""One cache root on disk: the storage format, atomic publication, verified reads, quarantine.

Layout of a root::

    <root>/<key>.<ext>      the artifact bytes, exactly what a loader consumes
    <root>/<key>.json       metadata, written last: the commit marker of the entry
    <root>/.tmp/            staging; published into the root with os.replace
    <root>/.locks/          per-key lock files (see locks.py)
    <root>/.quarantine/     corrupt entries moved aside, with the reason
    <root>/.stats/          append-only per-process statistics logs (see stats.py)

Guarantees across processes and hosts sharing a root:

* A reader sees a whole entry or none: the artifact is published before its metadata, both by
  ``os.replace`` under the key's exclusive lock. Readers hold a shared flock on the artifact
  while reading it, and deletion or quarantine first takes that flock exclusively, so an entry
  is never removed under a reader.
* Every read checks the metadata against the schema and its entry digest (which covers the
  launch metadata and the artifact's digest; see :mod:`kernelcache.schema`), and the artifact's
  size and xxh3-128 digest. A mismatch, a value outside the schema, a symlink or a half entry is
  never returned: the entry is re-checked under the exclusive lock and moved to
  ``.quarantine/``. An entry written by an older kernelcache (no entry digest) is a miss,
  replaced by the next put.
* Under the trust policies ``owner`` and ``group``, an entry is served only if both its files
  are owned by trusted users, writable by no one outside the trusted set, and have one link.
* The first complete writer of a key wins; later writers find the entry and keep it.
* Nothing is written through a symlink: staging, locks and quarantine are opened relative to
  directory descriptors with ``O_NOFOLLOW``, and ``os.replace`` replaces a planted link rather
  than following it.
* Directories are created with mode 0o777 minus the umask, so a group-shared root (``umask
  002`` and a set-group-ID directory) stays writable for the whole group. Entry files get 0o666
  minus the umask, less the write bits the trust policy refuses: group write only under
  ``group`` and in the root directory's group, never write for others (except under ``any``).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import stat
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import process
from .config import Settings, settings
from .errors import CacheError, LockTimeout, LockUnavailable, Problem, WrongExt
from .fsio import READ_FLAGS
from .keys import META_EXT, check_ext, check_key, split_entry_name
from .locks import Held, Locker, open_subdir
from .process import HOST
from .schema import (
    FORMAT_VERSION,
    MAX_META_BYTES,
    RESERVED_FIELDS,
    digest,
    encode_metadata,
    make_metadata,
    parse_metadata,
)

logger = logging.getLogger(__name__)

__all__ = [
    "FORMAT_VERSION",
    "MAX_META_BYTES",
    "RESERVED_FIELDS",
    "TRUST_POLICIES",
    "Artifact",
    "Problem",
    "Store",
    "WrongExt",
    "digest",
    "encode_metadata",
    "make_metadata",
    "parse_metadata",
]

TMP_DIR = ".tmp"
QUARANTINE_DIR = ".quarantine"
#: metadata documents remembered per store and process (see Store.read)
MEMO_ENTRIES = 4096
#: how often a hit refreshes an entry's last-used stamp (the metadata file's mtime)
TOUCH_INTERVAL = 3600.0
#: a last-used stamp further in the future than this is clock skew: it is reset to now
FUTURE_SLACK = 300.0
#: whose entries a store serves: an artifact is code that will run on the GPU. Under "group"
#: and "owner" an entry's files must also be writable only by the trusted users (no write bit
#: for others; group write only under "group", for the root directory's group) and have
#: exactly one link each.
TRUST_POLICIES = {
    "group": "this user, root, the root directory's owner, and members of its group",
    "owner": "this user, root and the root directory's owner",
    "any": "every user (a private or fully trusted cache)",
}
_SHARED_WRITE = stat.S_IWGRP | stat.S_IWOTH

_HINTS = {
    errno.ENOSPC: "free space on that filesystem or prune the cache (kernelcache prune)",
    errno.EDQUOT: "raise the quota or prune the cache (kernelcache prune)",
    errno.EFBIG: "the file size limit (ulimit -f) is too small for this artifact",
    errno.EROFS: "the filesystem is read-only; use a writable KERNELCACHE_DIR and pass this one "
    "as a read-only root (KERNELCACHE_READONLY_DIRS)",
    errno.EACCES: "make it writable for this user (or group), or use another KERNELCACHE_DIR",
    errno.EPERM: "make it writable for this user (or group), or use another KERNELCACHE_DIR",
    errno.ELOOP: "a symlink was planted in the cache; remove it (kernelcache verify --repair)",
    errno.ENOTDIR: "point KERNELCACHE_DIR at a directory",
    errno.EEXIST: "point KERNELCACHE_DIR at a directory",
}


@dataclass(frozen=True)
class Artifact:
    """An artifact and its metadata.

    ``path`` is the file a loader can open as is, or None when the artifact exists only in
    memory (the cache could not store it). ``source`` says where it came from: ``"local"``,
    ``"readonly"``, ``"remote"`` or ``"memory"``.
    """

    key: str
    ext: str
    data: bytes = field(repr=False)
    path: str | None
    meta: Mapping[str, Any] = field(repr=False)
    source: str = "local"


def _stale_stamp(mtime: float) -> bool:
    """Whether a last-used stamp should be refreshed: older than an hour, or from the future."""
    age = time.time() - mtime
    return age > TOUCH_INTERVAL or age < -FUTURE_SLACK


def _in_group(uid: int, gid: int) -> bool:
    """Whether the user ``uid`` belongs to group ``gid`` (primary or supplementary)."""
    import grp
    import pwd

    try:
        user = pwd.getpwuid(uid)
    except KeyError:
        return False
    if user.pw_gid == gid:
        return True
    try:
        return user.pw_name in grp.getgrgid(gid).gr_mem
    except KeyError:
        return False


def _read_exact(fd: int, size: int) -> bytes | None:
    """Read exactly ``size`` bytes; None if the file is shorter."""
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


class Store:
    """One root directory. ``readonly`` stores are only read: no lock, touch or quarantine.

    Thread-safe and process-safe; see the module docstring for the guarantees.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        readonly: bool = False,
        lock_mode: str = "auto",
        lock_stale: float = 300.0,
        lock_timeout: float = 120.0,
        trust: str = "group",
    ) -> None:
        if trust not in TRUST_POLICIES:
            raise ValueError(f"trust policy {trust!r} is not one of {', '.join(TRUST_POLICIES)}")
        try:
            self.root = os.fspath(Path(root).expanduser())
        except RuntimeError:  # "~user/..." for a user that does not exist, or no home
            raise ValueError(
                f"cache root {os.fspath(root)!r}: cannot expand "
                f"{os.fspath(root).split('/')[0]!r}: no such home directory"
            ) from None
        self._prefix = os.path.join(self.root, "")
        self.readonly = readonly
        self.lock_timeout = lock_timeout
        self.locker = Locker(self.root, mode=lock_mode, stale_after=lock_stale)
        self._memo: dict[str, tuple[tuple[int, ...], dict[str, Any]]] = {}
        self._read_locks = not readonly
        self.trust = trust
        self._trusted_uids: set[int] = set()
        self._untrusted_uids: set[int] = set()
        self._root_owner: tuple[int, int] | None = None

    @classmethod
    def from_settings(
        cls,
        root: str | os.PathLike[str],
        cfg: Settings | None = None,
        *,
        readonly: bool = False,
        lock_timeout: float | None = None,
        lock_mode: str | None = None,
    ) -> Store:
        """A store for ``root`` with the configured lock mode, soft-lock staleness, lock
        timeout and trust policy (``cfg``, default: :func:`kernelcache.config.settings`);
        ``lock_timeout`` and ``lock_mode`` override the configured ones.

        Raises:
            ConfigError: a variable is set to a value that cannot be used.
        """
        if cfg is None:
            cfg = settings()
        return cls(
            root,
            readonly=readonly,
            lock_mode=cfg.lock_mode if lock_mode is None else lock_mode,
            lock_stale=cfg.lock_stale,
            lock_timeout=cfg.lock_timeout if lock_timeout is None else lock_timeout,
            trust=cfg.trust,
        )

    def __repr__(self) -> str:
        return f"Store({self.root!r}, readonly={self.readonly})"

    # -- paths ----------------------------------------------------------------------------
    def path(self, key: str, ext: str) -> str:
        return f"{self._prefix}{key}.{ext}"

    def meta_path(self, key: str) -> str:
        return f"{self._prefix}{key}.{META_EXT}"

    def warn_once(self, topic: str, message: str, *args: object) -> None:
        """Log a warning the first time ``topic`` comes up for this root in this process."""
        process.warn_once(logger, (self.root, topic), message, *args)

    # -- trust ----------------------------------------------------------------------------
    def _root_ids(self) -> tuple[int, int] | None:
        """(owner, group) of the root directory, read once; None while it cannot be read."""
        if self._root_owner is None:
            try:
                st = os.stat(self.root)
            except OSError:
                return None
            self._root_owner = (st.st_uid, st.st_gid)
        return self._root_owner

    def _trusts(self, uid: int) -> bool:
        """Whether files owned by ``uid`` may be served (see TRUST_POLICIES); remembered."""
        if uid in self._untrusted_uids:
            return False
        trusted = self.trust == "any" or uid in (0, os.geteuid())
        if not trusted:
            ids = self._root_ids()
            if ids is not None:
                trusted = uid == ids[0] or (self.trust == "group" and _in_group(uid, ids[1]))
        if trusted:
            self._trusted_uids.add(uid)
        else:
            self._untrusted_uids.add(uid)
            self.warn_once(
                f"untrusted-{uid}",
                "kernelcache: refusing artifacts under %s owned by user %d: not this user, root, "
                "the root directory's owner%s (KERNELCACHE_TRUST=%s)",
                self.root,
                uid,
                " or a member of its group" if self.trust == "group" else "",
                self.trust,
            )
        return trusted

    def _may_serve(self, st: os.stat_result) -> bool:
        """The fast check: a trusted owner, no write bit for group or others, one link."""
        return self.trust == "any" or (
            st.st_uid in self._trusted_uids and not st.st_mode & _SHARED_WRITE and st.st_nlink == 1
        )

    def _refusal(self, st: os.stat_result, what: str) -> str | None:
        """Why a file of an entry may not be served under the trust policy; None if it may.

        Under ``owner`` and ``group`` the file must be owned by a trusted user, writable by no
        one else (no write bit for others; a group write bit only under ``group`` and only for
        the root directory's group), and have exactly one link: a second name of the file
        could be written through, or be another key's entry.
        """
        if self._may_serve(st):
            return None
        uid = st.st_uid
        if uid not in self._trusted_uids and not self._trusts(uid):
            return f"{what} owned by untrusted user {uid}"
        mode = stat.S_IMODE(st.st_mode)
        writable = mode & _SHARED_WRITE
        topic, reason = "", None
        if writable & stat.S_IWOTH:
            topic, reason = "other-writable", f"{what} is writable by every user (mode {mode:o})"
        elif writable and self.trust == "owner":
            topic = "group-writable"
            reason = (
                f"{what} is writable by its group (mode {mode:o}), which the owner policy "
                "does not trust"
            )
        elif writable:
            ids = self._root_ids()
            if ids is None or st.st_gid != ids[1]:
                topic = "foreign-group"
                reason = f"{what} is writable by group {st.st_gid}, not the root directory's group"
        if reason is None and st.st_nlink != 1:
            topic, reason = "links", f"{what} has {st.st_nlink} hard links"
        if reason is not None:
            self.warn_once(
                f"refused-{topic}",
                "kernelcache: refusing an entry under %s: %s (KERNELCACHE_TRUST=%s: an entry's "
                "files must be writable only by the users it trusts, with one link each)",
                self.root,
                reason,
                self.trust,
            )
        return reason

    def _write_bits(self, gid: int) -> int:
        """The write bits for group and others that a file of this store (group ``gid``) may
        keep under the trust policy, so that what this process writes passes its own checks."""
        if self.trust == "any":
            return _SHARED_WRITE
        if self.trust == "group":
            ids = self._root_ids()
            if ids is not None and gid == ids[1]:
                return stat.S_IWGRP
        return 0

    # -- locks ----------------------------------------------------------------------------
    def lock(self, key: str, *, shared: bool, timeout: float | None = None) -> Held | None:
        """Take the key's lock; None where locks cannot be had (warned once).

        Raises:
            LockTimeout: held by someone else for the whole timeout.
        """
        if self.readonly:
            return None
        try:
            return self.locker.acquire(
                key, shared=shared, timeout=self.lock_timeout if timeout is None else timeout
            )
        except LockUnavailable as e:
            self.warn_once("locks", "kernelcache: working without locks under %s: %s", self.root, e)
            return None

    # -- reading --------------------------------------------------------------------------
    def read(
        self, key: str, ext: str | None = None, *, fresh: bool = False
    ) -> Artifact | Problem | None:
        """Read and verify an entry; None if it does not exist (or is being deleted).

        The artifact is read under a shared ``flock`` on its own descriptor: deleting or
        quarantining an entry takes that lock exclusively first, so nothing is removed while
        it is being read, and a reader never waits for another reader. ``ext=None`` accepts
        whatever extension the entry has. A Problem with ``corrupt=False`` means the key holds
        another extension than the one asked for. Parsed metadata is remembered per process by the file's identity (inode, size, mtime,
        ctime); ``fresh`` reads it from disk regardless. The artifact is always read and
        verified against it.
        """
        doc = None if fresh else self._remembered(key)
        st_mtime = None
        if doc is None:
            loaded = self._load_metadata(key)
            if not isinstance(loaded, tuple):
                return loaded
            doc, st_mtime = loaded
        stored_ext = doc["ext"]
        if ext is not None and stored_ext != ext:
            return Problem(key, f"key holds a .{stored_ext} artifact, not .{ext}", corrupt=False)
        path = self.path(key, stored_ext)
        try:
            afd = os.open(path, READ_FLAGS)
        except FileNotFoundError:
            return Problem(key, "artifact missing")
        except OSError as e:
            if e.errno in (errno.ELOOP, errno.EMLINK):
                return Problem(key, "artifact is a symlink")
            return Problem(key, f"artifact unreadable: {e.strerror}")
        try:
            if self._read_locks:
                try:
                    fcntl.flock(afd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                except BlockingIOError:
                    return None  # being deleted or quarantined right now
                except OSError:
                    self._read_locks = False  # no flock here: digests still protect reads
            ast = os.fstat(afd)
            if not stat.S_ISREG(ast.st_mode):
                return Problem(key, "artifact is not a regular file")
            if not self._may_serve(ast):
                refusal = self._refusal(ast, "artifact")
                if refusal is not None:
                    return Problem(key, refusal, corrupt=False, untrusted=True)
            if ast.st_size != doc["size"]:
                return Problem(
                    key, f"artifact has {ast.st_size} bytes, metadata says {doc['size']}"
                )
            data = _read_exact(afd, doc["size"])
        except OSError as e:
            return Problem(key, f"artifact unreadable: {e.strerror}")
        finally:
            os.close(afd)
        if data is None:
            return Problem(key, "artifact changed size while being read")
        if digest(data) != doc["digest"]:
            return Problem(key, "artifact digest mismatch")
        if st_mtime is not None and not self.readonly and _stale_stamp(st_mtime):
            self._touch(key)
        source = "readonly" if self.readonly else "local"
        return Artifact(key, stored_ext, data, path, doc, source)

    def _remembered(self, key: str) -> dict[str, Any] | None:
        """The remembered metadata of ``key`` if its file is still the one it was read from."""
        memo = self._memo.get(key)
        if memo is None:
            return None
        try:
            st = os.stat(self.meta_path(key), follow_symlinks=False)
        except OSError:
            return None
        if memo[0] != (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns):
            return None
        if not self.readonly and _stale_stamp(st.st_mtime):
            self._touch(key)
        return memo[1]

    def _load_metadata(self, key: str) -> tuple[dict[str, Any], float] | Problem | None:
        """Read, parse and remember ``<key>.json``; return (doc, mtime), a Problem or None."""
        try:
            fd = os.open(self.meta_path(key), READ_FLAGS)
        except FileNotFoundError:
            return None
        except OSError as e:
            if e.errno in (errno.ELOOP, errno.EMLINK):
                return Problem(key, "metadata is a symlink")
            if e.errno in (errno.ENOTDIR, errno.EACCES, errno.EPERM):
                return None
            return Problem(key, f"metadata unreadable: {e.strerror}", corrupt=False)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                return Problem(key, "metadata is not a regular file")
            if not self._may_serve(st):
                refusal = self._refusal(st, "metadata")
                if refusal is not None:
                    return Problem(key, refusal, corrupt=False, untrusted=True)
            if st.st_size > MAX_META_BYTES:
                return Problem(key, "metadata is too large")
            raw = os.read(fd, st.st_size + 1)
        except OSError as e:
            return Problem(key, f"metadata unreadable: {e.strerror}")
        finally:
            os.close(fd)
        doc = parse_metadata(raw, key)
        if isinstance(doc, Problem):
            return doc
        if len(self._memo) >= MEMO_ENTRIES:
            self._memo.clear()
        self._memo[key] = ((st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns), doc)
        return doc, st.st_mtime

    def get(self, key: str, ext: str) -> Artifact | Problem | None:
        """Read an entry; if it looks corrupt, re-check it under the key's lock and quarantine it.

        Returns the Artifact, a Problem (not served: corrupt and quarantined, or the key holds
        another ext), or None (no entry). Raises ValueError for a malformed key or ext.
        """
        check_key(key)
        check_ext(ext)
        return self.get_checked(key, ext)

    def get_checked(self, key: str, ext: str) -> Artifact | Problem | None:
        """:meth:`get` for a key and ext the caller has already validated."""
        result = self.read(key, ext)
        if isinstance(result, Problem) and result.corrupt:
            return self.repair(key, ext)
        return result

    def _touch(self, key: str) -> None:
        with contextlib.suppress(OSError):
            os.utime(self.meta_path(key), follow_symlinks=False)

    # -- writing --------------------------------------------------------------------------
    def _root_fd(self) -> int:
        try:
            os.makedirs(self.root, exist_ok=True)
            return os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except FileExistsError as e:
            raise self._write_error("the cache root exists and is not a directory", e) from e
        except OSError as e:
            raise self._write_error(f"cannot open the cache root: {e.strerror}", e) from e

    def _write_error(self, what: str, e: OSError | None = None, key: str = "") -> CacheError:
        hint = _HINTS.get(e.errno) if e is not None and e.errno is not None else None
        where = f" entry {key}" if key else ""
        message = f"kernelcache: cannot write{where} under {self.root}: {what}"
        if hint:
            message += f" ({hint})"
        return CacheError(e.errno if e is not None and e.errno else errno.EIO, message)

    def _stage(self, tmp_fd: int, data: bytes) -> str:
        """Write ``data`` to a new file in ``.tmp/``; return its name.

        The file is created with mode 0o666 minus the umask, then loses the write bits the
        trust policy would refuse (see :meth:`_write_bits`): what this process publishes is
        never writable by users outside the trusted set, whatever the umask.
        """
        name = f"{HOST}-{os.getpid()}-{uuid.uuid4().hex}.tmp"
        fd = os.open(
            name,
            os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
            0o666,
            dir_fd=tmp_fd,
        )
        try:
            st = os.fstat(fd)
            extra = st.st_mode & _SHARED_WRITE & ~self._write_bits(st.st_gid)
            if extra:
                os.fchmod(fd, stat.S_IMODE(st.st_mode) & ~extra)
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(name, dir_fd=tmp_fd)
            raise
        os.close(fd)
        return name

    def check_writable(self) -> None:
        """Stage and remove an empty file, as a put would.

        Raises:
            CacheError: entries cannot be written under this root (the message says why and
                what to do).
        """
        if self.readonly:
            raise CacheError(errno.EROFS, f"kernelcache: {self.root} is a read-only root")
        root_fd = self._root_fd()
        try:
            tmp_fd = open_subdir(self.root, TMP_DIR, create=True)
            try:
                os.unlink(self._stage(tmp_fd, b""), dir_fd=tmp_fd)
            finally:
                os.close(tmp_fd)
        except OSError as e:
            raise self._write_error(f"staging failed: {e.strerror}", e) from e
        finally:
            os.close(root_fd)

    def put(self, key: str, ext: str, data: bytes, meta: Mapping[str, Any]) -> Artifact:
        """Publish an entry atomically; if a valid entry already exists, keep and return it.

        An entry that cannot be served (corrupt, untrusted) is quarantined and replaced; one
        written by an older kernelcache is replaced.

        Raises:
            ValueError: invalid key or ext; metadata that the schema refuses (the message names
                the field); or the key holds another extension.
            CacheError: the entry could not be written (the message says why and what to do);
                nothing partial is left behind.
        """
        return self.publish(key, ext, data, meta)[0]

    def publish(
        self, key: str, ext: str, data: bytes, meta: Mapping[str, Any]
    ) -> tuple[Artifact, bool]:
        """:meth:`put`, also saying whether this call published the entry (False: a valid
        entry was already there and is returned)."""
        check_key(key)
        check_ext(ext)
        data = bytes(data)
        doc = make_metadata(key, ext, data, meta)
        if self.readonly:
            raise CacheError(errno.EROFS, f"kernelcache: {self.root} is a read-only root")
        root_fd = self._root_fd()
        staged: list[str] = []
        tmp_fd = -1
        try:
            try:
                tmp_fd = open_subdir(self.root, TMP_DIR, create=True)
                staged.append(self._stage(tmp_fd, data))
                staged.append(self._stage(tmp_fd, encode_metadata(doc)))
            except OSError as e:
                raise self._write_error(f"staging failed: {e.strerror}", e, key) from e
            try:
                held = self.lock(key, shared=False)
            except LockTimeout as e:
                raise CacheError(
                    errno.EAGAIN, f"kernelcache: timed out waiting to write {key} under {self.root}"
                ) from e
            try:
                existing = self.read(key, fresh=True)
                if isinstance(existing, Artifact):
                    if existing.ext != ext:
                        raise WrongExt(f"key {key} already holds a .{existing.ext} artifact")
                    return existing, False
                if isinstance(existing, Problem):
                    if existing.outdated:
                        self._remove_locked(root_fd, key, {ext, existing.ext or ext})
                    else:
                        self._quarantine_locked(root_fd, key, existing.reason)
                try:
                    os.replace(staged[0], f"{key}.{ext}", src_dir_fd=tmp_fd, dst_dir_fd=root_fd)
                    os.replace(
                        staged[1], f"{key}.{META_EXT}", src_dir_fd=tmp_fd, dst_dir_fd=root_fd
                    )
                except OSError as e:
                    raise self._write_error(f"publishing failed: {e.strerror}", e, key) from e
                staged.clear()
            finally:
                if held is not None:
                    held.release()
        finally:
            if tmp_fd >= 0:
                for name in staged:
                    with contextlib.suppress(OSError):
                        os.unlink(name, dir_fd=tmp_fd)
                os.close(tmp_fd)
            os.close(root_fd)
        return Artifact(key, ext, data, self.path(key, ext), doc, "local"), True

    # -- repair ---------------------------------------------------------------------------
    def repair(self, key: str, ext: str | None = None) -> Artifact | Problem | None:
        """Re-read ``key`` from disk under its exclusive lock; quarantine it if it is corrupt.

        Returns what the fresh read found: the Artifact (a false alarm, e.g. a concurrent
        publish), the Problem that got the entry quarantined, or None (the entry is gone).
        Read-only stores are never modified: their corrupt entries are reported and skipped.
        """
        if self.readonly:
            again = self.read(key, ext, fresh=True)
            if isinstance(again, Problem) and again.corrupt:
                self.warn_once(
                    f"ro-corrupt-{key}",
                    "kernelcache: corrupt entry %s in read-only root %s (%s); skipping it",
                    key,
                    self.root,
                    again.reason,
                )
            return again
        try:
            held = self.lock(key, shared=False)
        except LockTimeout:
            return None
        try:
            again = self.read(key, ext, fresh=True)
            if isinstance(again, Problem) and again.corrupt:
                try:
                    root_fd = self._root_fd()
                except CacheError:
                    return again
                try:
                    if self._quarantine_locked(root_fd, key, again.reason):
                        logger.warning(
                            "kernelcache: quarantined %s under %s: %s", key, self.root, again.reason
                        )
                finally:
                    os.close(root_fd)
            return again
        finally:
            if held is not None:
                held.release()

    def _quarantine_locked(self, root_fd: int, key: str, reason: str) -> bool:
        """Move every file of ``key`` into .quarantine/ (caller holds the exclusive lock)."""
        try:
            qfd = open_subdir(self.root, QUARANTINE_DIR, create=True)
        except OSError as e:
            self.warn_once(
                "quarantine", "kernelcache: cannot quarantine under %s: %s", self.root, e
            )
            return False
        moved = False
        stamp = f"{time.time():.0f}-{uuid.uuid4().hex[:8]}"
        names = self._files_of(key, None)
        readers = self._exclude_readers(root_fd, names, wait=self.lock_timeout)
        try:
            if readers is None:
                return False
            for name in names:
                try:
                    os.replace(name, f"{name}.{stamp}", src_dir_fd=root_fd, dst_dir_fd=qfd)
                    moved = True
                except FileNotFoundError:
                    continue
                except OSError as e:
                    self.warn_once("quarantine", "kernelcache: cannot quarantine %s: %s", name, e)
            if moved:
                note = json.dumps({"key": key, "reason": reason, "time": time.time()}).encode()
                with contextlib.suppress(OSError):
                    fd = os.open(
                        f"{key}.{stamp}.reason",
                        os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                        0o666,
                        dir_fd=qfd,
                    )
                    try:
                        os.write(fd, note)
                    finally:
                        os.close(fd)
        finally:
            os.close(qfd)
            for fd in readers or ():
                os.close(fd)
        return moved

    def _remove_locked(self, root_fd: int, key: str, exts: set[str]) -> None:
        """Delete the metadata of ``key`` and its artifacts of extensions ``exts`` (caller holds
        the exclusive lock) unless a reader holds one; best effort: the publish that follows
        replaces the files of the same names. The root is not listed."""
        names = [f"{key}.{META_EXT}", *(f"{key}.{e}" for e in sorted(exts))]
        readers = self._exclude_readers(root_fd, names, wait=0.0)
        if readers is None:
            return
        try:
            for name in names:
                with contextlib.suppress(OSError):
                    os.unlink(name, dir_fd=root_fd)
        finally:
            for fd in readers:
                os.close(fd)
        self._memo.pop(key, None)

    def _exclude_readers(self, root_fd: int, names: list[str], *, wait: float) -> list[int] | None:
        """Lock every artifact file in ``names`` exclusively (readers hold them shared).

        Returns the descriptors to close once the files are gone, or None if a reader kept a
        file for ``wait`` seconds. Metadata files, links and missing files need no lock.
        """
        fds: list[int] = []
        deadline = time.monotonic() + wait
        for name in names:
            if name.endswith("." + META_EXT):
                continue
            try:
                fd = os.open(name, READ_FLAGS, dir_fd=root_fd)
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

    def _names_of(self, key: str) -> list[str]:
        """The file names under the root that belong to ``key`` (metadata first).

        Lists the whole root: only for keys whose metadata cannot say (see :meth:`_files_of`).
        """
        prefix = key + "."
        names = []
        try:
            with os.scandir(self.root) as it:
                for entry in it:
                    if entry.name.startswith(prefix) and split_entry_name(entry.name) is not None:
                        names.append(entry.name)
        except OSError:
            return []
        names.sort(key=lambda n: not n.endswith("." + META_EXT))
        return names

    def _files_of(self, key: str, ext: str | None) -> list[str]:
        """The files of the entry ``key``, metadata first: its metadata and its artifact of
        extension ``ext`` (default: the one its metadata names), whether or not they exist.
        The root is listed only when neither tells (no ``ext`` and no readable metadata), so
        that deleting many entries never lists the root once per entry."""
        if ext is None:
            loaded = self._load_metadata(key)
            if not isinstance(loaded, tuple):
                return self._names_of(key)
            ext = loaded[0]["ext"]
        return [f"{key}.{META_EXT}", f"{key}.{ext}"]

    def delete(
        self,
        key: str,
        *,
        ext: str | None = None,
        wait: float = 0.0,
        remove_lock: bool = True,
        check: Callable[[], bool] | None = None,
    ) -> bool | None:
        """Delete the entry ``key`` (metadata first, then its artifact) under its exclusive lock.

        ``ext`` is the artifact's extension when the caller knows it (else the metadata says;
        for a key without readable metadata every file of the key is removed). ``check`` is
        called under the lock before anything is removed: if it returns False nothing is
        removed. A caller re-validates there what it decided before taking the lock, so that a
        writer or reader that got in between is never undone (no check-then-act).

        Waits at most ``wait`` seconds for the key's lock and for readers of its artifact.
        Returns True if something was deleted, False if nothing was there (or ``check``
        refused), None if the entry is in use (then nothing is deleted).
        """
        check_key(key)
        if self.readonly:
            raise CacheError(errno.EROFS, f"kernelcache: {self.root} is a read-only root")
        try:
            held = self.lock(key, shared=False, timeout=wait)
        except LockTimeout:
            return None
        deleted = False
        keep_lock = False
        try:
            if check is not None and not check():
                keep_lock = True  # the entry stays: so does its lock file
                return False
            try:
                root_fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            except FileNotFoundError:
                return False
            try:
                names = self._files_of(key, ext)
                readers = self._exclude_readers(root_fd, names, wait=wait)
                if readers is None:
                    return None
                try:
                    for name in names:
                        try:
                            os.unlink(name, dir_fd=root_fd)
                            deleted = True
                        except FileNotFoundError:
                            continue
                finally:
                    for fd in readers:
                        os.close(fd)
            finally:
                os.close(root_fd)
            self._memo.pop(key, None)
        finally:
            if held is not None:
                held.release(remove=remove_lock and not keep_lock)
        return deleted

    # -- listing --------------------------------------------------------------------------
    def entry_files(self) -> Iterator[tuple[str, str, os.DirEntry[str]]]:
        """Yield (key, ext, DirEntry) for every entry-shaped file in the root (metadata too)."""
        try:
            it = os.scandir(self.root)
        except FileNotFoundError:
            return
        with it:
            for entry in it:
                parts = split_entry_name(entry.name)
                if parts is not None:
                    yield parts[0], parts[1], entry
