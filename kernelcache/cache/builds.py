"""Building on a miss, at most one builder per key at a time (single flight).

``get_or_create`` runs at most one ``build`` per key at a time across every process sharing
the writable root: the others wait for the builder's lock and then read its result.
``get_or_create_many`` does the same for many keys with work stealing: a process builds every
missing key whose lock is free before it waits for the keys that other processes are building,
and takes over those whose builder died. With a remote tier the same holds across machines: a
key whose job-wide lock another machine holds is set aside while the process builds the
others, and asked again with back-off. A failure of the cache is never the caller's: the
artifact is built in memory instead (warned once).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .. import stats
from ..errors import CacheError, LockTimeout, WrongExt
from ..keys import check_ext, check_key
from ..process import warn_once
from ..remote.tier import POLL_FIRST as REMOTE_POLL_FIRST
from ..remote.tier import Busy, Claim, next_poll, try_lock
from ..store.entry import Artifact
from ..store.locks.budget import WaitBudget
from ..store.locks.locker import Held
from .reads import Reads

logger = logging.getLogger(__name__)

BuildFn = Callable[[], "tuple[bytes, Mapping[str, Any]]"]
#: the first and the longest pause between two rounds of tries while other processes build
POLL_FIRST = 0.0005
POLL_MAX = 0.01


class _Busy:
    """A build lock another process holds."""


_BUSY = _Busy()


@dataclass(frozen=True)
class BuildItem:
    """One entry asked of :meth:`Cache.get_or_create_many`: ``build()`` makes it on a miss,
    returning ``(data, meta)``."""

    key: str
    ext: str
    build: BuildFn


class Builds(Reads):
    """How a :class:`~kernelcache.cache.Cache` builds what it misses."""

    def rebuild(self, key: str, ext: str, build: BuildFn, *, stale: Artifact) -> Artifact:
        """Build ``key`` again in place of ``stale``: what a read of ``key`` returned that the
        caller cannot use (a document it refuses inside a whole entry).

        Single flight across the processes sharing the writable root: under the key's build
        lock (the one :meth:`get_or_create` takes; the remote tier's is not taken), an entry
        other than ``stale`` (another process rebuilt it meanwhile) is returned as it is;
        otherwise ``build()`` runs and what it made replaces ``stale`` (:meth:`replace`). A
        lock not had within the lock timeout is built without, and a result that cannot be
        stored is returned from memory, each with one warning.

        Raises:
            ValueError: malformed key or ext.
            Exception: whatever ``build`` raises.
        """
        check_key(key)
        check_ext(ext)
        budget = WaitBudget(self.lock_timeout)
        if self.disabled:
            return self._build(key, ext, build, None)
        held: Held | None = None
        try:
            held = self.store.locker.acquire(
                key + ".build", shared=False, timeout=self.lock_timeout
            )
        except LockTimeout:
            warn_once(
                logger,
                (self.root, "build-lock"),
                "kernelcache: waited %.0fs for another builder under %s; building privately",
                self.lock_timeout,
                self.root,
            )
        except CacheError as e:
            warn_once(logger, (self.root, "locks"), "kernelcache: building without a lock: %s", e)
        try:
            now = self._local_lookup(key, ext)
            if now is not None and now.meta.get("digest") != stale.meta.get("digest"):
                return now
            return self._build(key, ext, build, budget, replace=True)
        finally:
            if held is not None:
                held.release()

    def get_or_create(self, key: str, ext: str, build: BuildFn) -> Artifact:
        """Return the cached artifact, or run ``build()`` once across processes and store it.

        ``build()`` returns ``(data, meta)``. Concurrent callers for the same missing key, in
        any process sharing the writable root, wait for the one builder and read its result.
        If the lock cannot be had within the lock timeout, or the entry cannot be stored, the
        artifact is built and returned from memory (``path`` None) with one warning. The
        one-key case of :meth:`get_or_create_many`.

        Raises:
            ValueError: malformed key or ext.
            WrongExt: the key holds an artifact of another extension (before any build).
            TypeError: ``build`` returned data that is not bytes.
            Exception: whatever ``build`` raises.
        """
        return self.get_or_create_many([BuildItem(key, ext, build)])[0]

    def get_or_create_many(self, items: Sequence[BuildItem]) -> list[Artifact]:
        """The artifacts of ``items``, in order, building the missing ones with work stealing.

        See :meth:`get_or_create_each` for what is guaranteed across processes.

        Raises:
            ValueError: a malformed key or ext (before any file is touched).
            Exception: the first exception an item's ``build`` raised (its lock released;
                items not reached yet are left to other processes or a later call).
        """
        results: list[Artifact | None] = [None] * len(items)
        for index, result in self.get_or_create_each(items):
            if isinstance(result, Exception):
                raise result
            results[index] = result
        assert all(r is not None for r in results)
        return results  # type: ignore[return-value]  # every slot was filled above

    def get_or_create_each(
        self, items: Sequence[BuildItem], *, wait: bool = True
    ) -> Iterator[tuple[int, Artifact | Exception | None]]:
        """Yield ``(index, result)`` for every item as its artifact is ready, building the
        missing ones with work stealing.

        Every key is looked up first. Then, for each missing key in order, the key's build lock
        is tried without waiting: a key whose lock is had is re-checked under it and built;
        a key whose lock another process holds (it is building that key) is skipped. Only when
        nothing is left to build does the caller wait, retrying every remaining key without
        blocking in a loop: it reads the result of whichever builder finishes first, and takes
        over a key whose builder died (a ``flock`` is dropped with its process; a soft lock
        of a dead process, or one not refreshed for the stale timeout, is broken).

        Across processes sharing the writable root: at most one process builds a key at a
        time (single flight, as :meth:`get_or_create`), so a key is built once in total unless
        its builder dies or fails, or holds it past the lock timeout; a process never waits on
        a key while it could build another one. With a remote tier, the builder of a key also
        takes the tier's job-wide lock of that key, so one machine builds it; a key whose
        remote lock another machine holds is set aside (its local lock released) and asked
        again with back-off while this process builds the others, and read once built. The
        waits for those locks share one budget per call, the lock timeout (not one per key);
        a key still held elsewhere once it is spent is built without the remote lock, with one
        warning naming the lock, its holder and the tier.

        Never fails on a cache failure: a key whose lock cannot be taken is built without it,
        and the keys still held by other processes once the call has waited the lock timeout
        in all (its builds not counted) are built privately, with one warning naming the
        holder; their ``put`` then tries the key's lock once and never waits again (the
        artifact is published, or returned from memory). A call of N keys waits about one lock
        timeout, not N.

        Yields:
            ``(index, result)`` in completion order, once per item: ``result`` is the
            :class:`Artifact`, the exception the item's ``build`` raised (the key is left
            unbuilt, its lock released), :class:`WrongExt` for a key the writable root holds
            with another extension (never built), or, with ``wait=False``, None for a key
            another process is building (nothing is waited for). Equal ``(key, ext)`` items are
            built once and yielded each. No lock is held while the caller runs between two
            results.

        Raises:
            ValueError: a malformed key or ext (at the call, before any file is touched).
        """
        slots: dict[tuple[str, str], list[int]] = {}
        builds: dict[tuple[str, str], BuildFn] = {}
        for index, item in enumerate(items):
            check_key(item.key)
            check_ext(item.ext)
            slots.setdefault((item.key, item.ext), []).append(index)
            builds.setdefault((item.key, item.ext), item.build)
        return self._each(slots, builds, wait)

    def _each(
        self,
        slots: dict[tuple[str, str], list[int]],
        builds: dict[tuple[str, str], BuildFn],
        wait: bool,
    ) -> Iterator[tuple[int, Artifact | Exception | None]]:
        # every wait of this call together; the caller's time between two results is not ours
        budget = WaitBudget(self.lock_timeout)
        pending: list[tuple[str, str]] = []
        for entry in slots:
            art = self._lookup(*entry, budget)
            if art is None:
                pending.append(entry)
            else:
                with budget.paused():
                    yield from ((i, art) for i in slots[entry])
        if self.disabled:
            for key, ext in pending:
                stats.count(self.root, misses=1)
                built = self._attempt(key, ext, builds[(key, ext)], None, budget)
                assert not isinstance(built, Busy)  # a disabled cache takes no locks
                with budget.paused():
                    yield from ((i, built) for i in slots[(key, ext)])
            return
        waited: set[tuple[str, str]] = set()  # found held by another process
        # keys whose remote lock another machine holds: (when to ask again, the next delay)
        remote_waits: dict[tuple[str, str], tuple[float, float]] = {}
        delay = POLL_FIRST
        while pending:
            left: list[tuple[str, str]] = []
            for entry in pending:
                key, ext = entry
                due = remote_waits.get(entry)
                if due is not None and time.monotonic() < due[0] and budget.remaining() > 0:
                    left.append(entry)  # built on another machine: not yet time to ask again
                    continue
                result: Artifact | Exception | None = None
                held = self._claim(key)
                if not isinstance(held, _Busy):
                    attempt = self._attempt(key, ext, builds[entry], held, budget)
                    if not isinstance(attempt, Busy):
                        result = attempt
                    elif wait:
                        if entry not in waited:
                            waited.add(entry)
                            stats.count(self.root, lock_waits=1)
                        pause, after = next_poll(REMOTE_POLL_FIRST if due is None else due[1])
                        remote_waits[entry] = (time.monotonic() + pause, after)
                        left.append(entry)
                        continue
                elif wait:
                    if entry not in waited:
                        waited.add(entry)
                        stats.count(self.root, lock_waits=1)
                    result = self._local_lookup(key, ext)  # published, lock not yet released
                    if result is None and budget.remaining() <= 0:
                        result = self._private(key, ext, builds[entry], budget)
                    if result is None:
                        left.append(entry)
                        continue
                # no lock is held here: hand the result over while the others wait their turn
                with budget.paused():
                    yield from ((i, result) for i in slots[entry])
            if left and len(left) == len(pending):  # every remaining key is built elsewhere
                time.sleep(delay)
                delay = min(delay * 2, POLL_MAX)
            else:
                delay = POLL_FIRST
            pending = left

    def _claim(self, key: str) -> Held | _Busy | None:
        """Try the build lock of ``key`` without waiting: the lock, None where locks cannot
        be taken here (warned once), or ``_BUSY`` when another process holds it."""
        try:
            return self.store.locker.acquire(key + ".build", shared=False, timeout=0)
        except LockTimeout:
            return _BUSY
        except CacheError as e:
            warn_once(logger, (self.root, "locks"), "kernelcache: building without a lock: %s", e)
            return None

    def _private(
        self, key: str, ext: str, build: BuildFn, budget: WaitBudget
    ) -> Artifact | Exception:
        """Build ``key`` without its lock once the call has waited its lock timeout; say who
        held the lock (and note it in the statistics log, for ``kernelcache doctor``)."""
        stats.count(self.root, lock_timeouts=1)
        holder = self.store.locker.holder(key + ".build")
        stats.note_lock_wait(self.root, key, self.lock_timeout, holder)
        who = ""
        if holder is not None:
            since = holder["since"]
            held_for = time.time() - since if since is not None else self.lock_timeout
            who = f" (held by pid {holder['pid']} on host {holder['host']} for {held_for:.0f}s)"
        warn_once(
            logger,
            (self.root, "build-lock"),
            "kernelcache: waited %.0fs for another builder under %s%s; building privately",
            self.lock_timeout,
            self.root,
            who,
        )
        built = self._attempt(key, ext, build, None, budget)
        assert not isinstance(built, Busy)  # the budget is spent: nothing is waited for
        return built

    def _attempt(
        self, key: str, ext: str, build: BuildFn, held: Held | None, budget: WaitBudget
    ) -> Artifact | Exception | Busy:
        """Look ``key`` up again under its lock ``held`` (if any) and build it if still
        missing; the lock is released before returning. A failing build is returned; so is
        :class:`Busy` while another machine holds the key's remote lock and ``budget`` is not
        spent (nothing was built)."""
        try:
            return self._build_locked(key, ext, build, held, budget)
        except Exception as e:  # the caller decides: raise it, or report it per item
            return e
        finally:
            if isinstance(held, Held):
                held.release()

    def _build_locked(
        self, key: str, ext: str, build: BuildFn, held: Held | None, budget: WaitBudget
    ) -> Artifact | Busy:
        if self.disabled:
            return self._build(key, ext, build, None)
        if held is not None:  # (the remote tier is asked through its lock, below)
            art = self._lookup(key, ext, budget, remote=False)
            if isinstance(art, WrongExt):
                raise art
            if art is not None:
                return art
        release_remote = None
        if self.remote is not None:
            claim = self._remote_claim(key, budget)
            if isinstance(claim, Busy):
                if budget.remaining() > 0:
                    return claim  # built on another machine: the caller asks again later
                self._remote_wait_spent(claim)
            elif claim is not None:
                release_remote = claim
                art = self._remote_lookup(key, ext, budget)
                if art is not None:
                    release_remote()
                    return art
        try:
            stats.count(self.root, misses=1)
            return self._build(key, ext, build, budget)
        finally:
            if release_remote is not None:
                release_remote()

    def _remote_claim(self, key: str, budget: WaitBudget) -> Claim:
        """One try at the remote tier's build lock of ``key`` (a tier that cannot try once
        waits within what is left of ``budget``); None if it is unavailable (the caller builds
        anyway). A tier that raises is a tier without the lock."""
        assert self.remote is not None
        try:
            return try_lock(self.remote, key, budget.remaining())
        except Exception as e:  # a tier must not raise; if one does, build without its lock
            stats.count(self.root, remote_errors=1)
            warn_once(
                logger, (self.root, "remote-raised"), "kernelcache: the remote tier failed: %r", e
            )
            return None

    def _remote_wait_spent(self, busy: Busy) -> None:
        """The call waited its lock timeout and another machine still holds a remote lock:
        build without it, saying which lock, who holds it and where."""
        stats.count(self.root, lock_timeouts=1)
        warn_once(
            logger,
            (self.root, "remote-build-lock"),
            "kernelcache: waited %.0fs for build locks in the remote tier %s; %s is still held "
            "by %s; building without it",
            self.lock_timeout,
            busy.tier,
            busy.lock,
            busy.holder,
        )

    def _build(
        self,
        key: str,
        ext: str,
        build: BuildFn,
        budget: WaitBudget | None,
        *,
        replace: bool = False,
    ) -> Artifact:
        """Run ``build`` and store what it made (``budget`` None: keep it in memory;
        ``replace``: in place of an entry), waiting at most what is left of ``budget`` to
        store it."""
        started = time.monotonic()
        if budget is None:
            data, meta = build()
        else:
            with budget.paused():
                data, meta = build()
        stats.count(self.root, builds=1, build_seconds=time.monotonic() - started)
        if budget is None:
            return self._in_memory(key, ext, data, meta)
        try:
            return self._put(key, ext, data, meta, budget.remaining(), replace=replace)
        except CacheError as e:
            warn_once(
                logger, (self.root, "write"), "kernelcache: using an in-memory artifact: %s", e
            )
            return self._in_memory(key, ext, data, meta)
        finally:
            stats.flush()
