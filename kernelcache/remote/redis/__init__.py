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
* The server never fails or stalls the caller: each call is bounded by ``timeout`` in total
  (plus ``connect_timeout`` when it connects), however slowly the server answers; nothing is
  retried within a call, and a failure or timeout opens a circuit breaker for ``breaker``
  seconds. Each kind of failure is warned about once per process.
* On a cluster, a call for a key goes to the primary that serves the key's slot, and to no
  other (:mod:`.cluster`: the slot map, failovers, fallbacks). A primary that fails (killed,
  stopped, refusing) opens the breaker of its shard alone; the keys of the other shards keep
  their reads, writes and locks. Scripts are loaded where they run (``EVALSHA``, else
  ``EVAL``), never on every primary.
* redis-py is optional, imported when a tier is used.
"""

from __future__ import annotations

import math
import os
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from ...errors import ConfigError
from ...process import HOST
from ..base import TierBase, logger
from ..leases import no_release
from ..tier import Busy, Claim
from ..url import parse_url, redact, scrub, secrets_of
from .bounds import Budget
from .clients import server_client
from .cluster import Cluster
from .names import count_entries, entry_name
from .scripts import (
    ACQUIRED,
    BROKEN,
    READY,
    REPLY_LIMIT,
    SCRIPTS,
    SHAS,
    holder_of,
    milliseconds,
)

USAGE_SCAN_LIMIT = 100_000


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
        address, self.options = parse_url(url)
        opts = self.options
        super().__init__(
            redact(url),
            stats_root=stats_root,
            signing_key=signing_key,
            breaker=opts.breaker,
            max_size=opts.max_size,
            read_only=opts.read_only,
            lease=opts.lease_s,
            lock_ttl=opts.lock_ttl,
            overwrite=overwrite,
        )
        self._secrets = secrets_of(url)
        self.cluster = address.split("://", 1)[0].endswith("+cluster")
        try:
            import redis
        except ImportError:
            raise ConfigError(
                f"the remote tier {self.url!r} needs the redis client: "
                "pip install 'kernelcache[redis]'"
            ) from None
        self._errors = redis.exceptions
        self._budget = Budget()
        self._address = address
        self._client_lock = threading.Lock()
        #: a single server's client (made here: it checks the options, and does not connect)
        self._single: Any = None if self.cluster else self._make_client()
        #: a cluster's slot map and primaries
        self._cluster = (
            Cluster(address, opts, self._budget, self._errors, self.url, self._down, self._lock)
            if self.cluster
            else None
        )

    def _make_client(self) -> Any:
        """A single server's redis-py client (:func:`.clients.server_client`)."""
        try:
            return server_client(self._address, self.options, self._budget)
        except (ValueError, TypeError) as e:
            raise ConfigError(f"remote URL {self.url!r}: {scrub(str(e), self._secrets)}") from None

    def _route(self, key: str | None, name: str | None = None) -> tuple[Any, str]:
        """``(the client that serves key, its shard)``: the tier's client and "" on a single
        server; on a cluster, :meth:`.cluster.Cluster.route` of the key's Redis key (``name``,
        default: :meth:`name`; ``key`` None: any primary).

        Raises:
            what redis-py raises, or ValueError, when the slot map cannot be read.
        """
        if self._cluster is None:
            return self._single, ""
        if key is None:
            return self._cluster.route(None)
        return self._cluster.route(lambda: name or self.name(key))

    def _eval(self, client: Any, script: str, keys: list[str], args: list[Any]) -> Any:
        """Run one of the tier's scripts on ``client``, loading it there if it lacks it."""
        try:
            return client.evalsha(SHAS[script], len(keys), *keys, *args)
        except self._errors.NoScriptError:
            return client.eval(SCRIPTS[script], len(keys), *keys, *args)

    def close(self) -> None:
        """Close the connections (the tier reconnects if used again)."""
        with self._client_lock:
            if self._single is not None:
                self._single.close()
        if self._cluster is not None:
            self._cluster.close()

    # -- failure policy -------------------------------------------------------------------
    def _failed(self, what: str, e: BaseException, overrun: bool, shard: str, client: Any) -> None:
        """Account for an exception from redis-py; open the breaker of ``shard`` if its server
        is gone."""
        reason = scrub(f"{e.__class__.__name__}: {e}", self._secrets)
        errors = self._errors
        if isinstance(e, (errors.OutOfMemoryError, errors.ReadOnlyError)):
            self._refuse_writes(reason, shard)
        elif isinstance(e, errors.ResponseError) and not isinstance(e, errors.ClusterError):
            self._bump(errors=1)
            self._warn("response", "remote cache %s: %s", self.url, reason)
        else:  # refused, lost, timed out, too long a reply, TLS or auth failure, garbage
            if overrun:
                self._bump(oversize=1)
            timeouts = (errors.TimeoutError, TimeoutError)
            timeout = isinstance(e, timeouts) or isinstance(e.__context__, timeouts)
            self._trip(what, reason, timeout=timeout, shard=shard)
            if client is not None:
                client.connection_pool.disconnect(inuse_connections=False)

    def _call(
        self,
        what: str,
        key: str | None,
        fn: Callable[..., Any],
        *args: Any,
        limit: int = REPLY_LIMIT,
        write: bool = False,
        name: str | None = None,
    ) -> tuple[Any, bool]:
        """``(fn(client, *args), False)`` on the client that serves ``key`` (None: the tier's),
        or ``(None, True)`` after a Redis, socket or protocol failure, which is accounted for
        (counters, the breaker of the key's shard, one warning), or while that breaker is
        open (or, for a ``write``, while that shard refuses writes). The call may take
        ``timeout`` seconds in all (plus the time to connect) and read ``limit`` reply bytes.
        A ``MOVED`` reply reads the slot map again and is followed once. ``name``: the Redis
        key whose slot the call touches (default: the entry's, :meth:`name`)."""
        errors = self._errors
        client: Any = None
        shard, error, overrun = "", None, False
        for _ in range(2):
            try:
                client, shard = self._route(key, name)
            except (errors.RedisError, OSError, ValueError) as e:
                self._failed(what, e, False, "", None)  # no slot map: the whole tier
                return None, True
            if not self._usable(shard) or (write and not self._writable(shard)):
                return None, True
            if client is None:
                why = "the slot map gives no primary for the key's hash slot"
                self._trip(what, why, timeout=False, shard=shard)
                return None, True
            result, error, overrun = self._attempt(client, fn, *args, limit=limit)
            if error is None:
                return result, False
            if self._cluster is None or not isinstance(error, self._errors.MovedError):
                break
            self._cluster.refresh()
        assert error is not None
        self._failed(what, error, overrun, shard, client)
        return None, True

    def _attempt(
        self, client: Any, fn: Callable[..., Any], *args: Any, limit: int = REPLY_LIMIT
    ) -> tuple[Any, Exception | None, bool]:
        """``(fn(client, *args), None, False)``, or ``(None, the failure, whether the reply
        ran past ``limit``)``, within the call's deadline and reply budget."""
        budget, errors = self._budget, self._errors
        budget.deadline = time.monotonic() + self.options.timeout
        budget.left, budget.overrun = limit, False
        try:
            return fn(client, *args), None, False
        except (errors.RedisError, OSError, ValueError) as e:
            return None, e, budget.overrun
        finally:
            budget.deadline = budget.left = None

    def probe(self) -> str | None:
        """Whether the server answers a PING within the bounds of a call (on a cluster, every
        primary, each within those bounds): None, or why not (nothing is counted or warned
        about)."""
        try:
            client, _ = self._route(None)
        except (self._errors.RedisError, OSError, ValueError) as e:
            return self._shown(e)
        if self._cluster is None:
            error = self._attempt(client, lambda c: c.ping())[1]
            return None if error is None else self._shown(error)
        down = []
        for name in self._cluster.primaries():
            error = self._attempt(self._cluster.primary(name), lambda c: c.ping())[1]
            if error is not None:
                down.append(f"{name}: {self._shown(error)}")
        return "; ".join(down) or None

    def _shown(self, error: BaseException) -> str:
        return scrub(f"{type(error).__name__}: {error}", self._secrets)

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
