"""Several remote tiers as one, tried in order (e.g. a Redis Cluster, then a bucket): a hit in a
lower tier is copied to the writable tiers above it (backfill), in a background thread so that
the job does not wait for it; a put is sent in order down to the first tier that holds the
entry, and to the tiers below that one in the same background thread (a slow or hung tier
there never delays a result: one above already serves the entry).

Invariants: a tier that raises is a tier that missed (one warning per tier); what a lower tier
returns is checked (:func:`~kernelcache.remote.codec.check_entry`) before it is copied up;
read-only tiers are never written; backfill and the puts below the first tier that holds an
entry never block a caller (a full queue drops copies) and are given a bounded time at exit. A
lookup of an entry that is usually absent (a decision, a remembered failure, a memo:
:func:`~kernelcache.keys.declare_sparse`) waits at most :data:`SPARSE_WAIT` for each
tier below the first: a slow or hung tier costs it a quarter of a second, not the tier's
timeout, and an answer that comes later is copied up for the next lookup. A key's build lock
is taken in the first writable tier that can give it: where a tier (or the key's shard in it)
is unavailable, the next writable tier's lock keeps one builder across the job.
"""

from __future__ import annotations

import atexit
import functools
import os
import queue
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .. import stats
from ..keys import SPARSE_EXTS
from ..process import warn_once
from .base import logger, tier_label
from .codec import check_entry
from .contact import off_path
from .leases import no_release
from .tier import Busy, Claim, RemoteTier, try_lock, wait_for

#: copies waiting to be made at most; more are dropped (a later hit copies them again)
BACKFILL_QUEUE = 256
#: seconds a process waits at exit for the copies it queued
EXIT_WAIT = 2.0
#: seconds a lookup of a usually absent entry (:data:`~kernelcache.keys.SPARSE_EXTS`)
#: waits for a tier below the first, and how many such lookups may run at once
SPARSE_WAIT = 0.25
SPARSE_CALLS = 8

#: a copy to make in the background: (tiers, key, ext, data, meta, the counter of a copy made:
#: "backfills", or "" for a put)
_Copy = tuple[list[RemoteTier], str, str, bytes, dict[str, Any], str]


def label_of(tier: object) -> str:
    """A tier's name in counters and warnings (a built-in tier's, else its class's)."""
    label = getattr(tier, "label", None)
    return label if isinstance(label, str) else tier_label(type(tier).__name__)


def writable(tier: object) -> bool:
    return not getattr(tier, "read_only", False)


