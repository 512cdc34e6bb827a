"""The failure policy of a built-in tier (:class:`FailurePolicy`): its circuit breakers, the
windows in which its store refuses writes, its counters and one warning per kind of failure.
A tier (:class:`~.base.TierBase`) holds its policy as ``policy``, and gives it to what calls its
store for it (the Redis tier's :class:`~.redis.calls.RedisCalls`).

Failures are per shard: a tier's keys may live on several servers (a Redis Cluster's
primaries), and a shard that fails is skipped for ``breaker`` seconds while the others serve
(the shard ``""`` is the whole tier: a single server, a bucket, a cluster whose slot map cannot
be read), by every process of the cache root (:mod:`.breakers`). A store (or shard) that
refuses writes (full, read-only, no permission) is not written to for ``breaker`` seconds;
reads go on. Counters go to this process and to the stats logs of the root.

A request is let through by :meth:`FailurePolicy.admit` (the breakers, then the node's first
contact with the tier: :mod:`.contact`) and ends with :meth:`FailurePolicy.settle`; while it is
in flight, :meth:`FailurePolicy.opened` says whether it should be abandoned (its breaker opened,
here or in another process of the root). So once a request timed out, the tier's next put, lock,
renewal or release waits for nothing, in this process or any other of the node.

A request made for a lookup (:func:`~.tier.lookup`: one key of a ``get_or_create``) is charged
to it: the requests of one lookup spend at most ``lookup_s`` in the tier together (a request
is given what is left as its deadline, :attr:`~.contact.Ticket.until`, and stops there:
:class:`~.contact.LookupSpent`), then its other requests there are not made. That is no
failure of the tier: no breaker opens, nothing is carried to the next lookup, and the time a
request took is never judged on its own (a healthy tier serving large values, or setting up a
TLS connection, is asked as before).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable

from .. import stats
from ..process import warn_once
from .breakers import SharedBreakers
from .contact import Contact, Ticket
from .tier import current_lookup

#: the remote tiers' logger (:data:`.base.logger`)
logger = logging.getLogger("kernelcache.remote")


class FailurePolicy:
    """Whether a tier (or one of its shards) is asked now, what a failure of its store does,
    and the tier's counters and warnings. Thread-safe.

    Args:
        url: the tier's URL, redacted (what messages show).
        label: the tier's name in counters (its URL without the query string).
        stats_root: the cache root whose counters take the tier's errors, or None.
        breaker: seconds to skip the store (or one of its shards) after it failed.
        read_only: never write to the tier.
        here: whether the tier can be used in this process at all, asked first by
            :meth:`usable` (it counts and warns itself where not); None: always.
        bound: the longest one request to the store may take, in seconds (how long a first
            contact may last: :mod:`.contact`).
        lookup_s: what the requests of one lookup may take in the tier in all, in seconds
            (None: no bound but each request's own).
    """

    def __init__(
        self,
        url: str,
        label: str,
        *,
        stats_root: str | None,
        breaker: float,
        read_only: bool,
        here: Callable[[], bool] | None = None,
        bound: float = 5.0,
        lookup_s: float | None = None,
    ) -> None:
        self.url = url
        self.lookup_s = lookup_s
        self.label = label
        #: the root whose stats logs take the counters (a label of the URL where none)
        self.stats_root = stats_root or f"remote:{label}"
        self.breaker = breaker
        self.read_only = read_only
        self._here = here
        #: the breakers every process of the root shares (see :mod:`.breakers`)
        self._shared = SharedBreakers(stats_root, label)
        #: guards the counters, :attr:`down` and :attr:`full`
        self.lock = threading.Lock()
        #: shard ("" for the whole tier) -> monotonic time until which it is not asked
        self.down: dict[str, float] = {}
        #: shard -> monotonic time until which it is not written to
        self.full: dict[str, float] = {}
        self._counters: Counter[str] = Counter()
        #: the first contacts with the tier's shards (one process of the node at a time)
        self.contact = Contact(self._shared, bound, self.opened)

    @property
    def counters(self) -> dict[str, int]:
        """The tier's own counters in this process (gets, hits, errors, breaker_trips, ...)."""
        with self.lock:
            return dict(self._counters)

    def count(self, **deltas: int) -> None:
        """Count in this process, and in the stats logs of the root (per-tier counters)."""
        with self.lock:
            self._counters.update(deltas)
        stats.count_tier(self.stats_root, self.label, **deltas)

    def warn(self, topic: str, message: str, *args: object) -> None:
        """Warn once per process about ``topic`` of this tier."""
        warn_once(logger, (self.url, topic), "kernelcache: " + message, *args)

    def usable(self, shard: str = "") -> bool:
        """False while the circuit breaker of the tier, or of ``shard``, is open (it failed
        recently, in this process or in another one of its root: :mod:`.breakers`)."""
        if self._here is not None and not self._here():
            return False
        now = time.monotonic()
        if now < self.down.get("", 0.0) or (shard and now < self.down.get(shard, 0.0)):
            self.count(skipped=1)
            return False
        for which in ("", shard) if shard else ("",):
            until = self._shared.until(which, self.breaker)
            if until:
                with self.lock:
                    self.down[which] = now + (until - time.time())
                self.count(skipped=1)
                where = f"{self.url} (shard {which})" if which else self.url
                warn_once(
                    logger,
                    (self.url, "unavailable-shared", which),
                    "kernelcache: remote cache %s is skipped for %.0fs: another process of this "
                    "node found it unavailable",
                    where,
                    until - time.time(),
                )
                return False
        return True

    def opened(self, shard: str = "") -> bool:
        """Whether the breaker of the tier, or of ``shard``, is open now, here or in another
        process of the root; nothing is counted (asked while a request is in flight)."""
        now = time.monotonic()
        for which in ("", shard) if shard else ("",):
            if now < self.down.get(which, 0.0) or self._shared.until(which, self.breaker):
                return True
        return False

    def admit(self, shard: str = "") -> Ticket | None:
        """Whether to make one request of the tier (or ``shard``) now: None while its breaker is
        open, while another process of the node makes the first contact with it and this one
        may not wait for its answer (:mod:`.contact`), or once the lookup it serves has spent
        its time in the tier (each counted ``skipped``), else the request's ticket, to
        :meth:`settle` whatever happens (its ``until``: when its lookup's time runs out)."""
        started = time.monotonic()
        left = self.left()
        if left is not None and left <= 0:
            self.count(skipped=1)
            self.spent()
            return None
        if not self.usable(shard):
            return None
        ticket = self.contact.admit(shard)
        if ticket is None:
            self.count(skipped=1)
            return None
        if ticket.probe:
            self.count(probes=1)
        ticket.started = started
        ticket.until = None if left is None else started + left
        return ticket

    def settle(self, ticket: Ticket, answered: bool | None) -> None:
        """The request of ``ticket`` ended: the store answered it (True), failed it or it was
        abandoned (False), or it was not made or ended otherwise (None). Its time, from its
        admission, is charged to the lookup it served."""
        scope = current_lookup()
        if ticket.until is not None and scope is not None:
            took = time.monotonic() - ticket.started
            scope.spent[self] = scope.spent.get(self, 0.0) + took
        self.contact.settle(ticket, answered)

    def left(self) -> float | None:
        """Seconds the lookup this thread serves may still spend in the tier (None: it serves
        none, or the tier bounds requests one by one)."""
        scope = current_lookup()
        if scope is None or self.lookup_s is None:
            return None
        return self.lookup_s - scope.spent.get(self, 0.0)

    def spent(self) -> None:
        """The lookup this thread serves has spent its time in the tier: counted
        (``lookup_spent``) once per lookup, warned about once per process."""
        scope = current_lookup()
        if scope is None or self in scope.over:
            return
        scope.over.add(self)
        self.count(lookup_spent=1)
        self.warn(
            "lookup-spent",
            "remote cache %s: a lookup's requests took %gs there in all; its other requests "
            "there are not made (the tier is not skipped: the next lookup asks it again)",
            self.url,
            self.lookup_s,
        )

    def writable(self, shard: str = "") -> bool:
        """False for a read-only tier, and while the store (or ``shard``) refuses writes."""
        if self.read_only:
            return False
        now = time.monotonic()
        if now < self.full.get("", 0.0) or (shard and now < self.full.get(shard, 0.0)):
            self.count(skipped=1)
            return False
        return True

    def trip(self, what: str, reason: str, *, timeout: bool, shard: str = "") -> None:
        """The store, or its ``shard``, failed (down, hung, slow, garbage): skip it for
        ``breaker`` seconds; warn once per shard."""
        stats.count(self.stats_root, remote_errors=1)
        with self.lock:
            self.down[shard] = time.monotonic() + self.breaker
        self._shared.trip(shard, self.breaker)
        self.contact.lost(shard)
        self.count(errors=1, breaker_trips=1, timeouts=int(timeout))
        if not shard:
            self.warn(
                "unavailable",
                "remote cache %s unavailable during %s (%s); continuing with the local cache "
                "and not asking it again for %gs",
                self.url,
                what,
                reason,
                self.breaker,
            )
            return
        warn_once(
            logger,
            (self.url, "unavailable", shard),
            "kernelcache: remote cache %s: shard %s unavailable during %s (%s); the keys it "
            "holds are kept elsewhere meanwhile (the other shards still serve), and it is not "
            "asked again for %gs",
            self.url,
            shard,
            what,
            reason,
            self.breaker,
        )

    def refuse_writes(self, reason: str, shard: str = "") -> None:
        """The store (or ``shard``) refuses writes (full, read-only, no permission): reads go
        on."""
        stats.count(self.stats_root, remote_errors=1)
        with self.lock:
            self.full[shard] = time.monotonic() + self.breaker
        self.count(errors=1, full=1)
        where = f"{self.url} (shard {shard})" if shard else self.url
        self.warn(
            "full",
            "remote cache %s refuses writes (%s); not storing new entries there for %gs",
            where,
            reason,
            self.breaker,
        )
