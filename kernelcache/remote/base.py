"""What the built-in tiers (Redis, Redis Cluster, object stores) share: the failure policy
(counters, the circuit breakers, the windows in which writes are refused, one warning per kind
of failure: :mod:`.policy`), the checks of every value read (decode, extension, signature) and
sent (encoding, ``max_size``), and the job-wide build locks (one try, waiting, and the leases
of the locks a process holds).

:class:`TierBase` holds the tier's :class:`~.policy.FailurePolicy` (failures are per shard:
see there) and its :class:`~.leases.Leases` (a build lock is a lease: :mod:`.leases`).

Writes never replace a value: the first complete writer wins, as in a root. In particular a
value this process refused because it cannot verify it (signed with another key, or unsigned,
while ``KERNELCACHE_SIGNING_KEY`` is set) is left in place for the jobs that can, counted
(``kept_unverified``) and warned about once; with ``overwrite`` (``KERNELCACHE_REMOTE_OVERWRITE=1``)
such a value is replaced by this job's signed one (``overwritten``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlsplit

from .. import stats
from ..keys import check_ext, check_key
from ..problem import Problem
from .codec import authenticate, decode_value, make_value
from .contact import off_path
from .leases import Leases, no_release
from .policy import FailurePolicy
from .tier import LOOKUP_TIMEOUTS, Busy, Claim, wait_for

#: the remote tiers' logger, whichever module logs (docs/remote.md names it)
logger = logging.getLogger("kernelcache.remote")
#: the most keys a tier remembers having refused as unverifiable
_MAX_UNVERIFIED = 4096


def tier_label(shown_url: str) -> str:
    """A tier's name in counters and warnings: its redacted URL without the query string."""
    return shown_url.split("?", 1)[0] if urlsplit(shown_url).scheme else shown_url


