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
  a circuit breaker (:mod:`.calls`).
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
from ..base import logger
from ..leases import no_release
from ..tier import Busy, Claim
from .calls import RedisCalls
from .names import count_entries, entry_name
from .scripts import ACQUIRED, BROKEN, READY, REPLY_LIMIT, holder_of, milliseconds

USAGE_SCAN_LIMIT = 100_000


class RedisTier(RedisCalls):
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

    def usage(self, limit: int = USAGE_SCAN_LIMIT) -> dict[str, Any]:
        """This tier's entries and their bytes (``kernelcache stats --remote``), bounded for a
        big server: ``SCAN`` of the namespace's keys, 1,000 a call, and ``STRLEN`` of each in
        one pipeline a batch, stopping after ``limit`` keys (``complete`` false: at least that
        many); ``server_keys``: every key of the database, from ``DBSIZE`` (O(1)). A cluster
        is not scanned (its keys are spread over nodes): only None values. Never raises."""
        if self.cluster:
            return {"entries": None, "bytes": None, "complete": False, "server_keys": None}
        client = self._single
        size, error, _ = self._attempt(client, lambda c: c.dbsize())
        out = count_entries(
            lambda fn, *args: self._attempt(client, fn, *args), self.options.prefix, limit
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
        if self._cluster is None:
            return entry_name(self.options.prefix, key, False)
        return self._cluster.name(self.options.prefix, key)

    def _fetch(self, key: str) -> tuple[bytes | int | None, bool]:
        """The entry at :meth:`name`; on a cluster, a miss at home is looked up once more in
        the group's spare (:meth:`.cluster.Cluster.spare`): what was published there while
        the home shard was down, before a replica took its slots over, is found and copied
        home."""
        name, (found, failed) = self._moving(key, lambda at: self._get(key, at))
        spare = None
        if self._cluster is not None and found is None and not failed:
            spare = self._cluster.spare(self.options.prefix, key, name)
        if spare is None:
            return found, failed
        kept, _ = self._get(key, spare)
        if isinstance(kept, bytes):
            self._set(key, name, kept, replace=False)
            self._bump(fallback_hits=1)
            return kept, False
        return found, False

    def _get(self, key: str, name: str) -> tuple[bytes | int | None, bool]:
        limit = self.options.max_size
        # the value is at most max_size; the call may also connect (a cluster reads its slots)
        return self._call(
            "get", key, self._eval, "get", [name], [limit], limit=limit + REPLY_LIMIT, name=name
        )

    def _discard(self, key: str) -> None:
        self._call("delete", key, lambda c: c.delete(self.name(key)))

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
        if result[1] and self._cluster is not None:
            moved = self.name(key)
            if moved != name:
                return moved, call(moved)
        return name, result

    def _set(self, key: str, name: str, value: bytes, replace: bool) -> tuple[bool, bool]:
        ttl_ms = math.ceil(self.options.ttl * 1000) if self.options.ttl else None
        done, failed = self._call(
            "put",
            key,
            lambda c: c.set(name, value, px=ttl_ms, nx=not replace),
            write=True,
            name=name,
        )
        return bool(done) and not failed, failed

    def _try_lock(self, key: str) -> Claim:
        """One try at the build lock of ``key`` (see :meth:`TierBase.try_acquire`): taken and
        renewed every third of ``lease``; a lock without an expiry, or set longer ago than
        ``lock_ttl`` (a crashed or foreign client), is broken at once (one warning)."""
        lease = milliseconds(self.lease)
        token = f"{lease}:{HOST}:{os.getpid()}:{uuid.uuid4().hex}"
        args = [token, lease, milliseconds(self.options.lock_ttl)]
        name, (reply, failed) = self._moving(
            key,
            lambda at: self._call(
                "lock", key, self._eval, "acquire", [at + ":lock", at], args, name=at
            ),
        )
        if failed:
            return None
        lock = name + ":lock"
        state, held = int(reply[0]), reply[1]
        if state == READY:
            self._bump(lock_ready=1)
            return no_release
        if state == BROKEN:
            self._bump(locks_broken=1)
            self._warn(
                "lock-broken",
                "broke the build lock of %s in %s, held by %s: it had no expiry or was set "
                "longer ago than lock_ttl=%gs (a crashed or foreign client); building",
                key,
                self.url,
                holder_of(held),
                self.options.lock_ttl,
            )
        if state in (ACQUIRED, BROKEN):
            self._bump(locks=1)
            return self._holding(
                token,
                lambda seconds: self._renew(key, lock, token, seconds),
                lambda: self._release(key, lock, token),
            )
        return Busy(lock, holder_of(held), self.label)

    def _renew(self, key: str, lock: str, token: str, seconds: float) -> bool | None:
        renewed, failed = self._call(
            "renew", key, self._eval, "renew", [lock], [token, milliseconds(seconds)], name=lock
        )
        return None if failed else bool(renewed)

    def _release(self, key: str, lock: str, token: str) -> None:
        """Delete the lock if this owner still holds it; sent whatever failed before (on
        another shard, or a put), skipped only while the lock's own shard is known down (the
        lock then lapses within its lease)."""
        released, failed = self._call(
            "unlock", key, self._eval, "release", [lock], [token], name=lock
        )
        if not failed and not released:
            self._bump(locks_lost=1)
            logger.debug("kernelcache: build lock %s had expired before its release", lock)
