"""A Redis Cluster as one Redis tier sees it: its slot map, the clients of its primaries, and
where the entries of a group go while the shard of their slot is down.

Invariants:

* A call for a key goes to the primary that serves the key's slot, and to no other: redis-py's
  cluster client is used for the slot map only. The map is read at the first call, from the
  first node that answers (the URL's nodes and the primaries known, in a random order, those
  known down last), within one connect and one call per node, asking no more nodes than the
  URL names or :data:`READ_NODES` (the primaries are the server's word: a map naming thousands
  of silent ones costs a read no more); a failure to read it again keeps the map it had.
* The map is read again when a shard's breaker closes (a failover may have moved its slots),
  and at most every :data:`FAILOVER_POLL` seconds while it is open or ``MOVED`` replies come.
* While a shard is down its groups move to their first fallback slot whose shard is up
  (:func:`.names.fallback_names`), and a miss at home is looked up once more in the group's
  spare (:func:`.names.spare_name`): every node's processes compute the same names.
* The breakers are the tier's failure policy's (shard -> the monotonic time until which it is
  not asked), shared with it under its lock; a closed breaker found here is removed.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from typing import Any

from ..base import logger
from ..url import RemoteOptions, cluster_nodes
from .bounds import Budget
from .clients import node_client
from .names import entry_name, fallback_names, first_slot_map, spare_name
from .scripts import REPLY_LIMIT, UNSERVED, serving

#: while a cluster's shard is down, how often its slot map is read again (a replica that took
#: its slots over serves them from then on)
FAILOVER_POLL = 0.5
#: the most nodes one read of the slot map asks, where the URL names fewer
READ_NODES = 3


class Cluster:
    """The slot map and the primaries of one tier's Redis Cluster (see the module docstring).

    Args:
        address: the cluster's address, as :func:`~kernelcache.remote.url.parse_url` gives it.
        options: the tier's options.
        budget: the tier's per-call bound on time and reply bytes.
        errors: redis-py's exceptions module.
        url: the tier's redacted URL (what messages show).
        down: the tier's breakers (its :class:`~kernelcache.remote.policy.FailurePolicy`'s),
            shard -> monotonic time until which it is not asked.
        lock: the lock under which ``down`` changes (the policy's).
    """

    def __init__(
        self,
        address: str,
        options: RemoteOptions,
        budget: Budget,
        errors: Any,
        url: str,
        down: dict[str, float],
        lock: threading.Lock,
    ) -> None:
        self._address = address
        self._options = options
        self._budget = budget
        self._errors = errors
        self._url = url
        self._down = down
        self._down_lock = lock
        self._lock = threading.Lock()
        #: the slot map: sorted (first slot, last slot, primary), read at the first call
        self.slots: list[tuple[int, int, str]] | None = None
        #: the primaries by "host:port": their clients
        self._primaries: dict[str, Any] = {}
        #: when the slot map may be read again while a shard is down (see :meth:`shard_down`)
        self._next_refresh = 0.0

    def primary(self, name: str) -> Any:
        """The client of the node ``name`` ("host:port"), made once (it connects at its first
        command)."""
        with self._lock:
            client = self._primaries.get(name)
            if client is None:
                client = node_client(self._address, name, self._options, self._budget)
                self._primaries[name] = client
            return client

    def primaries(self) -> list[str]:
        """The primaries the slot map names ("host:port"), sorted; none before it is read."""
        return sorted({name for _, _, name in self.slots or ()})

    def _read(self) -> list[tuple[int, int, str]]:
        """The slot map (``CLUSTER SLOTS``) from the first node that answers, the nodes of
        the URL and the primaries known tried in a random order (those known down last), as
        many as the URL names or :data:`READ_NODES`, within one connect and one call each.

        Raises:
            what redis-py raises when no node answers (the last failure).
        """
        given = {f"{host}:{port}" for host, port in cluster_nodes(self._address)}
        names = given | set(self._primaries)
        now = time.monotonic()
        order = random.sample(sorted(names), len(names))
        order.sort(key=lambda name: now < self._down.get(name, 0.0))  # those known down last
        del order[max(len(given), READ_NODES) :]
        opts, budget = self._options, self._budget
        per_node = (opts.connect_timeout or opts.timeout) + opts.timeout
        budget.deadline = time.monotonic() + per_node * len(order)

        def ask(name: str) -> Any:
            budget.left = REPLY_LIMIT
            return self.primary(name).execute_command("CLUSTER SLOTS")

        try:
            return first_slot_map(order, ask, self._errors)
        finally:
            budget.deadline = budget.left = None

    def route(self, name: Callable[[], str] | None) -> tuple[Any, str]:
        """``(the client of the primary that serves the slot of the Redis key name(), that
        primary's host:port)``; for ``name`` None, any primary; ``(None, UNSERVED)`` for a
        slot the map gives no primary (a failed one may be left out). The slot map is read at
        the first call (``name()`` may read it again, as :meth:`shard_down` says).

        Raises:
            what redis-py raises, or ValueError, when the slot map cannot be read.
        """
        slots = self.slots
        if slots is None:
            slots = self._read()
            with self._lock:
                self.slots = slots
        if name is None:
            return self.primary(slots[0][2]), slots[0][2]
        shard = serving(self.slots or slots, name())
        return (None if shard == UNSERVED else self.primary(shard)), shard

    def refresh(self) -> None:
        """Read the slot map again (after a ``MOVED`` reply), unless it was read in the last
        :data:`FAILOVER_POLL` seconds; a failure keeps the map it had."""
        now = time.monotonic()
        if now < self._next_refresh:
            return
        self._next_refresh = now + FAILOVER_POLL
        self._reread()

    def _reread(self) -> None:
        try:
            slots = self._read()
        except (self._errors.RedisError, OSError) as e:
            logger.debug("kernelcache: %s: slot map not read again: %r", self._url, e)
            return
        with self._lock:
            self.slots = slots

    def name(self, prefix: str, key: str) -> str:
        """The Redis key of the entry ``key`` (:func:`.names.entry_name`), or, while the shard
        of its slot is down, its group's first fallback whose shard is up."""
        home = entry_name(prefix, key, True)
        if self.slots is None or not self.shard_down(home):
            return home
        fallback = fallback_names(prefix, key)
        return next((n for n in fallback if not self.shard_down(n, refresh=False)), home)

    def shard_down(self, name: str, *, refresh: bool = True) -> bool:
        """Whether the shard that serves the Redis key ``name`` is known down (its breaker
        is open). With ``refresh``, the slot map is read again when that breaker has
        closed, and at most every :data:`FAILOVER_POLL` seconds while it is open: a replica
        may have taken the shard's slots over."""
        slots = self.slots
        if not slots:
            return False
        shard = serving(slots, name)
        until = self._down.get(shard)
        if until is None:
            return False
        now = time.monotonic()
        if refresh and (now >= until or now >= self._next_refresh):
            if now >= until:
                with self._down_lock:
                    self._down.pop(shard, None)
            self._next_refresh = now + FAILOVER_POLL
            self._reread()
            shard = serving(self.slots or slots, name)
            until = self._down.get(shard)
        return until is not None and time.monotonic() < until

    def spare(self, prefix: str, key: str, name: str) -> str | None:
        """:func:`.names.spare_name` of ``key`` when ``name`` is its home and the spare's
        shard is not known down, else None."""
        slots = self.slots
        if not slots or name != entry_name(prefix, key, True):
            return None
        spare = spare_name(prefix, key, lambda n: serving(slots, n))
        return None if spare is None or self.shard_down(spare, refresh=False) else spare

    def close(self) -> None:
        """Close the primaries' connections (they reconnect if used again)."""
        with self._lock:
            for client in self._primaries.values():
                client.close()