class LayeredTier:
    """Remote tiers tried in order, as one :class:`~kernelcache.remote.RemoteTier`.

    ``get`` asks each tier until one hits, then copies the entry to the writable tiers above
    it in the background; ``put`` sends to every writable tier (those below the first that
    holds the entry in the background); ``try_acquire`` and ``acquire`` take the build lock of
    the first writable tier that is available for the key.
    """

    def __init__(self, tiers: Sequence[RemoteTier], *, stats_root: str | None = None) -> None:
        self.tiers = list(tiers)
        self._stats_root = stats_root or "remote:layered"
        self._queue: queue.Queue[_Copy] = queue.Queue(BACKFILL_QUEUE)
        self._worker: threading.Thread | None = None
        self._pid = os.getpid()
        self._lock = threading.Lock()
        #: lookups of usually absent entries running in the background, at most
        self._sparse = threading.BoundedSemaphore(SPARSE_CALLS)
        _live.add(self)

    def __repr__(self) -> str:
        return f"LayeredTier({', '.join(label_of(t) for t in self.tiers)})"

    __str__ = __repr__

    @property
    def counters(self) -> dict[str, dict[str, int]]:
        """Each tier's own counters in this process, by label."""
        return {label_of(t): dict(getattr(t, "counters", {})) for t in self.tiers}

    def _safely(self, tier: RemoteTier, method: str, *args: Any, default: Any = None) -> Any:
        """``tier.method(*args)``, or ``default`` (counted, warned once) if it raised."""
        return self._guarded(tier, lambda: getattr(tier, method)(*args), default)

    def _guarded(self, tier: RemoteTier, call: Callable[[], Any], default: Any = None) -> Any:
        """``call()`` (something asked of ``tier``), or ``default`` (counted, warned once) if
        it raised."""
        try:
            return call()
        except Exception as e:  # a tier must not raise; if one does, it missed
            label = label_of(tier)
            stats.count(self._stats_root, remote_errors=1)
            stats.count_tier(self._stats_root, label, errors=1)
            warn_once(
                logger, (label, "raised"), "kernelcache: the remote tier %s failed: %r", label, e
            )
            return default

    # -- the RemoteTier interface ---------------------------------------------------------
    def get(self, key: str, ext: str) -> tuple[bytes, dict[str, Any]] | None:
        for index, tier in enumerate(self.tiers):
            if index and ext in SPARSE_EXTS:
                found = self._briefly(tier, key, ext, self.tiers[:index])
            else:
                found = self._safely(tier, "get", key, ext)
            if found is None:
                continue
            checked = self._checked(tier, key, ext, found)
            if checked is None:
                continue
            above = [t for t in self.tiers[:index] if writable(t)]
            if above:
                self._backfill((above, key, ext, *checked, "backfills"))
            return checked
        return None

    def _briefly(
        self, tier: RemoteTier, key: str, ext: str, upper: Sequence[RemoteTier]
    ) -> tuple[bytes, dict[str, Any]] | None:
        """``tier.get(key, ext)`` of a usually absent entry, waited for :data:`SPARSE_WAIT`
        seconds at most: an answer that comes later is copied to the writable tiers above
        (``upper``), for the next lookup. A lookup of a tier that has :data:`SPARSE_CALLS`
        such lookups running already is not made (a miss)."""
        if not self._sparse.acquire(blocking=False):
            return None
        ready = threading.Event()
        handoff = threading.Lock()
        # [the answer, whether the caller stopped waiting for it]
        state: list[Any] = [None, False]

        def ask() -> None:
            try:
                found = self._safely(tier, "get", key, ext)
                with handoff:
                    state[0] = found
                    late = state[1]
                    ready.set()
                above = [t for t in upper if writable(t)]
                if late and found is not None and above:
                    checked = self._checked(tier, key, ext, found)
                    if checked is not None:
                        self._backfill((above, key, ext, *checked, "backfills"))
            finally:
                self._sparse.release()

        threading.Thread(target=ask, name="kernelcache-sparse-get", daemon=True).start()
        ready.wait(SPARSE_WAIT)
        with handoff:
            if ready.is_set():
                found: tuple[bytes, dict[str, Any]] | None = state[0]
                return found
            state[1] = True  # from now on, an answer is late
        stats.count_tier(self._stats_root, label_of(tier), skipped=1)
        return None

    def _checked(
        self, tier: RemoteTier, key: str, ext: str, found: tuple[bytes, dict[str, Any]]
    ) -> tuple[bytes, dict[str, Any]] | None:
        """``found`` (what ``tier`` returned for ``key``) if it is a whole entry, else None
        (counted, warned once)."""
        checked = check_entry(found, key, ext)
        if isinstance(checked, str):
            stats.count_tier(self._stats_root, label_of(tier), errors=1)
            warn_once(
                logger,
                (label_of(tier), "bad-entry"),
                "kernelcache: the remote tier %s returned a bad entry (%s): %s",
                label_of(tier),
                key,
                checked,
            )
            return None
        return checked

    def put(self, key: str, ext: str, data: bytes, meta: Mapping[str, Any]) -> bool:
        """Send the entry to the writable tiers in order until one holds it (stored now, or
        there already, as far as the tier tells: a built-in tier's ``put_outcome``), then to
        the tiers below that one in the background (counted ``puts`` in each as they are
        made). Whether a tier waited for stored it."""
        tiers = [t for t in self.tiers if writable(t)]
        for index, tier in enumerate(tiers):
            if callable(getattr(tier, "put_outcome", None)):
                held = self._safely(tier, "put_outcome", key, ext, data, meta)
            else:
                held = True if self._safely(tier, "put", key, ext, data, meta) else None
            if held is not None:
                if tiers[index + 1 :]:
                    self._backfill((tiers[index + 1 :], key, ext, data, dict(meta), ""))
                return bool(held)
        return False

    def try_acquire(self, key: str) -> Claim:
        """One try at the build lock of ``key`` in the first writable tier that is available
        for it (a tier, or the key's shard in it, may be down: the next one's lock then keeps
        one builder); :class:`Busy` from the tier that holds it elsewhere; None when no
        writable tier is available. A tier without ``try_acquire`` is asked ``acquire(key,
        0)``, and its None read as unavailable. The release of a lock taken is guarded as every
        call of a tier is (a release that raises is counted and warned about, never raised)."""
        writable_tiers = [t for t in self.tiers if writable(t)]
        for tier in writable_tiers:
            claim: Claim = self._guarded(tier, functools.partial(try_lock, tier, key, 0.0))
            if claim is None:
                continue
            if isinstance(claim, Busy) or claim is no_release:
                return claim
            return functools.partial(self._guarded, tier, claim)
        return None if writable_tiers else no_release

    def acquire(self, key: str, timeout: float) -> Callable[[], None] | None:
        """:meth:`try_acquire` until the lock is not busy, for at most ``timeout`` seconds;
        None when it was not had in time or no tier is available."""
        claim = wait_for(lambda: self.try_acquire(key), timeout)
        return None if isinstance(claim, Busy) else claim

    def close(self) -> None:
        """Close every tier that can be closed."""
        for tier in self.tiers:
            if callable(getattr(tier, "close", None)):
                self._safely(tier, "close")

    # -- backfill -----------------------------------------------------------------------
    def _backfill(self, copy: _Copy) -> None:
        with self._lock:
            if self._pid != os.getpid():  # a forked child: its parent's thread is not here
                self._queue, self._worker = queue.Queue(BACKFILL_QUEUE), None
                self._pid = os.getpid()
            if self._worker is None:
                self._worker = threading.Thread(
                    target=self._copy_loop, name="kernelcache-backfill", daemon=True
                )
                self._worker.start()
        try:
            self._queue.put_nowait(copy)
        except queue.Full:
            logger.debug("kernelcache: backfill queue full; not copying %s", copy[1])

    def _copy_loop(self) -> None:
        work = self._queue
        with off_path():  # nobody waits for these: they may wait for a first contact
            while True:
                tiers, key, ext, data, meta, counter = work.get()
                try:
                    for tier in tiers:
                        if self._safely(tier, "put", key, ext, data, meta) and counter:
                            stats.count_tier(self._stats_root, label_of(tier), **{counter: 1})
                finally:
                    work.task_done()

    def flush(self, timeout: float = EXIT_WAIT) -> bool:
        """Wait up to ``timeout`` seconds for the queued copies; whether all were made."""
        deadline = time.monotonic() + timeout
        work = self._queue
        while work.unfinished_tasks:
            if time.monotonic() >= deadline or self._pid != os.getpid():
                return False
            time.sleep(0.005)
        return True


_live: weakref.WeakSet[LayeredTier] = weakref.WeakSet()


@atexit.register
def _flush_at_exit() -> None:
    deadline = time.monotonic() + EXIT_WAIT
    for tier in list(_live):
        tier.flush(max(0.0, deadline - time.monotonic()))
