"""One cache root on disk, opened: :class:`Store` and its verified reads, which return entries
as readers get them (:class:`~kernelcache.store.entry.Artifact`); where a command finds a root
and its own settings (:meth:`Store.configured`). A store writes through :mod:`.writing`,
removes files (a corrupt entry's too: quarantine) through :mod:`.removal` and takes per-key
locks through :mod:`.locks`, each imported at its first use (none to only read).

Guarantees across processes and hosts sharing a root:

* A reader sees a whole entry or none: the artifact is published before its metadata, both by
  ``os.replace`` under the key's exclusive lock. A reader holds a shared flock on the artifact
  while reading it, and removal takes it exclusively first: nothing is removed under a reader,
  and a reader never waits for another.
* A read returns a verified pair: the metadata checked against the schema and its entry digest,
  the artifact's size, xxh3-128 digest and trust against it, and, where the metadata was read
  from disk, the contract of an entry (:func:`~kernelcache.schema.entry_problem`, less the PTX
  text scan). Anything else is never returned: re-checked under the exclusive lock, it is
  moved to ``.quarantine/``. An entry of an older format, or one holding a field this process
  requires covered that its digest does not cover, is a miss, replaced by the next put.
* A document is remembered per process only with bytes found whole; a later read opens only
  the artifact and checks it against the document, reading the metadata again where they no
  longer match or the last-used stamp is due. A read writes nothing but that stamp (never in a
  read-only store).
* Only whole entries are written; the first complete writer of a key wins unless a later one
  replaces it explicitly; nothing is written through a symlink, and what this process writes
  passes its own trust policy whatever the umask.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import math
import os
import stat
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from ..config import COMPRESSIONS, DEFAULTS, LOCK_MODES, Settings, settings
from ..errors import InvalidValue, LockUnavailable
from ..fsio import READ_FLAGS, read_exact
from ..keys import META_EXT, check_ext, check_key
from ..problem import Problem
from ..process import warn_once
from ..schema.document import CHEAP, DIGEST_ONLY, FULL, entry_problem
from .compression import check_method, read_packed
from .entry import FUTURE_SLACK, MEMO_ENTRIES, TOUCH_INTERVAL, Artifact
from .layout import (
    NOT_VISIBLE,
    RootFile,
    open_subdir,
    read_metadata,
    read_settings,
    readable,
    resolve_root,
    unservable,
    writable,
)
from .trust import TrustPolicy, check_policy

if TYPE_CHECKING:
    from .locks.locker import Held, Locker, WaitBudget

logger = logging.getLogger(__name__)


def stale_stamp(mtime: float) -> bool:
    """Whether a last-used stamp should be refreshed: older than an hour, or from the future."""
    age = time.time() - mtime
    return age > TOUCH_INTERVAL or age < -FUTURE_SLACK


class Store:
    """One root directory. ``readonly`` stores are only read: no lock, touch or quarantine.

    Thread-safe and process-safe; see the module docstring for the guarantees.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        readonly: bool = False,
        lock_mode: str = DEFAULTS.lock_mode,
        lock_stale: float = DEFAULTS.lock_stale,
        lock_timeout: float = DEFAULTS.lock_timeout,
        trust: str = DEFAULTS.trust,
        resolved: bool = False,
        compression: str = DEFAULTS.compression,
    ) -> None:
        """``root`` with a leading ``~`` expanded; ``resolved``: ``root`` is already what
        :func:`~kernelcache.store.layout.resolve_root` made of it (a command or a cache that
        resolved it once), used as given; ``compression``: how new artifacts are written.

        Raises:
            ValueError: an unknown trust policy or lock mode.
        """
        check_policy(trust)
        if lock_mode not in LOCK_MODES:
            raise InvalidValue(f"lock mode {lock_mode!r} is not one of {', '.join(LOCK_MODES)}")
        #: "none" or "zstd": how new artifacts are written (a bad one said by check_method)
        self.compression = compression if compression in COMPRESSIONS else check_method(compression)
        #: the root directory (absolute)
        self.root: str = os.fspath(root) if resolved else resolve_root(root)
        #: ``root`` and a separator: an entry's file is ``prefix + name`` (the hot path)
        self.prefix = os.path.join(self.root, "")
        #: whether the store is only read
        self.readonly: bool = readonly
        #: seconds an operation waits for a key's lock unless told otherwise
        self.lock_timeout: float = lock_timeout
        #: the trust policy's name (see :data:`kernelcache.store.trust.TRUST_POLICIES`)
        self.trust: str = trust
        #: the trust policy applied to the root's files
        self.policy = TrustPolicy(self.root, trust)
        #: checked metadata by key, and when its last-used stamp is due (then it is read again)
        self.memo: dict[str, tuple[dict[str, Any], float]] = {}
        #: whether reads take their shared flock (False once flock is found not to work here)
        self.read_locks = not readonly
        self._lock_mode, self._lock_stale = lock_mode, lock_stale
        self._locker: Locker | None = None

    @classmethod
    def from_settings(
        cls,
        root: str | os.PathLike[str],
        cfg: Settings | None = None,
        *,
        readonly: bool = False,
        lock_timeout: float | None = None,
        lock_mode: str | None = None,
        resolved: bool = False,
    ) -> Store:
        """A store for ``root`` with the configured lock mode, soft-lock staleness, lock
        timeout and trust policy (``cfg``, default: :func:`kernelcache.config.settings`);
        ``lock_timeout`` and ``lock_mode`` override the configured ones; ``resolved`` as for
        the constructor.

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
            resolved=resolved,
            compression=cfg.compression,
        )

    @classmethod
    def named(
        cls,
        root: str | os.PathLike[str] | None,
        cfg: Settings | None = None,
        *,
        readonly: bool = False,
        lock_timeout: float | None = None,
    ) -> Store:
        """:meth:`from_settings` of the root a user names (:meth:`configured`). ValueError: a
        ``~user`` of no such user; ConfigError: a variable that cannot be used."""
        cfg = settings() if cfg is None else cfg
        where = os.path.abspath(resolve_root(root, cfg))
        return cls.from_settings(
            where, cfg, readonly=readonly, lock_timeout=lock_timeout, resolved=True
        )

    @staticmethod
    def configured(root: str | os.PathLike[str] | None, cfg: Settings) -> tuple[str, RootFile]:
        """The root a user names (``--root``; ``~`` expanded, made absolute; None: the
        configured one), and its own configuration file, as ``cfg``'s trust policy lets it be
        used (:func:`~.layout.read_settings`)."""
        where = os.path.abspath(resolve_root(root, cfg))
        return where, read_settings(where, cfg.trust)

    def __repr__(self) -> str:
        return f"Store({self.root!r}, readonly={self.readonly})"

    @property
    def locker(self) -> Locker:
        """The per-key locks, made (and their module imported) when the store first locks: a
        read takes none. (Threads that make them at once make equal ones: a Locker holds no
        lock of its own, only its settings and its probed mode.)"""
        if self._locker is None:
            from .locks.locker import Locker

            self._locker = Locker(
                self.root, mode=self._lock_mode, stale_after=self._lock_stale, trust=self.policy
            )
        return self._locker

    # -- paths, directories and locks ----------------------------------------------------
    def path(self, key: str, ext: str) -> str:
        """The artifact file of ``key`` with extension ``ext``."""
        return f"{self.prefix}{key}.{ext}"

    def meta_path(self, key: str) -> str:
        """The metadata file of ``key``."""
        return f"{self.prefix}{key}.{META_EXT}"

    def readable(self) -> bool:
        """Whether this process may list the root and read the files in it."""
        return readable(self.root)

    def writable(self) -> bool:
        """Whether this process may create files in the root (permissions, a read-only mount)."""
        return writable(self.root)

    def open_dir(self, name: str | None = None, *, create: bool = False) -> int:
        """The root (``name`` None), or its directory ``name`` (never through a symlink; made
        if ``create``, as :func:`~.layout.open_subdir` does), open for the caller to close;
        OSError from the system (FileNotFoundError: there is none)."""
        if name is None:
            return os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        return open_subdir(self.root, name, create=create)

    def open_trusted(self, directory: str, name: str) -> int | None:
        """The file ``name`` of the root's ``directory``, open for reading (for the caller to
        close) where it is a regular file the trust policy accepts: a file read as a hint, such
        as the scan index. None where there is none, it cannot be opened or it is refused;
        never through a symlink."""
        try:
            dfd = open_subdir(self.root, directory, create=False)
        except OSError:
            return None
        try:
            fd = os.open(name, READ_FLAGS, dir_fd=dfd)
        except OSError:
            return None
        finally:
            os.close(dfd)
        with contextlib.suppress(OSError):
            st = os.fstat(fd)
            if stat.S_ISREG(st.st_mode) and self.policy.accepts(st):
                return fd
        os.close(fd)
        return None

    def lock(self, key: str, *, shared: bool, timeout: float | None = None) -> Held | None:
        """Take the key's lock; None where locks cannot be had (warned once), and in a
        read-only store. Every lock the store's operations take is taken here.

        Raises:
            LockTimeout: held by someone else for the whole timeout (None: the lock timeout).
        """
        if self.readonly:
            return None
        try:
            return self.locker.acquire(
                key, shared=shared, timeout=self.lock_timeout if timeout is None else timeout
            )
        except LockUnavailable as e:
            warn_once(
                logger,
                (self.root, "locks"),
                "kernelcache: working without locks under %s: %s",
                self.root,
                e,
            )
            return None

    @property
    def lock_mode(self) -> str:
        """``flock`` or ``soft``: how its locks are taken (probed on first use under ``auto``)."""
        return self.locker.mode

    # -- reading --------------------------------------------------------------------------
    def read(
        self, key: str, ext: str | None = None, *, fresh: bool = False
    ) -> Artifact | Problem | None:
        """Read and verify an entry; None if it does not exist (or is being deleted). ``ext``
        None accepts any extension; a Problem with ``corrupt=False``: the key holds another.
        The metadata is read from disk again where the remembered document no longer matches
        the artifact or the last-used stamp is due; ``fresh`` always reads it."""
        memo = self.memo
        if not fresh:
            known = memo.get(key)
            if known is not None and time.time() < known[1]:
                found = self._read_artifact(key, ext, known[0], self.policy, self.read_locks)
                if not isinstance(found, Problem) or not found.corrupt:
                    return found
        meta_path = f"{self.prefix}{key}.{META_EXT}"
        loaded = read_metadata(meta_path, key, trust=self.policy, not_visible=NOT_VISIBLE)
        if not isinstance(loaded, tuple):
            memo.pop(key, None)
            return loaded
        doc, stamp = loaded[0], loaded[1].st_mtime
        found = self._read_artifact(key, ext, doc, self.policy, self.read_locks, contract=CHEAP)
        if not isinstance(found, Artifact):
            memo.pop(key, None)
            return found
        if len(memo) >= MEMO_ENTRIES:
            memo.clear()
        if self.readonly:
            due = math.inf  # never touched: read again only when the artifact does not match
        elif stale_stamp(stamp):
            with contextlib.suppress(OSError):
                os.utime(meta_path, follow_symlinks=False)
            due = time.time() + TOUCH_INTERVAL
        else:
            due = stamp + TOUCH_INTERVAL
        memo[key] = (doc, due)
        return found

    def inspect(
        self, key: str, ext: str | None = None, *, any_owner: bool = False, whole: bool = False
    ) -> Artifact | Problem | None:
        """:meth:`read` straight from disk, leaving no trace: no reader's lock, no last-used
        stamp refreshed, nothing remembered. With ``any_owner`` the trust policy is not
        applied: what the entry is, whoever wrote it (as prune re-checks what it planned).
        The contract of an entry is checked as a read checks it, and with ``whole`` in full
        (the PTX text scan too): what ``verify`` runs."""
        policy = None if any_owner else self.policy
        meta_path = f"{self.prefix}{key}.{META_EXT}"
        loaded = read_metadata(meta_path, key, trust=policy, not_visible=NOT_VISIBLE)
        if not isinstance(loaded, tuple):
            return loaded
        return self._read_artifact(
            key, ext, loaded[0], policy, False, contract=FULL if whole else CHEAP
        )

    def _read_artifact(
        self,
        key: str,
        ext: str | None,
        doc: dict[str, Any],
        policy: TrustPolicy | None,
        lock: bool,
        *,
        contract: int = DIGEST_ONLY,
    ) -> Artifact | Problem | None:
        """Read and verify the artifact that the metadata ``doc`` describes, under a shared
        flock if ``lock``, applying ``policy`` (None: none), as
        :func:`~kernelcache.schema.entry_problem` with ``check=contract`` says."""
        stored_ext = doc["ext"]
        if ext is not None and stored_ext != ext:
            return Problem(
                key,
                f"key holds a .{stored_ext} artifact, not .{ext}",
                corrupt=False,
                ext=stored_ext,
            )
        path = f"{self.prefix}{key}.{stored_ext}"  # Store.path(), inline: the hot path
        try:
            afd = os.open(path, READ_FLAGS)
        except FileNotFoundError:
            return Problem(key, "artifact missing")
        except OSError as e:
            if e.errno in (errno.ELOOP, errno.EMLINK):
                return Problem(key, "artifact is a symlink")
            return Problem(key, f"artifact unreadable: {e.strerror}")
        try:
            if lock:
                try:
                    fcntl.flock(afd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                except BlockingIOError:
                    return None  # being deleted or quarantined right now
                except OSError:
                    self.read_locks = False  # no flock here: digests still protect reads
            ast = os.fstat(afd)
            if not stat.S_ISREG(ast.st_mode) or (policy is not None and not policy.may_serve(ast)):
                refused = unservable(key, ast, "artifact", policy)
                if refused is not None:
                    return refused
            n = doc["size"]  # (a packed artifact, of a root that compresses, is smaller)
            data = read_exact(afd, n) if ast.st_size == n else read_packed(afd, ast.st_size, n)
            if isinstance(data, str):  # neither plain nor packed: damaged
                return Problem(key, data)
        except OSError as e:
            return Problem(key, f"artifact unreadable: {e.strerror}")
        except MemoryError:
            return Problem(key, f"artifact of {doc['size']} bytes: no memory to read it")
        finally:
            os.close(afd)
        if data is None:
            return Problem(key, "artifact changed size while being read")
        reason = entry_problem(stored_ext, data, doc, check=contract)
        if reason is not None:
            return Problem(key, reason)
        # Artifact(...) without the frozen dataclass's object.__setattr__ per field: the hot path
        art = object.__new__(Artifact)
        art.__dict__.update(
            key=key,
            ext=stored_ext,
            data=data,
            path=path,
            meta=doc,
            source="readonly" if self.readonly else "local",
        )
        return art

    def get(
        self, key: str, ext: str, *, wait: float | WaitBudget | None = None, checked: bool = False
    ) -> Artifact | Problem | None:
        """Read an entry; if it looks corrupt, re-check it under the key's lock and quarantine
        it (:func:`~kernelcache.store.removal.repair`, waiting at most ``wait`` seconds in all,
        or what is left of that budget; None: the lock timeout).

        Returns the Artifact, a Problem (not served: corrupt and quarantined, or the key holds
        another ext), or None (no entry). ``checked``: the caller has validated ``key`` and
        ``ext`` already.

        Raises:
            ValueError: a malformed key or ext (unless ``checked``).
        """
        if not checked:
            check_key(key)
            check_ext(ext)
        result = self.read(key, ext)
        if isinstance(result, Problem) and result.corrupt:
            from .removal import repair

            return repair(self, key, ext, wait=wait)
        return result

    # -- what a store writes and removes (:mod:`.writing`, :mod:`.removal`) ----------------
    def check_writable(self) -> None:
        """Stage and remove an empty file, as a put would.

        Raises:
            CacheError: entries cannot be written under this root (the message says why and
                what to do).
        """
        from .writing import check_writable

        check_writable(self)

    def put(
        self, key: str, ext: str, data: bytes, meta: Mapping[str, Any], *, wait: float | None = None
    ) -> Artifact:
        """:meth:`publish` without ``replace``, returning the artifact the key holds: this
        call's, or the first writer's."""
        return self.publish(key, ext, data, meta, wait=wait)[0]

    def publish(
        self,
        key: str,
        ext: str,
        data: bytes,
        meta: Mapping[str, Any],
        *,
        wait: float | None = None,
        replace: bool = False,
        as_written: bool = False,
    ) -> tuple[Artifact, bool]:
        """Publish an entry atomically, and say whether this call published it (False: a
        valid entry was already there and is returned: the first writer wins).

        An entry that cannot be served (corrupt, untrusted) is quarantined and replaced; one
        written by an older kernelcache is replaced. With ``replace``, a valid entry of the
        same extension is replaced too (a reader gets the earlier entry or this one). With
        ``as_written``, ``meta`` is a whole document another process wrote (a remote hit, a
        bundle entry), published as written (:func:`~kernelcache.schema.written_document`).
        Waits at most ``wait`` seconds in all for the key's lock and readers of a corrupt
        entry (None: the lock timeout).

        Raises:
            TypeError: ``data`` is not bytes (a bytes-like object).
            ValueError: invalid key or ext; metadata that the schema refuses (the message names
                the field); an entry that is not whole (:func:`~kernelcache.schema.
                require_whole`; nothing is written); or the key holds another extension.
            CacheError: the entry could not be written (the message says why and what to do);
                nothing partial is left behind.
        """
        from .writing import publish

        return publish(self, key, ext, data, meta, wait, replace, as_written)

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
        removed (a caller re-validates there what it decided before taking the lock: no
        check-then-act). Waits at most ``wait`` seconds for the key's lock and its readers.
        Returns True if something was deleted, False if nothing was there (or ``check``
        refused), None if the entry is in use (then nothing is deleted).

        Raises:
            ValueError: a malformed key.
            CacheError: a read-only store.
        """
        from .removal import delete

        return delete(self, key, ext, wait, remove_lock, check)
