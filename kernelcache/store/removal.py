"""The one place files of a root are removed: an entry's files (deleted: :func:`delete`, for
:meth:`Store.delete <kernelcache.store.root.Store.delete>`; quarantined where found corrupt:
:func:`repair`, which reads it again under its lock first, and :func:`quarantine_locked`; superseded by a replacing publish: :func:`remove_locked`), orphan
artifacts, old staging and quarantined files, lock files no one holds, and the files a module
keeps of its own (statistics logs and their summary, the usage file, the scan index, a probe:
:func:`remove_own_file`, each module removing only its own).

Invariants: a file is removed relative to the root's descriptor, never through a symlink; an
artifact is removed only after its readers' shared flocks were excluded (a reader never loses
the bytes it holds); the caller holds the key's exclusive lock where an entry is concerned.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import time
import uuid
from collections.abc import Callable

from ..errors import CacheError, LockTimeout
from ..fsio import READ_FLAGS, changed_at
from ..keys import META_EXT, check_key, split_entry_name
from ..problem import Problem
from ..process import warn_once
from .entry import META_SUFFIX, Artifact
from .layout import LOCK_DIR, NOT_VISIBLE, QUARANTINE_DIR, open_subdir, read_metadata, write_new
from .locks.locker import WaitBudget
from .locks.readers import exclude_readers
from .publish import open_root
from .state import StoreState

logger = logging.getLogger(__name__)


def _exclude_readers(root_fd: int, names: list[str], *, wait: float) -> list[int] | None:
    """:func:`~kernelcache.store.locks.readers.exclude_readers` of the artifact files among ``names``
    (readers lock artifacts, never metadata)."""
    artifacts = [name for name in names if not name.endswith(META_SUFFIX)]
    return exclude_readers(root_fd, artifacts, wait=wait)


def remove_files(
    root_fd: int, names: list[str], *, wait: float, best_effort: bool = False
) -> bool | None:
    """Unlink the files ``names`` of one entry (metadata first) from the root ``root_fd``, once
    no reader holds one of its artifacts (waiting at most ``wait`` seconds).

    Returns True if a file was removed, False if none was there, None if readers held an
    artifact (then nothing is removed). ``best_effort`` ignores every error of an unlink.
    """
    readers = _exclude_readers(root_fd, names, wait=wait)
    if readers is None:
        return None
    removed = False
    try:
        for name in names:
            try:
                os.unlink(name, dir_fd=root_fd)
                removed = True
            except FileNotFoundError:
                continue
            except OSError:
                if not best_effort:
                    raise
    finally:
        for fd in readers:
            os.close(fd)
    return removed


def quarantine_files(
    root: str, root_fd: int, key: str, names: list[str], reason: str, wait: float
) -> bool:
    """Move the files ``names`` of ``key`` into .quarantine/ (the caller holds the key's
    exclusive lock), with a note of why, waiting at most ``wait`` seconds for their readers."""
    try:
        qfd = open_subdir(root, QUARANTINE_DIR, create=True)
    except OSError as e:
        warn_once(
            logger,
            (root, "quarantine"),
            "kernelcache: cannot quarantine under %s: %s",
            root,
            e,
        )
        return False
    moved = False
    stamp = f"{time.time():.0f}-{uuid.uuid4().hex[:8]}"
    readers = _exclude_readers(root_fd, names, wait=wait)
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
                warn_once(
                    logger,
                    (root, "quarantine"),
                    "kernelcache: cannot quarantine %s: %s",
                    name,
                    e,
                )
        if moved:
            note = json.dumps({"key": key, "reason": reason, "time": time.time()}).encode()
            with contextlib.suppress(OSError):
                write_new(qfd, f"{key}.{stamp}.reason", note)
    finally:
        os.close(qfd)
        for fd in readers or ():
            os.close(fd)
    return moved


def names_of(root: str, key: str) -> list[str]:
    """The file names under the root that belong to ``key`` (metadata first).

    Lists the whole root: only for keys whose metadata cannot say (see :func:`files_of`).
    """
    prefix = key + "."
    names = []
    try:
        with os.scandir(root) as it:
            for entry in it:
                if entry.name.startswith(prefix) and split_entry_name(entry.name) is not None:
                    names.append(entry.name)
    except OSError:
        return []
    names.sort(key=lambda n: not n.endswith(META_SUFFIX))
    return names


def remove_own_file(dfd: int, name: str) -> bool:
    """Remove the file ``name`` from a directory of a root open as ``dfd`` (one a module keeps
    there: a statistics log, the usage file, the scan index, a probe). False: it was gone.

    Raises:
        OSError: another failure (permissions, a read-only filesystem).
    """
    try:
        os.unlink(name, dir_fd=dfd)
    except FileNotFoundError:
        return False
    return True


def remove_root_file(root: str, name: str) -> None:
    """Remove the file ``name`` at the top of ``root`` (an artifact no metadata claims; the
    caller holds its key's exclusive lock)."""
    os.unlink(os.path.join(root, name))


def remove_aux_file(root: str, directory: str, name: str, mtime: float | None) -> bool | None:
    """Remove ``name`` from the directory ``directory`` of ``root`` (``.tmp/`` or
    ``.quarantine/``) if it is still the file last changed at ``mtime`` (None: any).

    Returns True if it was removed, False if it is gone, None if it changed meanwhile (kept).
    """
    try:
        dfd = open_subdir(root, directory, create=False)
    except FileNotFoundError:
        return False
    try:
        st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        if mtime is not None and changed_at(st) != mtime:
            return None
        os.unlink(name, dir_fd=dfd)
        return True
    except FileNotFoundError:
        return False
    finally:
        os.close(dfd)


def remove_lock_file(root: str, filename: str) -> bool:
    """Remove the lock file ``filename`` from ``root``'s ``.locks/`` (one no process can hold:
    a leftover of a broken soft lock, or a flock file in soft mode). False: it is gone."""
    dfd = open_subdir(root, LOCK_DIR, create=False)
    try:
        return remove_own_file(dfd, filename)
    finally:
        os.close(dfd)


def remove_unheld_lock(locks_dfd: int, name: str) -> None:
    """Remove the flock file ``name`` from the lock directory ``locks_dfd`` unless a process
    holds it.

    Probed as the stale-lock check of a scan does: a non-blocking exclusive flock on the file
    (holders hold it exclusively), and the file is unlinked only if its name still is that file
    (a holder may have made a new one meanwhile; the locker of a holder that opened the unlinked
    one notices and retries).
    """
    try:
        fd = os.open(name, READ_FLAGS, dir_fd=locks_dfd)
    except OSError:
        return  # no such lock file (or not one to touch)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        held, now = os.fstat(fd), os.stat(name, dir_fd=locks_dfd, follow_symlinks=False)
        if (held.st_dev, held.st_ino) == (now.st_dev, now.st_ino):
            os.unlink(name, dir_fd=locks_dfd)
    except OSError:
        return  # held, or it went away: leave it
    finally:
        os.close(fd)  # (drops our flock)


def remove_locked(store: StoreState, root_fd: int, key: str, exts: set[str]) -> None:
    """Delete the metadata of ``key`` and its artifacts of extensions ``exts`` (caller holds
    the exclusive lock) unless a reader holds one; best effort: the publish that follows
    replaces the files of the same names. The root is not listed."""
    names = [f"{key}.{META_EXT}", *(f"{key}.{e}" for e in sorted(exts))]
    if remove_files(root_fd, names, wait=0.0, best_effort=True) is not None:
        store.memo.pop(key, None)


def quarantine_locked(store: StoreState, root_fd: int, key: str, reason: str, wait: float) -> bool:
    """Move every file of ``key`` into .quarantine/ (caller holds the exclusive lock),
    waiting at most ``wait`` seconds for its readers."""
    return quarantine_files(store.root, root_fd, key, files_of(store, key, None), reason, wait)


def files_of(store: StoreState, key: str, ext: str | None) -> list[str]:
    """The files of the entry ``key``, metadata first: its metadata and its artifact of
    extension ``ext`` (default: the one its metadata names), whether or not they exist.
    The root is listed only when neither tells (no ``ext`` and no readable metadata), so
    that deleting many entries never lists the root once per entry."""
    if ext is None:
        meta_path = f"{store.prefix}{key}.{META_EXT}"
        loaded = read_metadata(meta_path, key, trust=store.policy, not_visible=NOT_VISIBLE)
        if not isinstance(loaded, tuple):
            return names_of(store.root, key)
        ext = loaded[0]["ext"]
    return [f"{key}.{META_EXT}", f"{key}.{ext}"]


def delete(
    store: StoreState,
    key: str,
    ext: str | None,
    wait: float,
    remove_lock: bool,
    check: Callable[[], bool] | None,
) -> bool | None:
    """:meth:`Store.delete <kernelcache.store.root.Store.delete>`."""
    check_key(key)
    if store.readonly:
        raise CacheError(errno.EROFS, f"{store.root} is a read-only root")
    try:
        held = store.lock(key, shared=False, timeout=wait)
    except LockTimeout:
        return None
    deleted = False
    keep_lock = False
    try:
        if check is not None and not check():
            keep_lock = True  # the entry stays: so does its lock file
            return False
        try:
            root_fd = os.open(store.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except FileNotFoundError:
            return False
        try:
            removed = remove_files(root_fd, files_of(store, key, ext), wait=wait)
            if removed is None:
                return None
            deleted = removed
        finally:
            os.close(root_fd)
        store.memo.pop(key, None)
    finally:
        if held is not None:
            held.release(remove=remove_lock and not keep_lock)
    return deleted


def repair(
    store: StoreState,
    key: str,
    ext: str | None = None,
    *,
    wait: float | WaitBudget | None = None,
    refuse: Callable[[Artifact], str | None] | None = None,
    announce: bool = True,
) -> Artifact | Problem | None:
    """Re-read ``key`` from disk under its exclusive lock; quarantine it if it is corrupt,
    or if ``refuse`` gives a reason against the artifact read
    (:func:`~kernelcache.store.entry.not_whole`, or what a reader that checks more than a read
    does found: it is refused only as it still is).

    Returns what the fresh read found: the Artifact (a false alarm, e.g. a concurrent
    publish), the Problem that got the entry quarantined, or None (the entry is gone, or its
    lock or readers were held for ``wait`` seconds in all, or what is left of that budget;
    None: the lock timeout). Read-only stores are never modified: their corrupt entries are
    reported and skipped; ``announce``: log a quarantine as a warning (false: the caller
    reports what it did).
    """
    if store.readonly:
        again = store.read(key, ext, fresh=True)
        if isinstance(again, Problem) and again.corrupt:
            warn_once(
                logger,
                (store.root, f"ro-corrupt-{key}"),
                "kernelcache: corrupt entry %s in read-only root %s (%s); skipping it",
                key,
                store.root,
                again.reason,
            )
        return again
    if isinstance(wait, WaitBudget):
        wait = wait.remaining()
    budget = WaitBudget(store.lock_timeout if wait is None else wait)
    try:
        held = store.lock(key, shared=False, timeout=budget.remaining())
    except LockTimeout:
        return None
    try:
        again = store.read(key, ext, fresh=True)
        reason = refuse(again) if refuse is not None and isinstance(again, Artifact) else None
        if reason is not None:
            again = Problem(key, reason)
        if isinstance(again, Problem) and again.corrupt:
            try:
                root_fd = open_root(store.root)
            except CacheError:
                return again
            try:
                moved = quarantine_locked(store, root_fd, key, again.reason, budget.remaining())
                if moved and announce:
                    logger.warning(
                        "kernelcache: quarantined %s under %s: %s", key, store.root, again.reason
                    )
            finally:
                os.close(root_fd)
        return again
    finally:
        if held is not None:
            held.release()
