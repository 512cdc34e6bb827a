"""The interface of a remote tier: what :class:`kernelcache.Cache` needs from a store shared by
many machines (:class:`RemoteTier`), and how a tier is made from its URL (:class:`TierClass`).

The cache depends on this module and on the registry only; every implementation (the Redis
tier, a plugin's tier, or any object a caller passes as ``Cache(remote=...)``) implements it.
A tier may also offer ``try_acquire(key)``: one try at a key's build lock that tells a lock
held by another client (:class:`Busy`) from an unavailable one (None); the cache then builds
other keys while another machine holds a key's lock, and says who held a lock it stopped
waiting for (:func:`try_lock`).

A lookup's time in a tier is bounded as a whole: the cache makes the requests of one key of a
``get_or_create`` (its reads, lock tries, put and release) inside :func:`lookup` of that key's
:class:`Lookup`, and a built-in tier lets them spend :data:`LOOKUP_TIMEOUTS` of its timeouts in
all (:mod:`.policy`): a tier answering every request just inside its timeout costs a lookup
two timeouts, not one per request, and a healthy one is never skipped for what one request
took (nothing is carried from one lookup to the next). What a build does runs outside its
key's lookup.
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

#: the first and the longest pause between two tries of a build lock held elsewhere (the first
#: after 0.1 s: a compile takes longer, and a job's nodes waiting for each variant one node
#: compiles make most of its requests: with 0.02 s, 64 nodes asked about 2 more times each)
POLL_FIRST, POLL_MAX = 0.1, 0.5
#: what the requests of one lookup may take in one tier, in all, in the tier's timeouts
LOOKUP_TIMEOUTS = 2.0


class Lookup:
    """The seconds the requests of one lookup have spent in each tier (keyed by the tier's
    failure policy), summed as each request ends; and the tiers where it ran out of time."""

    __slots__ = ("over", "spent")

    def __init__(self) -> None:
        self.spent: dict[object, float] = {}
        self.over: set[object] = set()


_here = threading.local()


def current_lookup() -> Lookup | None:
    """The lookup whose requests this thread makes now, or None (a request on its own)."""
    found: Lookup | None = getattr(_here, "lookup", None)
    return found


@contextlib.contextmanager
def lookup(scope: Lookup | None) -> Iterator[None]:
    """The requests this thread makes in the block are those of ``scope`` (None: of no
    lookup, each bounded on its own, as a build's are); the lookup before is restored after."""
    before = current_lookup()
    _here.lookup = scope
    try:
        yield
    finally:
        _here.lookup = before


@dataclass(frozen=True)
class Busy:
    """What ``try_acquire`` returns while another client holds the build lock of a key."""

    #: the lock's name in the tier
    lock: str
    #: who holds it, as far as the tier can tell (e.g. "host pid 1234"), or "unknown"
    holder: str
    #: the tier's label (its URL without query or secrets)
    tier: str


#: what one try at a build lock gives: a function that releases it (or releases nothing: the
#: entry is there already, or the tier takes no locks), Busy, or None (the tier is unavailable:
#: build without it)
Claim = Callable[[], None] | Busy | None


def next_poll(delay: float) -> tuple[float, float]:
    """``(the pause before the next try of a busy lock, the delay after that)``: exponential
    back-off from :data:`POLL_FIRST` to :data:`POLL_MAX`, jittered so that waiters spread."""
    return delay * random.uniform(0.5, 1.0), min(max(delay, POLL_FIRST) * 2, POLL_MAX)


def wait_for(try_acquire: Callable[[], Claim], timeout: float) -> Claim:
    """Call ``try_acquire`` until it returns other than :class:`Busy`, for at most
    ``timeout`` seconds in all (at least once); the last :class:`Busy` when time ran out."""
    deadline = time.monotonic() + max(0.0, timeout)
    delay = POLL_FIRST
    while True:
        claim = try_acquire()
        remaining = deadline - time.monotonic()
        if not isinstance(claim, Busy) or remaining <= 0:
            return claim
        pause, delay = next_poll(delay)
        time.sleep(min(remaining, pause))


def try_lock(tier: object, key: str, timeout: float) -> Claim:
    """One try at ``tier``'s build lock of ``key``: its ``try_acquire`` where it has one;
    else its ``acquire``, which may wait up to ``timeout`` (its None, busy or unavailable
    alike, reads as unavailable)."""
    try_acquire = getattr(tier, "try_acquire", None)
    if try_acquire is not None:
        claim: Claim = try_acquire(key)
        return claim
    release: Callable[[], None] | None = tier.acquire(key, timeout)  # type: ignore[attr-defined]
    return release


@runtime_checkable
class RemoteTier(Protocol):
    """What the cache needs from a shared tier (see docs/remote.md).

    Implementations handle their own failures: ``get`` returns None and ``put`` returns
    without raising when the remote is down, slow or returns garbage.
    """

    def get(self, key: str, ext: str) -> tuple[bytes, dict[str, Any]] | None: ...

    def put(self, key: str, ext: str, data: bytes, meta: Mapping[str, Any]) -> bool:
        """Send an entry; return whether it was stored. ``meta`` is the entry's metadata
        document as the cache holds it: a tier stores it as written (see
        :func:`kernelcache.remote.make_value`), never widened with its own covered fields."""
        ...

    def acquire(self, key: str, timeout: float) -> Callable[[], None] | None:
        """Take the job-wide build lock of ``key`` (one builder across machines).

        ``timeout`` is what is left of the caller's budget, which the cache gives to a whole
        call (many keys), not to each key: wait at most that long in all, and try at least
        once even when it is 0.

        Returns a function that releases it, or None if it could not be had within
        ``timeout`` seconds or the remote is unavailable (the caller then builds anyway).
        """
        ...


class TierClass(Protocol):
    """How the registry makes a tier of a URL scheme: a class (or a factory) called as
    ``cls(url, stats_root=..., signing_key=...)``, like :class:`kernelcache.remote.RedisTier`.

    ``url`` is the whole URL, secrets included (never show it: see
    :func:`kernelcache.remote.redact`); ``stats_root`` is the cache root whose counters
    (:func:`kernelcache.stats.count`) take the tier's errors, or None; with ``signing_key``,
    values are signed and only values signed with it are served (see
    :func:`kernelcache.remote.make_value` and :func:`kernelcache.remote.authenticate`).
    Construction does not connect; it raises :class:`kernelcache.ConfigError` for a URL or
    option the tier cannot use.
    """

    def __call__(
        self, url: str, *, stats_root: str | None = None, signing_key: bytes | None = None
    ) -> RemoteTier: ...
