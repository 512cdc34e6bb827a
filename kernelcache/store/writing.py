"""What a :class:`~kernelcache.store.root.Store` writes: an entry, published atomically
(:func:`publish`, for :meth:`Store.publish <kernelcache.store.root.Store.publish>`), and the
probe of whether it could (:func:`check_writable`); bytes-like data as the bytes written
(:func:`as_bytes`).

Invariants: both files of an entry are staged under ``.tmp/`` (:mod:`.publish`) and put in
place by ``os.replace`` under the key's exclusive lock, the artifact first (packed where the
root compresses: :mod:`.compression`) and the metadata last (the commit marker); nothing
partial is left behind. Only whole entries are written
(:func:`~kernelcache.schema.require_whole`, before any file is touched). An entry already
there is re-read under the lock: a valid one is kept (the first writer wins) unless replaced
explicitly; one that cannot be served is quarantined, one of an older format removed
(:mod:`.removal`), and both replaced.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Mapping
from typing import Any

from ..errors import CacheError, LockTimeout, WrongExt
from ..keys import META_EXT, check_ext, check_key
from ..problem import Problem
from ..schema.document import encode_metadata, make_metadata, require_whole, written_document
from .compression import packed
from .entry import Artifact, as_bytes
from .layout import TMP_DIR, open_subdir
from .locks.locker import WaitBudget
from .publish import open_root, stage, write_error
from .removal import quarantine_locked, remove_locked
from .state import StoreState


def check_writable(store: StoreState) -> None:
    """:meth:`Store.check_writable <kernelcache.store.root.Store.check_writable>`."""
    if store.readonly:
        raise CacheError(errno.EROFS, f"{store.root} is a read-only root")
    root_fd = open_root(store.root)
    try:
        tmp_fd = open_subdir(store.root, TMP_DIR, create=True)
        try:
            os.unlink(stage(tmp_fd, store.policy, b""), dir_fd=tmp_fd)
        finally:
            os.close(tmp_fd)
    except OSError as e:
        raise write_error(store.root, f"staging failed: {e.strerror}", e) from e
    finally:
        os.close(root_fd)


def publish(
    store: StoreState,
    key: str,
    ext: str,
    data: bytes,
    meta: Mapping[str, Any],
    wait: float | None,
    replace: bool,
    as_written: bool,
) -> tuple[Artifact, bool]:
    """:meth:`Store.publish <kernelcache.store.root.Store.publish>`."""
    check_key(key)
    check_ext(ext)
    data = as_bytes(data)
    if as_written:
        doc = written_document(key, ext, data, meta)
    else:
        doc = make_metadata(key, ext, data, meta)
    require_whole(key, ext, data, doc)
    budget = WaitBudget(store.lock_timeout if wait is None else wait)
    root = store.root
    if store.readonly:
        raise CacheError(errno.EROFS, f"{root} is a read-only root")
    root_fd = open_root(root)
    staged: list[str] = []
    tmp_fd = -1
    try:
        try:
            tmp_fd = open_subdir(root, TMP_DIR, create=True)
            staged.append(stage(tmp_fd, store.policy, packed(data, store.compression)))
            staged.append(stage(tmp_fd, store.policy, encode_metadata(doc)))
        except OSError as e:
            raise write_error(root, f"staging failed: {e.strerror}", e, key) from e
        try:
            held = store.lock(key, shared=False, timeout=budget.remaining())
        except LockTimeout as e:
            raise CacheError(
                errno.EAGAIN, f"kernelcache: timed out waiting to write {key} under {root}"
            ) from e
        try:
            existing = store.read(key, fresh=True)
            if isinstance(existing, Artifact):
                if existing.ext != ext:
                    raise WrongExt(f"key {key} already holds a .{existing.ext} artifact")
                if not replace:
                    return existing, False
            if isinstance(existing, Problem):
                if existing.outdated:
                    remove_locked(store, root_fd, key, {ext, existing.ext or ext})
                else:
                    quarantine_locked(store, root_fd, key, existing.reason, budget.remaining())
            try:
                os.replace(staged[0], f"{key}.{ext}", src_dir_fd=tmp_fd, dst_dir_fd=root_fd)
                os.replace(staged[1], f"{key}.{META_EXT}", src_dir_fd=tmp_fd, dst_dir_fd=root_fd)
            except OSError as e:
                raise write_error(root, f"publishing failed: {e.strerror}", e, key) from e
            staged.clear()
            if replace:
                store.memo.pop(key, None)
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
    return Artifact(key, ext, data, f"{store.prefix}{key}.{ext}", doc, "local"), True
