"""What a :class:`~kernelcache.store.root.Store` reads: an entry, verified
(:meth:`Reading.read`, :meth:`Reading.get`), or looked at without a trace
(:meth:`Reading.inspect`).

Invariants: an artifact is read under a shared flock on its own descriptor (deletion and
quarantine take it exclusively first), so nothing is removed while it is read, and a reader
never waits for another reader. What is returned is always a verified pair: the metadata
checked against the schema and its entry digest, the artifact's size, xxh3-128 digest and
trust checked against it, and, where the metadata was read from disk, the contract of an entry
(less the PTX text scan). A document is remembered per process only with bytes found whole; a
later read of the key checks the artifact against it, and reads the metadata again where the
artifact no longer matches or the last-used stamp is due. A read writes nothing but that stamp
(never in a read-only store); :meth:`Reading.get` has an entry found corrupt re-checked and
quarantined (:meth:`~kernelcache.store.removal.Removal.repair`).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import math
import os
import stat
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..fsio import READ_FLAGS, read_exact
from ..keys import check_ext, check_key
from ..problem import Problem
from ..schema.contract import entry_problem
from ..schema.format import digest
from .entry import MEMO_ENTRIES, TOUCH_INTERVAL, Artifact, make_artifact, stale_stamp
from .layout import NOT_VISIBLE, read_metadata, unservable
from .locks.budget import WaitBudget
from .trust import TrustPolicy

#: how much of the contract of an entry a read of an artifact checks: its digest only (a
#: document remembered with bytes found whole), what a read checks (``full=False``), all of it
DIGEST_ONLY, CHEAP, FULL = 0, 1, 2


class Reading:
    """What a :class:`~kernelcache.store.root.Store` reads (see the module docstring)."""

    readonly: bool
    _prefix: str
    _policy: TrustPolicy
    #: checked metadata by key, and when its last-used stamp is due (then it is read again)
    _memo: dict[str, tuple[dict[str, Any], float]]
    #: whether reads take their shared flock (False once flock is found not to work here)
    _read_locks: bool

    if TYPE_CHECKING:  # provided by Store

        def meta_path(self, key: str) -> str: ...

        def repair(
            self,
            key: str,
            ext: str | None = None,
            *,
            wait: float | None = None,
            refuse: Callable[[Artifact], str | None] | None = None,
        ) -> Artifact | Problem | None: ...

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
        (:data:`TOUCH_INTERVAL`), the metadata is read from disk again; ``fresh`` always does.
        An entry read with its metadata from disk is checked against the contract of an entry
        (:func:`~kernelcache.schema.entry_problem`, less the PTX text scan) before its document
        is remembered: a remembered document names bytes found whole.
        """
        if not fresh:
            memo = self._memo.get(key)
            if memo is not None and time.time() < memo[1]:
                found = self._read_artifact(key, ext, memo[0], self._policy, self._read_locks)
                if not isinstance(found, Problem) or not found.corrupt:
                    return found
        loaded = self._load_metadata(key)
        if not isinstance(loaded, tuple):
            self._memo.pop(key, None)
            return loaded
        doc, stamp = loaded
        found = self._read_artifact(key, ext, doc, self._policy, self._read_locks, contract=CHEAP)
        if not isinstance(found, Artifact):
            self._memo.pop(key, None)
            return found
        if len(self._memo) >= MEMO_ENTRIES:
            self._memo.clear()
        if self.readonly:
            due = math.inf  # never touched: read again only when the artifact does not match
        elif stale_stamp(stamp):
            self._touch(key)
            due = time.time() + TOUCH_INTERVAL
        else:
            due = stamp + TOUCH_INTERVAL
        self._memo[key] = (doc, due)
        return found

    def inspect(
        self, key: str, ext: str | None = None, *, any_owner: bool = False, whole: bool = False
    ) -> Artifact | Problem | None:
        """:meth:`read` straight from disk, leaving no trace: no reader's lock, no last-used
        stamp refreshed, nothing remembered. With ``any_owner`` the trust policy is not
        applied: what the entry is, whoever wrote it (as prune re-checks what it planned).
        The contract of an entry (:func:`~kernelcache.schema.entry_problem`) is checked as a
        read checks it, and with ``whole`` in full (the PTX text scan too): what ``verify``
        runs."""
        policy = None if any_owner else self._policy
        loaded = read_metadata(self.meta_path(key), key, trust=policy, not_visible=NOT_VISIBLE)
        if not isinstance(loaded, tuple):
            return loaded
        contract = FULL if whole else CHEAP
        return self._read_artifact(key, ext, loaded[0], policy, False, contract=contract)

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
        path = f"{self._prefix}{key}.{stored_ext}"  # self.path(), inline: the hot path
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
                    self._read_locks = False  # no flock here: digests still protect reads
            ast = os.fstat(afd)
            if not stat.S_ISREG(ast.st_mode) or (policy is not None and not policy.may_serve(ast)):
                refused = unservable(key, ast, "artifact", policy)
                if refused is not None:
                    return refused
            if ast.st_size != doc["size"]:
                return Problem(
                    key, f"artifact has {ast.st_size} bytes, metadata says {doc['size']}"
                )
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
            key, stored_ext, data, path, doc, "readonly" if self.readonly else "local"
        )

    def _load_metadata(self, key: str) -> tuple[dict[str, Any], float] | Problem | None:
        """Read and check ``<key>.json``; return (doc, mtime), a Problem or None. (Only
        :meth:`read` remembers a document: once the artifact it names was found whole.)"""
        loaded = read_metadata(
            self.meta_path(key), key, trust=self._policy, not_visible=NOT_VISIBLE
        )
        if not isinstance(loaded, tuple):
            return loaded
        return loaded[0], loaded[1].st_mtime

    def get(self, key: str, ext: str) -> Artifact | Problem | None:
        """Read an entry; if it looks corrupt, re-check it under the key's lock and quarantine it.

        Returns the Artifact, a Problem (not served: corrupt and quarantined, or the key holds
        another ext), or None (no entry). Raises ValueError for a malformed key or ext.
        """
        check_key(key)
        check_ext(ext)
        return self.get_checked(key, ext)

    def get_checked(
        self, key: str, ext: str, *, wait: float | WaitBudget | None = None
    ) -> Artifact | Problem | None:
        """:meth:`get` for a key and ext the caller has already validated; a repair waits at
        most ``wait`` seconds in all (or what is left of that budget; None: the lock
        timeout)."""
        result = self.read(key, ext)
        if isinstance(result, Problem) and result.corrupt:
            if isinstance(wait, WaitBudget):
                wait = wait.remaining()
            return self.repair(key, ext, wait=wait)
        return result

    def _touch(self, key: str) -> None:
        with contextlib.suppress(OSError):
            os.utime(self.meta_path(key), follow_symlinks=False)
