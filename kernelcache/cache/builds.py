"""Building on a miss, at most one builder per key at a time (single flight).

``get_or_create`` runs at most one ``build`` per key at a time across every process sharing
the writable root: the others wait for the builder's lock and then read its result.
``get_or_create_many`` does the same for many keys with work stealing: a process builds every
missing key whose lock is free before it waits for the keys that other processes are building,
and takes over those whose builder died. With a remote tier the same holds across machines: a
key whose job-wide lock another machine holds is set aside while the process builds the
others, and asked again with back-off; the waits for those locks share one budget per call, the
lock timeout (not one per key), and a key still held elsewhere once it is spent is built without
the remote lock, with one warning naming the lock, its holder and the tier. The requests one key
makes to the remote tier (its reads, lock tries, put and release; not those of its build) are
one lookup there, whose time in each tier is bounded as a whole
(:func:`~kernelcache.remote.tier.lookup`). A failure of the cache is never the caller's: the
artifact is built in memory instead (warned once).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from .. import stats
from ..errors import CacheError, LockTimeout, WrongExt
from ..process import warn_once
from ..remote.tier import POLL_FIRST as REMOTE_POLL_FIRST
from ..remote.tier import Busy, Claim, Lookup, lookup, next_poll, try_lock
from ..store.entry import Artifact
from ..store.locks.locker import Held, WaitBudget
from . import writes
from .layers import Accept, Layers

logger = logging.getLogger(__name__)

BuildFn = Callable[[], "tuple[bytes, Mapping[str, Any]]"]
#: the first pause between two rounds of tries while other processes build, and the longest:
#: a tenth of the time the call has waited so far, at least POLL_MAX and at most POLL_LONGEST
#: (a build another process finishes is noticed at most 10 % of the wait late, and processes
#: waiting for a long build do not spin: polling every 10 ms, 256 waiting processes of 32
#: roots spent 49 CPU-s in a 29 s job on 2 cores)
POLL_FIRST = 0.0005
POLL_MAX = 0.01
POLL_LONGEST = 0.5


class _Busy:
    """A build lock another process holds."""


_BUSY = _Busy()


@dataclass(frozen=True)
class BuildItem:
    """One entry asked of :meth:`Cache.get_or_create_many`: ``build()`` makes it on a miss,
    returning ``(data, meta)``; ``accept`` checks an entry of the remote tier before it is
    published (:meth:`Cache.remote_lookup <kernelcache.cache.Cache.remote_lookup>`)."""

    key: str
    ext: str
    build: BuildFn
    accept: Accept | None = None


def rebuild(cache: Layers, key: str, ext: str, build: BuildFn, stale: Artifact) -> Artifact:
    """:meth:`Cache.rebuild <kernelcache.cache.Cache.rebuild>` of a validated key."""
    budget = WaitBudget(cache.lock_timeout, cache.root)
    if cache.disabled:
        return _build(cache, key, ext, build, None)
    held: Held | None = None
    try:
        held = cache.store.locker.acquire(key + ".build", shared=False, timeout=budget.remaining())
    except LockTimeout:
        budget.remaining()  # (spent: noted for the process's next calls)
        warn_once(
            logger,
            (cache.root, "build-lock"),
            "kernelcache: waited %.0fs for another builder under %s; building privately",
            cache.lock_timeout,
            cache.root,
        )
    except CacheError as e:
        warn_once(logger, (cache.root, "locks"), "kernelcache: building without a lock: %s", e)
    try:
        now = _local_lookup(cache, key, ext)
        if now is not None and now.meta.get("digest") != stale.meta.get("digest"):
            return now
        return _build(cache, key, ext, build, budget, replace=True)
    finally:
        if held is not None:
            held.release()


def each(
    cache: Layers,
    slots: dict[tuple[str, str], list[int]],
    items: dict[tuple[str, str], BuildItem],
    wait: bool,
) -> Iterator[tuple[int, Artifact | Exception | None]]:
    """:meth:`Cache.get_or_create_each <kernelcache.cache.Cache.get_or_create_each>` of the
    validated keys of ``slots`` (each with the indices of its items), each built (and its
    remote entry accepted) as the first of its ``items`` says.

    The remote tier is asked for a key under the key's build lock in the writable root only:
    of the processes sharing a root (a node's), one asks it, and one waits for another
    machine's build of the key (holding that lock meanwhile, except while the caller runs),
    while the others wait for the root; so a job's requests grow with its nodes, not with its
    processes."""
    # every wait of this call together; the caller's time between two results is not ours
    budget = WaitBudget(cache.lock_timeout, cache.root)
    # each key's requests to the remote tier, bounded together (:func:`~..remote.tier.lookup`)
    scopes = {entry: Lookup() for entry in slots}
    pending: list[tuple[str, str]] = []
    for entry in slots:
        art = cache.lookup(*entry, budget, remote=False)
        if art is None:
            pending.append(entry)
        else:
            with budget.paused():
                yield from ((i, art) for i in slots[entry])
    if cache.disabled:
        for key, ext in pending:
            stats.count(cache.root, misses=1)
            built = _attempt(cache, items[(key, ext)], None, budget)
            assert not isinstance(built, Busy)  # a disabled cache takes no locks
            with budget.paused():
                yield from ((i, built) for i in slots[(key, ext)])
        return
    waited: set[tuple[str, str]] = set()  # found held by another process
    # keys whose remote lock another machine holds: (when to ask again, the next delay)
    remote_waits: dict[tuple[str, str], tuple[float, float]] = {}
    # the build locks in the root this call holds while another machine builds their key
    holding: dict[tuple[str, str], Held | None] = {}
    delay, waiting = POLL_FIRST, 0.0
    try:
        while pending:
            left: list[tuple[str, str]] = []
            for entry in pending:
                key, ext = entry
                due = remote_waits.get(entry)
                if due is not None and time.monotonic() < due[0] and budget.remaining() > 0:
                    left.append(entry)  # built on another machine: not yet time to ask again
                    continue
                result: Artifact | Exception | None = None
                held = holding.pop(entry) if entry in holding else _claim(cache, key)
                if not isinstance(held, _Busy):
                    with lookup(scopes[entry]):
                        attempt = _attempt(cache, items[entry], held, budget, due is None, wait)
                    if not isinstance(attempt, Busy):
                        result = attempt
                    elif wait:
                        holding[entry] = held  # (the attempt kept it)
                        if entry not in waited:
                            waited.add(entry)
                            stats.count(cache.root, lock_waits=1)
                        pause, after = next_poll(REMOTE_POLL_FIRST if due is None else due[1])
                        remote_waits[entry] = (time.monotonic() + pause, after)
                        left.append(entry)
                        continue
                elif wait:
                    if entry not in waited:
                        waited.add(entry)
                        stats.count(cache.root, lock_waits=1)
                    result = _local_lookup(cache, key, ext)  # published, lock not yet released
                    if result is None and budget.remaining() <= 0:
                        with lookup(scopes[entry]):
                            result = _private(cache, items[entry], budget)
                    if result is None:
                        left.append(entry)
                        continue
                # no lock is held while the caller runs: the others wait their turn
                _release(holding)
                with budget.paused():
                    yield from ((i, result) for i in slots[entry])
            if left and len(left) == len(pending):  # every remaining key is built elsewhere
                waiting = waiting or time.monotonic()
                time.sleep(delay)
                late = (time.monotonic() - waiting) / 10
                delay = min(delay * 2, POLL_LONGEST, max(POLL_MAX, late))
            else:
                delay = POLL_FIRST  # (something moved: others may follow soon)
            pending = left
    finally:
        _release(holding)


def _release(holding: dict[tuple[str, str], Held | None]) -> None:
    """Release the build locks of ``holding`` and forget them."""
    for held in holding.values():
        if held is not None:
            held.release()
    holding.clear()


def _claim(cache: Layers, key: str) -> Held | _Busy | None:
    """Try the build lock of ``key`` without waiting: the lock, None where locks cannot
    be taken here (warned once), or ``_BUSY`` when another process holds it."""
    try:
        return cache.store.locker.acquire(key + ".build", shared=False, timeout=0)
    except LockTimeout:
        return _BUSY
    except CacheError as e:
        warn_once(logger, (cache.root, "locks"), "kernelcache: building without a lock: %s", e)
        return None


def _private(cache: Layers, item: BuildItem, budget: WaitBudget) -> Artifact | Exception:
    """Build ``key`` without its lock once the call has waited its lock timeout; say who
    held the lock (and note it in the statistics log, for ``kernelcache doctor``)."""
    key = item.key
    stats.count(cache.root, lock_timeouts=1)
    holder = cache.store.locker.holder(key + ".build")
    stats.note_lock_wait(cache.root, key, cache.lock_timeout, holder)
    who = ""
    if holder is not None:
        since = holder["since"]
        held_for = time.time() - since if since is not None else cache.lock_timeout
        who = f" (held by pid {holder['pid']} on host {holder['host']} for {held_for:.0f}s)"
    warn_once(
        logger,
        (cache.root, "build-lock"),
        "kernelcache: waited %.0fs for another builder under %s%s; building privately",
        cache.lock_timeout,
        cache.root,
        who,
    )
    built = _attempt(cache, item, None, budget)
    assert not isinstance(built, Busy)  # the budget is spent: nothing is waited for
    return built


def _attempt(
    cache: Layers,
    item: BuildItem,
    held: Held | None,
    budget: WaitBudget,
    first: bool = True,
    keep: bool = False,
) -> Artifact | Exception | Busy:
    """Look ``item`` up again under its lock ``held`` (if any): in the local layers, then
    (``first``: not asked since another machine was found building it) in the remote tier;
    build it if still missing. The lock is released before returning, unless the result is
    :class:`Busy` (another machine holds the key's remote lock and ``budget`` is not spent:
    nothing was built) and ``keep``: the caller then holds it while it waits. A failing build
    is returned."""
    result: Artifact | Exception | Busy
    try:
        result = _build_locked(cache, item, held, budget, first)
    except Exception as e:  # the caller decides: raise it, or report it per item
        result = e
    except BaseException:
        if isinstance(held, Held):
            held.release()
        raise
    if isinstance(held, Held) and not (keep and isinstance(result, Busy)):
        held.release()
    return result


def _build_locked(
    cache: Layers, item: BuildItem, held: Held | None, budget: WaitBudget, first: bool = True
) -> Artifact | Busy:
    key, ext, build = item.key, item.ext, item.build
    if cache.disabled:
        return _build(cache, key, ext, build, None)
    if held is not None:  # (the remote tier is asked through its lock, below)
        art = cache.lookup(key, ext, budget, remote=False)
        if isinstance(art, WrongExt):
            raise art
        if art is not None:
            return art
    release_remote = None
    if cache.remote is not None:
        if first:  # a hit is one request; a miss then asks for the key's lock
            art = cache.remote_lookup(key, ext, budget, accept=item.accept)
            if art is not None:
                return art
        claim = _remote_claim(cache, key, budget)
        if isinstance(claim, Busy):
            if budget.remaining() > 0:
                return claim  # built on another machine: the caller asks again later
            _remote_wait_spent(cache, claim)
        elif claim is not None:
            release_remote = claim
            art = cache.remote_lookup(key, ext, budget, accept=item.accept)
            if art is not None:
                release_remote()
                return art
    try:
        stats.count(cache.root, misses=1)
        return _build(cache, key, ext, build, budget)
    finally:
        if release_remote is not None:
            release_remote()


def _remote_claim(cache: Layers, key: str, budget: WaitBudget) -> Claim:
    """One try at the remote tier's build lock of ``key`` (a tier that cannot try once
    waits within what is left of ``budget``); None if it is unavailable (the caller builds
    anyway). A tier that raises is a tier without the lock."""
    assert cache.remote is not None
    try:
        return try_lock(cache.remote, key, budget.remaining())
    except Exception as e:  # a tier must not raise; if one does, build without its lock
        stats.count(cache.root, remote_errors=1)
        warn_once(
            logger, (cache.root, "remote-raised"), "kernelcache: the remote tier failed: %r", e
        )
        return None


def _remote_wait_spent(cache: Layers, busy: Busy) -> None:
    """The call waited its lock timeout and another machine still holds a remote lock:
    build without it, saying which lock, who holds it and where."""
    stats.count(cache.root, lock_timeouts=1)
    warn_once(
        logger,
        (cache.root, "remote-build-lock"),
        "kernelcache: waited %.0fs for build locks in the remote tier %s; %s is still held "
        "by %s; building without it",
        cache.lock_timeout,
        busy.tier,
        busy.lock,
        busy.holder,
    )


def _build(
    cache: Layers,
    key: str,
    ext: str,
    build: BuildFn,
    budget: WaitBudget | None,
    *,
    replace: bool = False,
) -> Artifact:
    """Run ``build`` and store what it made (``budget`` None: keep it in memory;
    ``replace``: in place of an entry), waiting at most what is left of ``budget`` to
    store it. What ``build`` asks of a remote tier is no part of the key's lookup."""
    started = time.monotonic()
    with lookup(None):
        if budget is None:
            data, meta = build()
        else:
            with budget.paused():
                data, meta = build()
    stats.count(cache.root, builds=1, build_seconds=time.monotonic() - started)
    if budget is None:
        return writes.in_memory(key, ext, data, meta)
    try:
        return writes.put(cache, key, ext, data, meta, budget.remaining(), replace=replace)
    except CacheError as e:
        warn_once(logger, (cache.root, "write"), "kernelcache: using an in-memory artifact: %s", e)
        return writes.in_memory(key, ext, data, meta)
    finally:
        stats.flush()


def _local_lookup(cache: Layers, key: str, ext: str) -> Artifact | None:
    """A verified artifact of ``key`` in a local layer (the remote tier is not asked: this
    runs in the waiting loop); counts a hit."""
    for store in cache.layers:
        try:
            result = store.get(key, ext, checked=True)
        except OSError:
            continue  # Cache.lookup reports it when the key is looked up for real
        if isinstance(result, Artifact):
            stats.count(cache.root, hits=1, bytes_read=len(result.data))
            return result
    return None
