"""What a :class:`~kernelcache.store.root.Store` reads: an entry, verified (:func:`read`,
:func:`get`), looked at without a trace (:func:`inspect`), or read again under its lock and
quarantined where it is corrupt (:func:`repair`). Each function takes the store's
:class:`~kernelcache.store.state.StoreState` first.

Invariants: an artifact is read under a shared flock on its own descriptor (deletion and
quarantine take it exclusively first), so nothing is removed while it is read, and a reader
never waits for another reader. What is returned is always a verified pair: the metadata
checked against the schema and its entry digest, the artifact's size, xxh3-128 digest and
trust checked against it, and, where the metadata was read from disk, the contract of an entry
(less the PTX text scan). A document is remembered per process only with bytes found whole; a
later read of the key checks the artifact against it, and reads the metadata again where the
artifact no longer matches or the last-used stamp is due. A read writes nothing but that stamp
(never in a read-only store); :func:`get` has an entry found corrupt re-checked and
quarantined (:func:`repair`, which moves its files through :mod:`.removal`).
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
from collections.abc import Callable
from typing import Any

from ..errors import CacheError, LockTimeout
from ..fsio import READ_FLAGS, read_exact
from ..keys import META_EXT, check_ext, check_key
from ..problem import Problem
from ..process import warn_once
from ..schema.document import digest, entry_problem
from .entry import MEMO_ENTRIES, TOUCH_INTERVAL, Artifact, make_artifact, stale_stamp
from .layout import NOT_VISIBLE, read_metadata, unservable
from .locks.budget import WaitBudget
from .publish import open_root
from .removal import quarantine_locked
from .state import StoreState, TakeLock
from .trust import TrustPolicy

logger = logging.getLogger(__name__)

#: how much of the contract of an entry a read of an artifact checks: its digest only (a
#: document remembered with bytes found whole), what a read checks (``full=False``), all of it
DIGEST_ONLY, CHEAP, FULL = 0, 1, 2


def read(
    state: StoreState, key: str, ext: str | None = None, *, fresh: bool = False
) -> Artifact | Problem | None:
    """:meth:`Store.read <kernelcache.store.root.Store.read>`."""
    memo = state.memo
    if not fresh:
        known = memo.get(key)
        if known is not None and time.time() < known[1]:
            found = _read_artifact(state, key, ext, known[0], state.policy, state.read_locks)
            if not isinstance(found, Problem) or not found.corrupt:
                return found
    loaded = _load_metadata(state, key)
    if not isinstance(loaded, tuple):
        memo.pop(key, None)
        return loaded
    doc, stamp = loaded
    found = _read_artifact(state, key, ext, doc, state.policy, state.read_locks, contract=CHEAP)
    if not isinstance(found, Artifact):
        memo.pop(key, None)
        return found
    if len(memo) >= MEMO_ENTRIES:
        memo.clear()
    if state.readonly:
        due = math.inf  # never touched: read again only when the artifact does not match
    elif stale_stamp(stamp):
        with contextlib.suppress(OSError):
            os.utime(f"{state.prefix}{key}.{META_EXT}", follow_symlinks=False)
        due = time.time() + TOUCH_INTERVAL
    else:
        due = stamp + TOUCH_INTERVAL
    memo[key] = (doc, due)
    return found


def inspect(
    state: StoreState,
    key: str,
    ext: str | None = None,
    *,
    any_owner: bool = False,
    whole: bool = False,
) -> Artifact | Problem | None:
    """:meth:`Store.inspect <kernelcache.store.root.Store.inspect>`."""
    policy = None if any_owner else state.policy
    meta_path = f"{state.prefix}{key}.{META_EXT}"
    loaded = read_metadata(meta_path, key, trust=policy, not_visible=NOT_VISIBLE)
    if not isinstance(loaded, tuple):
        return loaded
    contract = FULL if whole else CHEAP
    return _read_artifact(state, key, ext, loaded[0], policy, False, contract=contract)


def _read_artifact(
    state: StoreState,
    key: str,
    ext: str | None,
    doc: dict[str, Any],
    policy: TrustPolicy | None,
    lock: bool,
    *,
    contract: int = DIGEST_ONLY,
) -> Artifact | Problem | None:
    """Read and verify the artifact that the metadata ``doc`` describes, under a shared
    flock if ``lock``, applying ``policy`` (None: none); with ``contract`` :data:`CHEAP`
    or :data:`FULL`, also the contract of an entry
    (:func:`~kernelcache.schema.entry_problem`, ``full`` or not)."""
    stored_ext = doc["ext"]
    if ext is not None and stored_ext != ext:
        return Problem(
            key,
            f"key holds a .{stored_ext} artifact, not .{ext}",
            corrupt=False,
            ext=stored_ext,
        )
    path = f"{state.prefix}{key}.{stored_ext}"  # Store.path(), inline: the hot path
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
                state.read_locks = False  # no flock here: digests still protect reads
        ast = os.fstat(afd)
        if not stat.S_ISREG(ast.st_mode) or (policy is not None and not policy.may_serve(ast)):
            refused = unservable(key, ast, "artifact", policy)
            if refused is not None:
                return refused
        if ast.st_size != doc["size"]:
            return Problem(key, f"artifact has {ast.st_size} bytes, metadata says {doc['size']}")
        data = read_exact(afd, doc["size"])
    except OSError as e:
        return Problem(key, f"artifact unreadable: {e.strerror}")
    finally:
        os.close(afd)
    if data is None:
        return Problem(key, "artifact changed size while being read")
    if digest(data) != doc["digest"]:
        return Problem(key, "artifact digest mismatch")
    if contract:
        reason = entry_problem(stored_ext, data, doc, full=contract == FULL)
        if reason is not None:
            return Problem(key, reason)
    return make_artifact(
        key, stored_ext, data, path, doc, "readonly" if state.readonly else "local"
    )


def _load_metadata(state: StoreState, key: str) -> tuple[dict[str, Any], float] | Problem | None:
    """Read and check ``<key>.json``; return (doc, mtime), a Problem or None. (Only
    :func:`read` remembers a document: once the artifact it names was found whole.)"""
    meta_path = f"{state.prefix}{key}.{META_EXT}"
    loaded = read_metadata(meta_path, key, trust=state.policy, not_visible=NOT_VISIBLE)
    if not isinstance(loaded, tuple):
        return loaded
    return loaded[0], loaded[1].st_mtime


def get(state: StoreState, lock: TakeLock, key: str, ext: str) -> Artifact | Problem | None:
    """:meth:`Store.get <kernelcache.store.root.Store.get>`."""
    check_key(key)
    check_ext(ext)
    return get_checked(state, lock, key, ext)


def get_checked(
    state: StoreState,
    lock: TakeLock,
    key: str,
    ext: str,
    wait: float | WaitBudget | None = None,
) -> Artifact | Problem | None:
    """:meth:`Store.get_checked <kernelcache.store.root.Store.get_checked>`."""
    result = read(state, key, ext)
    if isinstance(result, Problem) and result.corrupt:
        if isinstance(wait, WaitBudget):
            wait = wait.remaining()
        return repair(state, lock, key, ext, wait=wait)
    return result


def repair(
    state: StoreState,
    lock: TakeLock,
    key: str,
    ext: str | None = None,
    wait: float | None = None,
    refuse: Callable[[Artifact], str | None] | None = None,
    announce: bool = True,
) -> Artifact | Problem | None:
    """:meth:`Store.repair <kernelcache.store.root.Store.repair>`."""
    if state.readonly:
        again = read(state, key, ext, fresh=True)
        if isinstance(again, Problem) and again.corrupt:
            warn_once(
                logger,
                (state.root, f"ro-corrupt-{key}"),
                "kernelcache: corrupt entry %s in read-only root %s (%s); skipping it",
                key,
                state.root,
                again.reason,
            )
        return again
    budget = WaitBudget(state.lock_timeout if wait is None else wait)
    try:
        held = lock(key, shared=False, timeout=budget.remaining())
    except LockTimeout:
        return None
    try:
        again = read(state, key, ext, fresh=True)
        reason = refuse(again) if refuse is not None and isinstance(again, Artifact) else None
        if reason is not None:
            again = Problem(key, reason)
        if isinstance(again, Problem) and again.corrupt:
            try:
                root_fd = open_root(state.root)
            except CacheError:
                return again
            try:
                moved = quarantine_locked(state, root_fd, key, again.reason, budget.remaining())
                if moved and announce:
                    logger.warning(
                        "kernelcache: quarantined %s under %s: %s", key, state.root, again.reason
                    )
            finally:
                os.close(root_fd)
        return again
    finally:
        if held is not None:
            held.release()
