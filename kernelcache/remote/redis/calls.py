"""How the Redis tier calls Redis: the client of a server, or those of a cluster's primaries
(:mod:`.cluster`), each call routed to the one that serves its Redis key, bounded, and its
failure accounted for by the tier's failure policy (its breakers, counters and warnings:
:class:`~kernelcache.remote.policy.FailurePolicy`). A :class:`~kernelcache.remote.redis.RedisTier`
holds one :class:`RedisCalls` (its ``calls``), made with its policy, and names the Redis key of
every call it makes.

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

import functools
import threading
import time
from collections.abc import Callable
from typing import Any

from ...errors import ConfigError
from ...optional import needs
from ..contact import Abandoned, LookupSpent
from ..policy import FailurePolicy
from ..url import RemoteOptions, scrub
from .bounds import Budget
from .clients import server_client
from .cluster import Cluster
from .scripts import REPLY_LIMIT, SCRIPTS, SHAS

#: how long probing a cluster's primaries may take, in calls (a slot map may name thousands)
PROBE_CALLS = 8


class RedisCalls:
    """The calls of one :class:`~kernelcache.remote.redis.RedisTier` to its server or cluster
    (see the module docstring).

    Args:
        address: the server's or cluster's address, as
            :func:`~kernelcache.remote.url.parse_url` gives it.
        options: the tier's options.
        secrets: the secrets of the tier's URL (:func:`~kernelcache.remote.url.secrets_of`),
            never shown in a message.
        policy: the tier's failure policy, which takes each call's failure (the breakers of
            its shards, shared with :class:`.cluster.Cluster`; its counters and warnings).

    Raises:
        ConfigError: bad options, or redis-py is not installed.
    """

    def __init__(
        self, address: str, options: RemoteOptions, secrets: list[str], policy: FailurePolicy
    ) -> None:
        self.options = options
        self._policy = policy
        self._secrets = secrets
        try:
            import redis
        except ImportError:
            raise ConfigError(needs(f"the remote tier {policy.url!r}", "redis")) from None
        self._errors = redis.exceptions
        self._budget = Budget()
        self._address = address
        self._client_lock = threading.Lock()
        cluster = address.split("://", 1)[0].endswith("+cluster")
        #: a single server's client (made here: it checks the options, and does not connect);
        #: None on a cluster
        self.single: Any = None if cluster else self._make_client()
        #: a cluster's slot map and primaries; None on a single server
        self.cluster = (
            Cluster(
                address, options, self._budget, self._errors, policy.url, policy.down, policy.lock
            )
            if cluster
            else None
        )

    def _make_client(self) -> Any:
        """A single server's redis-py client (:func:`.clients.server_client`)."""
        try:
            return server_client(self._address, self.options, self._budget)
        except (ValueError, TypeError) as e:
            url = self._policy.url
            raise ConfigError(f"remote URL {url!r}: {scrub(str(e), self._secrets)}") from None

    def _route(self, name: str | None) -> tuple[Any, str]:
        """``(the client that serves the Redis key name, its shard)``: the server's client and
        "" on a single server; on a cluster, :meth:`.cluster.Cluster.route` of ``name`` (None:
        any primary).

        Raises:
            what redis-py raises, or ValueError, when the slot map cannot be read.
        """
        cluster = self.cluster
        if cluster is None:
            return self.single, ""
        return cluster.route(None if name is None else lambda: name)

    def eval(self, client: Any, script: str, keys: list[str], args: list[Any]) -> Any:
        """Run one of the tier's scripts on ``client``, loading it there if it lacks it."""
        try:
            return client.evalsha(SHAS[script], len(keys), *keys, *args)
        except self._errors.NoScriptError:
            return client.eval(SCRIPTS[script], len(keys), *keys, *args)

    def close(self) -> None:
        """Close the connections (the tier reconnects if used again)."""
        with self._client_lock:
            if self.single is not None:
                self.single.close()
        if self.cluster is not None:
            self.cluster.close()

    def _failed(self, what: str, e: BaseException, overrun: bool, shard: str, client: Any) -> bool:
        """Account for an exception from redis-py; open the breaker of ``shard`` if its server
        is gone. Whether the server answered (an error reply)."""
        reason = scrub(f"{e.__class__.__name__}: {e}", self._secrets)
        errors, policy = self._errors, self._policy
        if isinstance(e, (errors.OutOfMemoryError, errors.ReadOnlyError)):
            policy.refuse_writes(reason, shard)
            return True
        if isinstance(e, errors.ResponseError) and not isinstance(e, errors.ClusterError):
            policy.count(errors=1)
            policy.warn("response", "remote cache %s: %s", policy.url, reason)
            return True
        if isinstance(e, Abandoned):  # its breaker opened while it was in flight
            policy.count(abandoned=1)
        else:  # refused, lost, timed out, too long a reply, TLS or auth failure, garbage
            if overrun:
                policy.count(oversize=1)
            timeouts = (errors.TimeoutError, TimeoutError)
            timeout = isinstance(e, timeouts) or isinstance(e.__context__, timeouts)
            policy.trip(what, reason, timeout=timeout, shard=shard)
        if client is not None:
            client.connection_pool.disconnect(inuse_connections=False)
        return False

    def call(
        self,
        what: str,
        name: str,
        fn: Callable[..., Any],
        *args: Any,
        limit: int = REPLY_LIMIT,
        write: bool = False,
    ) -> tuple[Any, bool]:
        """``(fn(client, *args), False)`` on the client that serves the Redis key ``name`` (the
        key whose slot the call touches), or ``(None, True)`` after a Redis, socket or protocol
        failure, which is accounted for (counters, the breaker of the key's shard, one
        warning), or while that breaker is open (or, for a ``write``, while that shard refuses
        writes). The call may take ``timeout`` seconds in all (plus the time to connect) and
        read ``limit`` reply bytes. A ``MOVED`` reply reads the slot map again and is followed
        once. ``what``: the operation, as warnings name it. The call is admitted by the
        policy first (the breakers, read before every call, and the node's first contact with
        the shard: :meth:`FailurePolicy.admit`), and abandoned, ``(None, True)``, as soon as
        its shard's breaker opens while it waits for the reply."""
        errors, policy, cluster = self._errors, self._policy, self.cluster
        for tries in (1, 2):
            try:
                client, shard = self._route(name)
            except (errors.RedisError, OSError, ValueError) as e:
                self._failed(what, e, False, "", None)  # no slot map: the whole tier
                return None, True
            if write and not policy.writable(shard):
                return None, True
            ticket = policy.admit(shard)
            if ticket is None:
                return None, True
            answered: bool | None = None
            try:
                if client is None:
                    why = "the slot map gives no primary for the key's hash slot"
                    policy.trip(what, why, timeout=False, shard=shard)
                    return None, True
                result, error, overrun = self.attempt(
                    client,
                    fn,
                    *args,
                    limit=limit,
                    abandon=functools.partial(policy.opened, shard),
                    until=ticket.until,
                )
                if isinstance(error, LookupSpent):  # (not a failure of the server)
                    policy.spent()
                    client.connection_pool.disconnect(inuse_connections=False)
                    return None, True
                answered = error is None or isinstance(error, errors.ResponseError)
                if error is None:
                    return result, False
                if tries == 2 or cluster is None or not isinstance(error, errors.MovedError):
                    answered = self._failed(what, error, overrun, shard, client)
                    return None, True
            finally:
                policy.settle(ticket, answered)
            cluster.refresh()
        raise AssertionError("unreachable: the second try returns")

    def attempt(
        self,
        client: Any,
        fn: Callable[..., Any],
        *args: Any,
        limit: int = REPLY_LIMIT,
        abandon: Callable[[], bool] | None = None,
        until: float | None = None,
    ) -> tuple[Any, Exception | None, bool]:
        """``(fn(client, *args), None, False)``, or ``(None, the failure, whether the reply
        ran past ``limit``)``, within the call's deadline and reply budget; nothing is
        counted or warned about. With ``abandon``, a wait for the reply stops as soon as it
        says so (the failure is then :class:`~kernelcache.remote.contact.Abandoned`). With
        ``until`` (when the lookup the call serves runs out of time in the tier), the call
        stops there if that comes before its own deadline
        (:class:`~kernelcache.remote.contact.LookupSpent`).

        Whatever the call raises is its failure: besides redis-py's errors, a reply the server
        shaped to break redis-py's parser or the script's reader (nested past the recursion
        limit, an integer where a list is read) raises what Python raises then."""
        budget = self._budget
        own = time.monotonic() + self.options.timeout
        cut = until is not None and until < own
        budget.deadline = until if cut else own
        budget.left, budget.overrun = limit, False
        budget.abandon, budget.abandoned = abandon, False
        try:
            return fn(client, *args), None, False
        except Exception as e:  # (the server chose the reply: see above)
            if budget.abandoned:
                return None, Abandoned(f"abandoned: {e}"), False
            timeouts = (self._errors.TimeoutError, TimeoutError)
            if cut and (isinstance(e, timeouts) or isinstance(e.__context__, timeouts)):
                return None, LookupSpent(f"the lookup spent its time in the tier: {e}"), False
            return None, e, budget.overrun
        finally:
            budget.deadline = budget.left = budget.abandon = None

    def probe(self) -> str | None:
        """Whether the server answers a PING within the bounds of a call (on a cluster, every
        primary, each within those bounds, all within :data:`PROBE_CALLS` calls' time: the
        primaries not asked by then are named as such): None, or why not (nothing is
        counted or warned about)."""
        try:
            client, _ = self._route(None)
        except (self._errors.RedisError, OSError, ValueError) as e:
            return self._shown(e)
        cluster = self.cluster
        if cluster is None:
            error = self.attempt(client, lambda c: c.ping())[1]
            return None if error is None else self._shown(error)
        down, opts = [], self.options
        names = cluster.primaries()
        until = time.monotonic() + PROBE_CALLS * ((opts.connect_timeout or 0) + opts.timeout)
        for asked, name in enumerate(names):
            if time.monotonic() >= until:
                down.append(f"{len(names) - asked} of {len(names)} primaries not asked in time")
                break
            error = self.attempt(cluster.primary(name), lambda c: c.ping())[1]
            if error is not None:
                down.append(f"{name}: {self._shown(error)}")
        return "; ".join(down) or None

    def _shown(self, error: BaseException) -> str:
        return scrub(f"{type(error).__name__}: {error}", self._secrets)
