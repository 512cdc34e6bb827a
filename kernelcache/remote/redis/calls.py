"""How the Redis tier calls Redis: the client of a server, or those of a cluster's primaries
(:mod:`.cluster`), each call routed to the one that serves its key, bounded, and its failure
accounted for.

Invariants:

* The server never fails or stalls the caller: each call is bounded by ``timeout`` in total
  (plus ``connect_timeout`` when it connects) and by its reply bytes (:mod:`.bounds`), however
  slowly the server answers; nothing is retried within a call (but a ``MOVED`` reply, followed
  once after the slot map is read again), and a failure or timeout opens the circuit breaker
  of the key's shard for ``breaker`` seconds. Each kind of failure is warned about once per
  process; no message shows a secret of the URL.
* A server that is full or read-only refuses writes for ``breaker`` seconds; reads go on.
* Scripts are loaded where they run (``EVALSHA``, else ``EVAL``), never on every primary.
* redis-py is optional, imported when a tier is made; construction does not connect.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from ...errors import ConfigError
from ..base import TierBase
from ..url import parse_url, redact, scrub, secrets_of
from .bounds import Budget
from .clients import server_client
from .cluster import Cluster
from .scripts import REPLY_LIMIT, SCRIPTS, SHAS


class RedisCalls(TierBase):
    """The calls of a :class:`~kernelcache.remote.redis.RedisTier` to its server or cluster
    (see the module docstring); the tier names its entries (:meth:`name`)."""

    def __init__(
        self,
        url: str,
        *,
        stats_root: str | None = None,
        signing_key: bytes | None = None,
        overwrite: bool = False,
    ) -> None:
        """See :class:`~kernelcache.remote.redis.RedisTier`.

        Raises:
            ConfigError: bad URL or options, or redis-py is not installed.
        """
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

    def name(self, key: str) -> str:
        """The Redis key of the entry ``key`` (the tier's)."""
        raise NotImplementedError
