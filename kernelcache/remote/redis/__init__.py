"""The built-in remote tier: a Redis server (``redis://``, ``rediss://``, ``unix://``) or a
Redis Cluster (``redis+cluster://host:port,host:port``, ``rediss+cluster://``).

Invariants (docs/remote.md says more):

* Every value read is decoded and verified by :mod:`kernelcache.remote.codec` (and
  authenticated with a signing key); a bad value is a miss and is deleted, an unauthenticated
  one is a miss and is left in place. A value larger than ``max_size`` is refused before it is
  read (its length is asked first, in the same script), and no reply may exceed it.
* One builder per key across the job: the lock key is set only if absent, with the expiry
  ``lease`` (``SET NX PX``) that its holder renews (``PEXPIRE``, by the owner of its token
  only), and released only by that owner; a lock without an expiry, or set longer ago than
  this client's ``lock_ttl``, is broken at once. On a cluster an entry and its lock share a
  slot (the key in a hash tag).
* The server never fails or stalls the caller: each call is bounded and its failure opens
  a circuit breaker (:mod:`.calls`: the tier holds its calls as :attr:`RedisTier.calls`, and
  every call it makes names the Redis key whose slot it touches).
* On a cluster, a call for a key goes to the primary that serves the key's slot, and to no
  other (:mod:`.cluster`: the slot map, failovers, fallbacks). A primary that fails (killed,
  stopped, refusing) opens the breaker of its shard alone; the keys of the other shards keep
  their reads, writes and locks.
* redis-py is optional, imported when a tier is used.
"""

from __future__ import annotations

import math
import os
import uuid
from collections.abc import Callable
from typing import Any

from ...process import HOST
from ..base import TierBase, logger
from ..leases import no_release
from ..tier import Busy, Claim
from ..url import parse_url, redact, secrets_of
from .calls import RedisCalls
from .names import count_entries, entry_name
from .scripts import ACQUIRED, BROKEN, READY, REPLY_LIMIT, holder_of, milliseconds

USAGE_SCAN_LIMIT = 100_000
#: how long counting the entries may take, in the tier's timeouts (a server that never ends
#: its scan is stopped there)
USAGE_SCAN_CALLS = 20