class TierBase:
    """The checks, accounting and build locks of a built-in tier, over its failure policy
    (:attr:`policy`): a tier subclasses it and gives it what its store does (``_fetch``,
    ``_send``, ``_try_lock``, ``_discard``).

    Args:
        shown: the tier's URL, redacted (what messages show).
        stats_root: the cache root whose counters take this tier's errors, or None.
        signing_key: sign values with it and refuse values not signed with it, or None.
        breaker: seconds to skip the store (or one of its shards) after it failed.
        max_size: the largest value sent or read, in bytes.
        read_only: never write to this tier (no puts, no backfill, no locks).
        lease: seconds a build lock lasts unless its holder renews it (every third of it).
        lock_ttl: the longest a holder renews a build lock, in seconds.
        overwrite: replace values this process refused as unverifiable when it writes the
            same key (default: leave them in place).
        here: whether the tier can be used in this process at all (see
            :class:`~.policy.FailurePolicy`); None: always.
        bound: the longest one request to the store may take, in seconds.
        timeout: the store's timeout, in seconds: the requests of one lookup may take
            :data:`~.tier.LOOKUP_TIMEOUTS` of it in all (:mod:`.policy`).
    """

    def __init__(
        self,
        shown: str,
        *,
        stats_root: str | None,
        signing_key: bytes | None,
        breaker: float,
        max_size: int,
        read_only: bool,
        lease: float,
        lock_ttl: float,
        overwrite: bool = False,
        here: Callable[[], bool] | None = None,
        bound: float = 5.0,
        timeout: float | None = None,
    ) -> None:
        self.url = shown
        self.label = tier_label(shown)
        self.read_only = read_only
        #: the breakers, write refusals, counters and warnings of the tier (:mod:`.policy`)
        self.policy = FailurePolicy(
            shown,
            self.label,
            stats_root=stats_root,
            breaker=breaker,
            read_only=read_only,
            here=here,
            bound=bound,
            lookup_s=None if timeout is None else LOOKUP_TIMEOUTS * timeout,
        )
        self._signing_key = signing_key
        self._max_size = max_size
        self.lease = lease
        self._lock = threading.Lock()
        #: the build locks this process holds in the tier, renewed as leases (:mod:`.leases`)
        self.leases = Leases(lease, lock_ttl, lambda: self.policy.count(locks_lost=1))
        self._overwrite = overwrite
        #: keys whose value this process refused as unverifiable, oldest first (bounded)
        self._unverified: dict[str, None] = {}
        #: per thread, the value of a key a lock's try found (:meth:`_found`)
        self._ready = threading.local()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"

    __str__ = __repr__

    @property
    def counters(self) -> dict[str, int]:
        """This tier's own counters in this process (gets, hits, errors, breaker_trips, ...)."""
        return self.policy.counters

    # -- values -----------------------------------------------------------------------------
    def _oversize(self, key: str, size: int) -> None:
        self.policy.count(oversize=1, misses=1)
        self.policy.warn(
            "oversize",
            "%s: entry %s is %d bytes, larger than max_size=%d; not sent or read",
            self.url,
            key,
            size,
            self._max_size,
        )

    def _encode(self, key: str, ext: str, data: bytes, meta: Mapping[str, Any]) -> bytes | None:
        """The value to store for an entry, or None if it is larger than ``max_size``."""
        value = make_value(key, ext, data, meta, self._signing_key)
        if len(value) > self._max_size:
            self._oversize(key, len(value))
            return None
        return value

    def _decode(self, key: str, ext: str, raw: object) -> tuple[bytes, dict[str, Any]] | None:
        """A value read for ``key``, verified (and authenticated with a signing key), or None:
        a corrupt or outdated value (see :func:`~kernelcache.schema.check_document`: an
        earlier format, or a field this process requires covered that it does not cover) is
        rejected (counted, warned, :meth:`_discard`-ed, so that this job's build replaces it),
        an unsigned one is refused and left in place, one of another extension is a miss."""
        found = decode_value(raw, key)  # type: ignore[arg-type]  # checked there
        if isinstance(found, Problem):
            stats.count(self.policy.stats_root, remote_errors=1)
            self.policy.count(misses=1, rejected=1)
            self.policy.warn(
                "rejected", "rejected a bad entry in %s (%s): %s", self.url, key, found.reason
            )
            self._discard(key)
            return None
        data, meta = found
        if meta["ext"] != ext:
            self.policy.count(misses=1)
            logger.debug("kernelcache: remote %s holds .%s, not .%s", key, meta["ext"], ext)
            return None
        if self._signing_key is not None:
            refused = authenticate(key, data, meta, self._signing_key)
            if refused is not None:
                stats.count(self.policy.stats_root, unauthenticated=1)
                self.policy.count(misses=1, unauthenticated=1)
                self._remember_unverified(key)
                self.policy.warn(
                    "unauthenticated",
                    "refused a value without a valid signature in %s (%s): %s "
                    "(KERNELCACHE_SIGNING_KEY is set: only values signed with it are used)",
                    self.url,
                    key,
                    refused.reason,
                )
                return None
        self.policy.count(hits=1, bytes_read=len(raw))  # type: ignore[arg-type]  # bytes here
        return data, meta

    def _remember_unverified(self, key: str) -> None:
        with self._lock:
            self._unverified[key] = None
            if len(self._unverified) > _MAX_UNVERIFIED:
                del self._unverified[next(iter(self._unverified))]

    def _discard(self, key: str) -> None:
        """Delete a corrupt value of ``key`` (a tier that cannot does nothing)."""

    # -- the RemoteTier interface, over what each store does ---------------------------------
    def _fetch(self, key: str) -> tuple[bytes | int | None, bool]:
        """``(the value of key, or its size when larger than max_size, or None when absent;
        whether the store failed)``; a failure is accounted for already."""
        raise NotImplementedError

    def _send(self, key: str, value: bytes, replace: bool) -> tuple[bool, bool]:
        """Store ``value`` if ``key`` has none (or, with ``replace``, whatever it has):
        ``(whether it was stored, whether the store failed)``; a failure is accounted for
        already."""
        raise NotImplementedError

    def get(self, key: str, ext: str) -> tuple[bytes, dict[str, Any]] | None:
        """The verified ``(data, metadata)`` of ``key``, or None (absent, bad, larger than
        ``max_size``, or unavailable). Never raises for a failure of the store; bounded by the
        tier's ``timeout``.

        Raises:
            ValueError: malformed ``key`` or ``ext``.
        """
        check_key(key)
        check_ext(ext)
        found = getattr(self._ready, "found", None)
        self._ready.found = None
        if found is not None and found[0] == key:
            self.policy.count(gets=1)
            return self._decode(key, ext, found[1])
        if not self.policy.usable():
            return None
        self.policy.count(gets=1)
        raw, failed = self._fetch(key)
        if failed or raw is None:
            self.policy.count(misses=1)
            return None
        if isinstance(raw, int):
            self._oversize(key, raw)
            return None
        return self._decode(key, ext, raw)

    def put(self, key: str, ext: str, data: bytes, meta: Mapping[str, Any]) -> bool:
        """Send an entry, unless it is larger than ``max_size``, the tier is read-only, the
        breaker is open or the store recently refused writes. Never raises for a failure of
        the store. Returns whether the entry was stored. ``meta``: the entry's document,
        kept as written, or the fields of a new entry (see :func:`~.codec.make_value`).

        Raises:
            ValueError: malformed ``key`` or ``ext``, or ``meta`` outside the schema (the
                local store rejects such entries first).
        """
        return self.put_outcome(key, ext, data, meta) is True

    def put_outcome(self, key: str, ext: str, data: bytes, meta: Mapping[str, Any]) -> bool | None:
        """:meth:`put`, telling what the tier holds after it: True (stored now), False (the
        tier held a value of the key already, one this process can use), None (nothing
        usable: not sent, failed, or a value this process cannot verify was kept)."""
        check_key(key)
        check_ext(ext)
        if not self.policy.writable() or not self.policy.usable():
            return None
        value = self._encode(key, ext, data, meta)
        if value is None:
            return None
        with self._lock:
            unverified = key in self._unverified
        stored, failed = self._send(key, value, self._overwrite and unverified)
        if failed:
            return None
        if not stored:
            if unverified:
                stats.count(self.policy.stats_root, kept_unverified=1)
                self.policy.count(kept_unverified=1)
                self.policy.warn(
                    "kept",
                    "left a value in %s that this job cannot verify in place (%s): jobs with "
                    "its signing key still use it; this job uses its own build. Give every job "
                    "the same KERNELCACHE_SIGNING_KEY, or set KERNELCACHE_REMOTE_OVERWRITE=1 "
                    "to replace such values",
                    self.url,
                    key,
                )
                return None
            self.policy.count(present=1)  # another writer was first
            return False
        if unverified:
            self.policy.count(overwritten=1)
            with self._lock:
                self._unverified.pop(key, None)
        self.policy.count(puts=1, bytes_written=len(value))
        return True

    # -- build locks --------------------------------------------------------------------------
    def _found(self, key: str, raw: bytes) -> None:
        """The value of ``key`` a try at its lock found (the entry is there): the next
        :meth:`get` of ``key`` in this thread reads it (checked as every value read is)
        without asking the store again, so that a waiter's last try is its read. Only the
        last one is kept."""
        self._ready.found = (key, raw)

    def _holding(
        self, token: str, renew: Callable[[float], bool | None], release: Callable[[], None]
    ) -> Callable[[], None]:
        """The release function of the lock ``token`` just taken, renewed meanwhile
        (:meth:`.leases.Leases.holding`). A release whose lookup has spent its time in the tier
        is sent from a thread of its own, off the job's path: the lock is given back all the
        same, and the lookup waits for nothing more there."""

        def ending() -> None:
            left = self.policy.left()
            if left is None or left > 0:
                release()
            else:
                self._off_path(release)

        return self.leases.holding(token, renew, ending)

    def _off_path(self, request: Callable[[], Any]) -> None:
        """Make ``request`` (a lock given back) from a thread of its own, off the job's path:
        bounded by the tier's own timeouts, not by the lookup's time."""

        def later() -> None:
            with off_path():
                request()

        threading.Thread(target=later, name="kernelcache-remote-release", daemon=True).start()

    def _try_lock(self, key: str) -> Claim:
        """One try at the build lock of ``key`` in the store (see :meth:`try_acquire`), the
        tier neither read-only nor known unavailable; a failure is accounted for already."""
        raise NotImplementedError

    def try_acquire(self, key: str) -> Claim:
        """One try at the job-wide build lock of ``key``, without waiting.

        Returns a function that releases the lock (renewed meanwhile: see
        :class:`~.leases.Leases`), a function that releases nothing when the entry is in the
        tier already (the caller's read then hits) or the tier is read-only, :class:`Busy`
        while another client holds it, or None when the tier (or the key's shard) is
        unavailable: the caller builds without it. Never raises for a failure of the store.

        Raises:
            ValueError: malformed ``key``.
        """
        check_key(key)
        if self.read_only:
            return no_release
        if not self.policy.usable():
            return None
        return self._try_lock(key)

    def acquire(self, key: str, timeout: float) -> Callable[[], None] | None:
        """Take the job-wide build lock of ``key``, waiting at most ``timeout`` seconds (the
        caller's remaining budget; tried once at 0): :meth:`try_acquire` until the lock is
        not busy. None when it was not had in time (counted: ``lock_timeouts``) or the tier is
        unavailable; the caller then builds without it.

        Raises:
            ValueError: malformed ``key``.
        """
        claim = wait_for(lambda: self.try_acquire(key), timeout)
        if isinstance(claim, Busy):
            self.policy.count(lock_timeouts=1)
            return None
        return claim
