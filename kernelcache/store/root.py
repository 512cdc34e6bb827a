"""One cache root on disk: the storage format, atomic publication, verified reads, quarantine.

(The layout of a root: :mod:`kernelcache.store.layout`; whose files are served:
:mod:`kernelcache.store.trust`; the locks: :mod:`kernelcache.store.locks`; what a store reads:
:mod:`kernelcache.store.reading`; what it removes: :mod:`kernelcache.store.removal`.)

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
* Only whole entries are written or served (the contract: :mod:`kernelcache.schema.contract`).
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
import errno
import logging
import os
from collections.abc import Mapping
from typing import Any

from ..config import DEFAULTS, Settings, settings
from ..errors import CacheError, LockTimeout, LockUnavailable, WrongExt
from ..keys import META_EXT, check_ext, check_key
from ..problem import Problem
from ..process import warn_once
from ..schema.contract import require_whole
from ..schema.document import encode_metadata, make_metadata, written_document
from .entry import Artifact, as_bytes
from .layout import TMP_DIR, open_subdir, resolve_root
from .locks.budget import WaitBudget
from .locks.locker import Held, Locker
from .publish import stage, write_error
from .reading import Reading
from .removal import Removal
from .trust import TrustPolicy, check_policy

logger = logging.getLogger(__name__)


class Store(Reading, Removal):
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
        self.root = os.fspath(root) if resolved else resolve_root(root)
        self._prefix = os.path.join(self.root, "")
        self.readonly = readonly
        self.lock_timeout = lock_timeout
        #: the trust policy's name (see :data:`kernelcache.store.trust.TRUST_POLICIES`)
        self.trust = trust
        self._policy = TrustPolicy(self.root, trust)
        self.locker = Locker(self.root, mode=lock_mode, stale_after=lock_stale, trust=self._policy)
        #: checked metadata by key, and when its last-used stamp is due (then it is read again)
        self._memo: dict[str, tuple[dict[str, Any], float]] = {}
        self._read_locks = not readonly

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

    def __repr__(self) -> str:
        return f"Store({self.root!r}, readonly={self.readonly})"

    # -- paths ----------------------------------------------------------------------------
    def path(self, key: str, ext: str) -> str:
        return f"{self._prefix}{key}.{ext}"

    def meta_path(self, key: str) -> str:
        return f"{self._prefix}{key}.{META_EXT}"

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
            warn_once(
                logger,
                (self.root, "locks"),
                "kernelcache: working without locks under %s: %s",
                self.root,
                e,
            )
            return None

    # -- writing --------------------------------------------------------------------------
    def _root_fd(self) -> int:
        try:
            os.makedirs(self.root, exist_ok=True)
            return os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except FileExistsError as e:
            raise write_error(self.root, "the cache root exists and is not a directory", e) from e
        except OSError as e:
            raise write_error(self.root, f"cannot open the cache root: {e.strerror}", e) from e

    def check_writable(self) -> None:
        """Stage and remove an empty file, as a put would.

        Raises:
            CacheError: entries cannot be written under this root (the message says why and
                what to do).
        """
        if self.readonly:
            raise CacheError(errno.EROFS, f"{self.root} is a read-only root")
        root_fd = self._root_fd()
        try:
            tmp_fd = open_subdir(self.root, TMP_DIR, create=True)
            try:
                os.unlink(stage(tmp_fd, self._policy, b""), dir_fd=tmp_fd)
            finally:
                os.close(tmp_fd)
        except OSError as e:
            raise write_error(self.root, f"staging failed: {e.strerror}", e) from e
        finally:
            os.close(root_fd)

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
        """:meth:`put`, also saying whether this call published the entry (False: a valid
        entry was already there and is returned). With ``replace``, a valid entry of the same
        extension is replaced too: both files by ``os.replace`` under the key's exclusive lock,
        so a reader gets the earlier entry or this one (one that read the earlier metadata and
        this artifact re-checks under the lock, and finds this one). With ``as_written``,
        ``meta`` is a whole document another process wrote (a remote hit, a bundle entry),
        published as written (:func:`~kernelcache.schema.written_document`): never rebuilt
        with this process's covered fields."""
        check_key(key)
        check_ext(ext)
        data = as_bytes(data)
        if as_written:
            doc = written_document(key, ext, data, meta)
        else:
            doc = make_metadata(key, ext, data, meta)
        require_whole(key, ext, data, doc)
        budget = WaitBudget(self.lock_timeout if wait is None else wait)
        if self.readonly:
            raise CacheError(errno.EROFS, f"{self.root} is a read-only root")
        root_fd = self._root_fd()
        staged: list[str] = []
        tmp_fd = -1
        try:
            try:
                tmp_fd = open_subdir(self.root, TMP_DIR, create=True)
                staged.append(stage(tmp_fd, self._policy, data))
                staged.append(stage(tmp_fd, self._policy, encode_metadata(doc)))
            except OSError as e:
                raise write_error(self.root, f"staging failed: {e.strerror}", e, key) from e
            try:
                held = self.lock(key, shared=False, timeout=budget.remaining())
            except LockTimeout as e:
                raise CacheError(
                    errno.EAGAIN, f"kernelcache: timed out waiting to write {key} under {self.root}"
                ) from e
            try:
                existing = self.read(key, fresh=True)
                if isinstance(existing, Artifact):
                    if existing.ext != ext:
                        raise WrongExt(f"key {key} already holds a .{existing.ext} artifact")
                    if not replace:
                        return existing, False
                if isinstance(existing, Problem):
                    if existing.outdated:
                        self._remove_locked(root_fd, key, {ext, existing.ext or ext})
                    else:
                        self._quarantine_locked(root_fd, key, existing.reason, budget.remaining())
                try:
                    os.replace(staged[0], f"{key}.{ext}", src_dir_fd=tmp_fd, dst_dir_fd=root_fd)
                    os.replace(
                        staged[1], f"{key}.{META_EXT}", src_dir_fd=tmp_fd, dst_dir_fd=root_fd
                    )
                except OSError as e:
                    raise write_error(self.root, f"publishing failed: {e.strerror}", e, key) from e
                staged.clear()
                if replace:
                    self._memo.pop(key, None)
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