class RedisTier(TierBase):
    """The shared tier on a Redis server or a Redis Cluster (a
    :class:`kernelcache.remote.RemoteTier`, made as every :class:`kernelcache.remote.TierClass`
    is).

    Thread-safe; usable after ``fork`` (redis-py reconnects in the child). Construction does
    not connect: the first call does, bounded by ``connect_timeout``.

    Args:
        url: ``redis://``, ``rediss://``, ``unix://``, ``redis+cluster://`` or
            ``rediss+cluster://``, options in the query (docs/remote.md).
        stats_root: the cache root whose counters take this tier's errors (default: a
            label of the URL; they still show in :func:`kernelcache.process_stats`).
        signing_key: sign values with this key, and refuse values not signed with it (see
            docs/remote.md); None: values are neither signed nor authenticated.
        overwrite: replace values this process refused as unverifiable when it writes the
            same key (default: leave them for the jobs that can verify them).

    Raises:
        ConfigError: bad URL or options, or redis-py is not installed.
    """

    def __init__(
        self,
        url: str,
        *,
        stats_root: str | None = None,
        signing_key: bytes | None = None,
        overwrite: bool = False,
    ) -> None:
        address, options = parse_url(url)
        super().__init__(
            redact(url),
            stats_root=stats_root,
            signing_key=signing_key,
            breaker=options.breaker,
            max_size=options.max_size,
            read_only=options.read_only,
            lease=options.lease_s,
            lock_ttl=options.lock_ttl,
            overwrite=overwrite,
            bound=options.timeout + (options.connect_timeout or options.timeout),
            timeout=options.timeout,
        )
        #: the URL's options (docs/remote.md)
        self.options = options
        #: how the tier calls its server or cluster: each call routed to the primary that
        #: serves its Redis key, bounded, its failure accounted for by the tier's policy
        #: (:mod:`.calls`)
        self.calls = RedisCalls(address, options, secrets_of(url), self.policy)
        #: whether the tier is a Redis Cluster
        self.cluster = self.calls.cluster is not None

    def probe(self) -> str | None:
        """Whether the server answers a PING within the bounds of a call (on a cluster, every
        primary, each within those bounds): None, or why not (nothing is counted or warned
        about)."""
        return self.calls.probe()

    def close(self) -> None:
        """Close the connections (the tier reconnects if used again)."""
        self.calls.close()

    def usage(self, limit: int = USAGE_SCAN_LIMIT) -> dict[str, Any]:
        """This tier's entries and their bytes (``kernelcache stats --remote``), bounded for a
        big server: ``SCAN`` of the namespace's keys, 1,000 a call, and ``STRLEN`` of each in
        one pipeline a batch, stopping after ``limit`` keys or :data:`USAGE_SCAN_CALLS` times
        the tier's timeout (``complete`` false: at least that many); ``server_keys``: every
        key of the database, from ``DBSIZE`` (O(1)). A cluster is not scanned (its keys are
        spread over nodes): only None values. Never raises."""
        if self.cluster:
            return {"entries": None, "bytes": None, "complete": False, "server_keys": None}
        calls = self.calls
        client = calls.single
        size, error, _ = calls.attempt(client, lambda c: c.dbsize())
        out = count_entries(
            lambda fn, *args: calls.attempt(client, fn, *args),
            self.options.prefix,
            limit,
            USAGE_SCAN_CALLS * self.options.timeout,
        )
        out["server_keys"] = int(size) if error is None else None
        return out

    # -- the RemoteTier interface ---------------------------------------------------------
    def name(self, key: str) -> str:
        """The Redis key of an entry (on a cluster, the key's group is a hash tag: the entry,
        its lock, the entry's name plus ``:lock``, and the companions derived from its key
        share one slot). While the shard of that slot is down, the group's fallback on a shard
        that is up (:meth:`.cluster.Cluster.name`): so the processes of every node keep one
        builder per key, and read what it published, until the shard is back (or a replica
        took its slots over)."""
        cluster = self.calls.cluster
        if cluster is None:
            return entry_name(self.options.prefix, key, False)
        return cluster.name(self.options.prefix, key)

    def _fetch(self, key: str) -> tuple[bytes | int | None, bool]:
        """The entry at :meth:`name`; on a cluster, a miss at home is looked up once more in
        the group's spare (:meth:`.cluster.Cluster.spare`): what was published there while
        the home shard was down, before a replica took its slots over, is found and copied
        home."""
        name, (found, failed) = self._moving(key, lambda at: self._get(key, at))
        spare, cluster = None, self.calls.cluster
        if cluster is not None and found is None and not failed:
            spare = cluster.spare(self.options.prefix, key, name)
        if spare is None:
            return found, failed
        kept, _ = self._get(key, spare)
        if isinstance(kept, bytes):
            self._set(key, name, kept, replace=False)
            self.policy.count(fallback_hits=1)
            return kept, False
        return found, False

    def _get(self, key: str, name: str) -> tuple[bytes | int | None, bool]:
        limit = self.options.max_size
        # the value is at most max_size; the call may also connect (a cluster reads its slots)
        calls = self.calls
        return calls.call(
            "get", name, calls.eval, "get", [name], [limit], limit=limit + REPLY_LIMIT
        )

    def _discard(self, key: str) -> None:
        name = self.name(key)
        self.calls.call("delete", name, lambda c: c.delete(name))

    def _send(self, key: str, value: bytes, replace: bool) -> tuple[bool, bool]:
        """Store ``value`` under the entry's key if it has none (``SET NX``), or whatever it
        has with ``replace``."""
        return self._moving(key, lambda at: self._set(key, at, value, replace))[1]

    def _moving(self, key: str, call: Callable[[str], tuple[Any, bool]]) -> tuple[str, Any]:
        """``(name, call(name))`` at the entry's :meth:`name`; on a cluster, a call that failed
        because its shard is down (it opened the shard's breaker) is made once more where the
        group moved (its fallback), so a request that finds the shard down is not lost."""
        name = self.name(key)
        result = call(name)
        if result[1] and self.calls.cluster is not None:
            moved = self.name(key)
            if moved != name:
                return moved, call(moved)
        return name, result

    def _set(self, key: str, name: str, value: bytes, replace: bool) -> tuple[bool, bool]:
        ttl_ms = math.ceil(self.options.ttl * 1000) if self.options.ttl else None
        done, failed = self.calls.call(
            "put", name, lambda c: c.set(name, value, px=ttl_ms, nx=not replace), write=True
        )
        return bool(done) and not failed, failed

    def _try_lock(self, key: str) -> Claim:
        """One try at the build lock of ``key`` (see :meth:`TierBase.try_acquire`): taken and
        renewed every third of ``lease``; a lock without an expiry, or set longer ago than
        ``lock_ttl`` (a crashed or foreign client), is broken at once (one warning)."""
        lease = milliseconds(self.lease)
        token = f"{lease}:{HOST}:{os.getpid()}:{uuid.uuid4().hex}"
        limit = self.options.max_size
        args = [token, lease, milliseconds(self.options.lock_ttl), limit]
        calls = self.calls

        def acquire(at: str) -> tuple[Any, bool]:
            keys = [at + ":lock", at]
            return calls.call(
                "lock", at, calls.eval, "acquire", keys, args, limit=limit + REPLY_LIMIT
            )

        name, (reply, failed) = self._moving(key, acquire)
        if failed:
            return None
        lock = name + ":lock"
        state, held = int(reply[0]), reply[1]
        if state == READY:
            self.policy.count(lock_ready=1)
            if isinstance(held, bytes) and held:  # (the entry: what the next read takes)
                self._found(key, held)
            return no_release
        if state == BROKEN:
            self.policy.count(locks_broken=1)
            self.policy.warn(
                "lock-broken",
                "broke the build lock of %s in %s, held by %s: it had no expiry or was set "
                "longer ago than lock_ttl=%gs (a crashed or foreign client); building",
                key,
                self.url,
                holder_of(held),
                self.options.lock_ttl,
            )
        if state in (ACQUIRED, BROKEN):
            self.policy.count(locks=1)
            return self._holding(
                token,
                lambda seconds: self._renew(lock, token, seconds),
                lambda: self._release(lock, token),
            )
        return Busy(lock, holder_of(held), self.label)

    def _renew(self, lock: str, token: str, seconds: float) -> bool | None:
        calls = self.calls
        renewed, failed = calls.call(
            "renew", lock, calls.eval, "renew", [lock], [token, milliseconds(seconds)]
        )
        return None if failed else bool(renewed)

    def _release(self, lock: str, token: str) -> None:
        """Delete the lock if this owner still holds it; sent whatever failed before (on
        another shard, or a put), skipped only while the lock's own shard is known down (the
        lock then lapses within its lease)."""
        calls = self.calls
        released, failed = calls.call("unlock", lock, calls.eval, "release", [lock], [token])
        if not failed and not released:
            self.policy.count(locks_lost=1)
            logger.debug("kernelcache: build lock %s had expired before its release", lock)
