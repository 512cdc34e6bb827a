"""One cache root on disk: the storage format, atomic publication, verified reads, quarantine.

:class:`Store` declares every operation on a root; each delegates to a function taking the
store's :class:`~kernelcache.store.state.StoreState` (what it opened) and, where it takes a
key's lock, :meth:`Store.lock`: what a store reads, :mod:`kernelcache.store.reading`; writes,
:mod:`kernelcache.store.writing`; removes, :mod:`kernelcache.store.removal`. (The layout of a
root: :mod:`kernelcache.store.layout`; whose files are served: :mod:`kernelcache.store.trust`;
the locks: :mod:`kernelcache.store.locks`.)

Guarantees across processes and hosts sharing a root:

* A reader sees a whole entry or none: the artifact is published before its metadata, both by
  ``os.replace`` under the key's exclusive lock. Readers hold a shared flock on the artifact
  while reading it, and deletion or quarantine first takes that flock exclusively, so an entry
  is never removed under a reader.
* Every read checks the metadata against the schema and its entry digest (which covers the
  launch metadata and the artifact's digest; see :mod:`kernelcache.schema`), the artifact's
  size and xxh3-128 digest, and the trust policy of both files. A mismatch, a value outside the
  schema, a symlink or a half entry is never returned: the entry is re-checked under the
  exclusive lock and moved to ``.quarantine/``. An entry of an older format, or one holding a
  field this process requires covered that its digest does not cover, is a miss, replaced by
  the next put.
* Only whole entries are written or served (the contract: :mod:`kernelcache.schema.document`).
  :meth:`Store.publish` refuses an artifact that is not whole for its extension (cut short,
  code for another machine, PTX without its kernel) or a document without the launch
  metadata its extension requires: ``ValueError``, nothing written. A read that reads an
  entry's metadata from disk checks the same, less the PTX text scan (cheap: the ELF checks
  cost time in proportion to the header tables), and a later read of the same bytes (its
  digest checked against the remembered document) does not repeat it; :meth:`Store.inspect`
  with ``whole`` (what ``verify`` runs) checks it all. A caller that finds an entry it read
  unusable (a package checking more than the contract) quarantines it with
  :meth:`Store.repair`'s ``refuse``.
* The first complete writer of a key wins; later writers find the entry and keep it, unless
  they replace it explicitly (``publish(..., replace=True)``), which is atomic as above.
* Nothing is written through a symlink, and what this process writes passes its own trust
  policy whatever the umask.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Callable, Mapping
from typing import Any

from ..config import DEFAULTS, Settings, settings
from ..fsio import READ_FLAGS
from ..keys import META_EXT
from ..problem import Problem
from . import reading, removal, writing
from .entry import Artifact
from .layout import open_subdir, readable, resolve_root, writable
from .locks.budget import WaitBudget
from .locks.locker import Held, Locker
from .state import StoreState, take_lock
from .trust import check_policy


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
    ) -> None:
        """``root`` with a leading ``~`` expanded; ``resolved``: ``root`` is already what
        :func:`~kernelcache.store.layout.resolve_root` made of it (a command or a cache that
        resolved it once), used as given."""
        check_policy(trust)
        #: what the store opened, which its methods hand to the functions they delegate to:
        #: the root and its settings, its trust policy, locks and per-process memo of checked
        #: documents (:class:`~kernelcache.store.state.StoreState`)
        self.state = state = StoreState(
            os.fspath(root) if resolved else resolve_root(root),
            readonly=readonly,
            lock_mode=lock_mode,
            lock_stale=lock_stale,
            lock_timeout=lock_timeout,
            trust=trust,
        )
        #: the root directory (absolute)
        self.root: str = state.root
        #: whether the store is only read
        self.readonly: bool = readonly
        #: seconds an operation waits for a key's lock unless told otherwise
        self.lock_timeout: float = lock_timeout
        #: the trust policy's name (see :data:`kernelcache.store.trust.TRUST_POLICIES`)
        self.trust: str = trust
        #: the per-key locks
        self.locker: Locker = state.locker

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
        """:meth:`from_settings` of the root a user names (``--root``), ``~`` expanded and made
        absolute; None: the configured one (``$KERNELCACHE_DIR``, else the user cache directory).

        Raises:
            ValueError: ``root`` starts with ``~user`` of no such user (or there is no home).
            ConfigError: a variable is set to a value that cannot be used.
        """
        cfg = settings() if cfg is None else cfg
        where = os.path.abspath(resolve_root(root, cfg))
        return cls.from_settings(
            where, cfg, readonly=readonly, lock_timeout=lock_timeout, resolved=True
        )

    def __repr__(self) -> str:
        return f"Store({self.root!r}, readonly={self.readonly})"

    # -- paths and locks ------------------------------------------------------------------
    def path(self, key: str, ext: str) -> str:
        """The artifact file of ``key`` with extension ``ext``."""
        return f"{self.state.prefix}{key}.{ext}"

    def meta_path(self, key: str) -> str:
        """The metadata file of ``key``."""
        return f"{self.state.prefix}{key}.{META_EXT}"

    def lock(self, key: str, *, shared: bool, timeout: float | None = None) -> Held | None:
        """Take the key's lock; None where locks cannot be had (warned once), and in a
        read-only store. Every lock the store's operations take is taken here.

        Raises:
            LockTimeout: held by someone else for the whole timeout (None: the lock timeout).
        """
        return take_lock(self.state, key, shared=shared, timeout=timeout)

    @property
    def lock_mode(self) -> str:
        """``flock`` or ``soft``: how its locks are taken (probed on first use under ``auto``)."""
        return self.locker.mode

    # -- the root's directories -----------------------------------------------------------
    def readable(self) -> bool:
        """Whether this process may list the root and read the files in it."""
        return readable(self.root)

    def writable(self) -> bool:
        """Whether this process may create files in the root (permissions, a read-only mount)."""
        return writable(self.root)

    def open_dir(self, name: str | None = None, *, create: bool = False) -> int:
        """The root (``name`` None), or its directory ``name`` (never through a symlink; made
        if ``create``, as :func:`~kernelcache.store.layout.open_subdir` makes it), open as a
        descriptor for the caller to close.

        Raises:
            OSError: from the system (FileNotFoundError: there is none).
        """
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
            if stat.S_ISREG(st.st_mode) and self.state.policy.accepts(st):
                return fd
        os.close(fd)
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
        another extension than the one asked for.

        The metadata, once read and checked, is remembered per process: a later read of the key
        opens only the artifact, and verifies its size, trust and digest against the remembered
        document (what is returned is always a verified pair). Where the artifact no longer
        matches it (the entry was replaced, repaired or removed), or the last-used stamp is due
        (:data:`~kernelcache.store.entry.TOUCH_INTERVAL`), the metadata is read from disk
        again; ``fresh`` always does. An entry read with its metadata from disk is checked
        against the contract of an entry (:func:`~kernelcache.schema.entry_problem`, less the
        PTX text scan) before its document is remembered: a remembered document names bytes
        found whole.
        """
        return reading.read(self.state, key, ext, fresh=fresh)

    def inspect(
        self, key: str, ext: str | None = None, *, any_owner: bool = False, whole: bool = False
    ) -> Artifact | Problem | None:
        """:meth:`read` straight from disk, leaving no trace: no reader's lock, no last-used
        stamp refreshed, nothing remembered. With ``any_owner`` the trust policy is not
        applied: what the entry is, whoever wrote it (as prune re-checks what it planned).
        The contract of an entry (:func:`~kernelcache.schema.entry_problem`) is checked as a
        read checks it, and with ``whole`` in full (the PTX text scan too): what ``verify``
        runs."""
        return reading.inspect(self.state, key, ext, any_owner=any_owner, whole=whole)

    def get(self, key: str, ext: str) -> Artifact | Problem | None:
        """Read an entry; if it looks corrupt, re-check it under the key's lock and quarantine it.

        Returns the Artifact, a Problem (not served: corrupt and quarantined, or the key holds
        another ext), or None (no entry). Raises ValueError for a malformed key or ext.
        """
        return reading.get(self.state, self.lock, key, ext)

    def get_checked(
        self, key: str, ext: str, *, wait: float | WaitBudget | None = None
    ) -> Artifact | Problem | None:
        """:meth:`get` for a key and ext the caller has already validated; a repair waits at
        most ``wait`` seconds in all (or what is left of that budget; None: the lock
        timeout)."""
        return reading.get_checked(self.state, self.lock, key, ext, wait)

    def repair(
        self,
        key: str,
        ext: str | None = None,
        *,
        wait: float | None = None,
        refuse: Callable[[Artifact], str | None] | None = None,
        announce: bool = True,
    ) -> Artifact | Problem | None:
        """Re-read ``key`` from disk under its exclusive lock; quarantine it if it is corrupt,
        or if ``refuse`` gives a reason against the artifact read
        (:func:`~kernelcache.store.entry.not_whole`, or what a reader that checks more than a
        read does found: it was read, so it is re-read here and refused only as it still is).

        Returns what the fresh read found: the Artifact (a false alarm, e.g. a concurrent
        publish), the Problem that got the entry quarantined, or None (the entry is gone, or
        its lock or readers were held for ``wait`` seconds in all; None: the lock timeout).
        Read-only stores are never modified: their corrupt entries are reported and skipped;
        ``announce``: log a quarantine as a warning (false: the caller reports what it did).
        """
        return reading.repair(self.state, self.lock, key, ext, wait, refuse, announce)

    # -- writing --------------------------------------------------------------------------
    def check_writable(self) -> None:
        """Stage and remove an empty file, as a put would.

        Raises:
            CacheError: entries cannot be written under this root (the message says why and
                what to do).
        """
        writing.check_writable(self.state)

    def put(
        self,
        key: str,
        ext: str,
        data: bytes,
        meta: Mapping[str, Any],
        *,
        wait: float | None = None,
    ) -> Artifact:
        """Publish an entry atomically; if a valid entry already exists, keep and return it.

        An entry that cannot be served (corrupt, untrusted) is quarantined and replaced; one
        written by an older kernelcache is replaced. Waits at most ``wait`` seconds in all for
        the key's lock and readers of a corrupt entry (None: the lock timeout).

        Raises:
            TypeError: ``data`` is not bytes (a bytes-like object).
            ValueError: invalid key or ext; metadata that the schema refuses (the message names
                the field); an entry that is not whole (:func:`~kernelcache.schema.
                require_whole`: an artifact not whole for its extension, launch metadata its
                extension requires missing; nothing is written); or the key holds another
                extension.
            CacheError: the entry could not be written (the message says why and what to do);
                nothing partial is left behind.
        """
        return writing.publish(self.state, self.lock, key, ext, data, meta, wait=wait)[0]

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
        """:meth:`put`, also saying whether this call published the entry (False: a valid
        entry was already there and is returned). With ``replace``, a valid entry of the same
        extension is replaced too: both files by ``os.replace`` under the key's exclusive lock,
        so a reader gets the earlier entry or this one (one that read the earlier metadata and
        this artifact re-checks under the lock, and finds this one). With ``as_written``,
        ``meta`` is a whole document another process wrote (a remote hit, a bundle entry),
        published as written (:func:`~kernelcache.schema.written_document`): never rebuilt
        with this process's covered fields."""
        return writing.publish(
            self.state,
            self.lock,
            key,
            ext,
            data,
            meta,
            wait=wait,
            replace=replace,
            as_written=as_written,
        )

    # -- removal --------------------------------------------------------------------------
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

        Raises:
            ValueError: a malformed key.
            CacheError: a read-only store.
        """
        return removal.delete(
            self.state,
            self.lock,
            key,
            ext=ext,
            wait=wait,
            remove_lock=remove_lock,
            check=check,
        )
