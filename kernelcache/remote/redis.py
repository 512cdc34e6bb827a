"""The built-in remote tier: a Redis server (``redis://``, ``rediss://``, ``unix://``) or a
Redis Cluster (``redis+cluster://host:port,host:port``, ``rediss+cluster://``).

Invariants (docs/remote.md says more):

* Every value read is decoded and verified by :mod:`kernelcache.remote.codec` (and
  authenticated with a signing key); a bad value is a miss and is deleted, an unauthenticated
  one is a miss and is left in place. A value larger than ``max_size`` is refused before it is
  read (its length is asked first, in the same script), and no reply may exceed it.
* One builder per key across the job: the lock key is set only if absent, with an expiry
  (``SET NX PX``), and released only by the owner of its token; a lock without an expiry, or
  held longer than this client's ``lock_ttl``, is broken at once. On a cluster an entry and its
  lock share a slot (the key in a hash tag).
* The server never fails or stalls the caller: each call is bounded by ``timeout`` in total
  (plus ``connect_timeout`` when it connects), however slowly the server answers; nothing is
  retried within a call, and a failure or timeout opens a circuit breaker for ``breaker``
  seconds. Each kind of failure is warned about once per process.
* redis-py is optional, imported when a tier is used.
"""

from __future__ import annotations

import errno
import math
import os
import random
import socket
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from ..errors import ConfigError
from ..keys import check_key
from ..process import HOST
from .base import TierBase, logger
from .url import cluster_nodes, parse_url, redact, scrub, secrets_of

# -- scripts ----------------------------------------------------------------------------------
# They run atomically in Redis. In the lock scripts KEYS[1] is the lock, KEYS[2] the entry. A
# lock's value is "<its lock_ttl in ms>:<owner token>", so that its age is that ttl minus its PTTL.
_GET = """
local n = redis.call('strlen', KEYS[1])
if n > tonumber(ARGV[1]) then return n end
return redis.call('get', KEYS[1])
"""
_ACQUIRE = """
if redis.call('exists', KEYS[2]) == 1 then return 2 end
local ttl = tonumber(ARGV[2])
if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ttl) then return 1 end
local left = redis.call('pttl', KEYS[1])
local held = redis.pcall('get', KEYS[1])
local set_ttl = tonumber(string.match(type(held) == 'string' and held or '', '^(%d+):'))
local stale = left == -1
if not stale and left > 0 then
  if set_ttl then stale = set_ttl - left > ttl else stale = left > ttl end
end
if stale then
  redis.call('set', KEYS[1], ARGV[1], 'PX', ttl)
  return 3
end
return 0
"""
_RELEASE = """
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end
return 0
"""
_SCRIPTS = {"get": _GET, "acquire": _ACQUIRE, "release": _RELEASE}
_ACQUIRED, _READY, _BROKEN = 1, 2, 3
_POLL_FIRST, _POLL_MAX = 0.02, 0.5
#: the most bytes a reply other than a value may take (a cluster's slot map, a lock state)
_REPLY_LIMIT = 4 << 20


#: the most keys ``kernelcache stats --remote`` scans in one namespace
USAGE_SCAN_LIMIT = 100_000


def _strlens(client: Any, names: list[bytes]) -> list[int]:
    """The length of each value of ``names``, in one round trip."""
    pipe = client.pipeline(transaction=False)
    for name in names:
        pipe.strlen(name)
    return list(pipe.execute())


def _no_release() -> None:
    """Release function returned when the entry appeared while waiting: nothing is held."""


# -- a bound on every call, whatever the server does --------------------------------------------
class _Budget(threading.local):
    """What the current call of this thread may still spend: a deadline and reply bytes."""

    deadline: float | None = None
    left: int | None = None
    overrun = False


class _BoundedSocket:
    """A connected socket whose every read and write waits at most until the call's deadline
    and whose reads stop past the call's byte budget (redis-py's own timeout is per read)."""

    def __init__(self, sock: Any, budget: _Budget) -> None:
        self._sock = sock
        self._budget = budget
        self._timeout = sock.gettimeout()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)

    def settimeout(self, value: float | None) -> None:
        self._timeout = value
        self._sock.settimeout(value)

    def gettimeout(self) -> float | None:
        return self._timeout

    def _arm(self) -> None:
        deadline = self._budget.deadline
        if deadline is None:
            return
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the call's deadline passed")
        self._sock.settimeout(left if self._timeout is None else min(left, self._timeout))

    def _spend(self, n: int, flags: int) -> None:
        budget = self._budget
        if budget.left is None or flags & socket.MSG_PEEK:
            return
        budget.left -= n
        if budget.left < 0:
            budget.overrun = True
            raise OSError(errno.EMSGSIZE, "the reply is larger than max_size")

    def recv(self, size: int, flags: int = 0) -> bytes:
        self._arm()
        data = self._sock.recv(size, flags)
        self._spend(len(data), flags)
        return data

    def recv_into(self, buffer: Any, nbytes: int = 0, flags: int = 0) -> int:
        self._arm()
        n = self._sock.recv_into(buffer, nbytes, flags)
        self._spend(n, flags)
        return n

    def sendall(self, data: Any, flags: int = 0) -> None:
        self._arm()
        self._sock.sendall(data, flags)

    def send(self, data: Any, flags: int = 0) -> int:
        self._arm()
        return self._sock.send(data, flags)


def _bounded(base: Any, budget: _Budget, **baked: Any) -> type:
    """A subclass of the redis-py connection class ``base`` whose sockets obey ``budget``
    (``baked``: constructor arguments it always gets, e.g. TLS settings on a cluster)."""

    def __init__(self: Any, **kwargs: Any) -> None:
        base.__init__(self, **{**baked, **kwargs})

    def _connect(self: Any) -> _BoundedSocket:
        started = time.monotonic()
        sock = base._connect(self)
        if budget.deadline is not None:  # connecting is bounded by connect_timeout
            budget.deadline += time.monotonic() - started
        return _BoundedSocket(sock, budget)

    return type(f"Bounded{base.__name__}", (base,), {"__init__": __init__, "_connect": _connect})


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
        self._budget = _Budget()
        self._address = address
        self._client_lock = threading.Lock()
        self._client_obj: Any = None
        self._scripts: dict[str, Any] = {}
        if not self.cluster:
            self._client_obj = self._make_client()  # checks the options; does not connect

    def _make_client(self) -> Any:
        """The redis-py client, its connections bounded by :class:`_Budget`. A cluster client
        connects as it is made (it reads the slot map), so it is made at the first call."""
        import redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        opts = self.options
        common: dict[str, Any] = {
            "socket_timeout": opts.timeout,
            "socket_connect_timeout": opts.connect_timeout or opts.timeout,
            "retry": Retry(NoBackoff(), 0),
            "health_check_interval": 0,
        }
        try:
            if not self.cluster:
                scheme = self._address.split("://", 1)[0]
                base = {"rediss": redis.SSLConnection, "unix": redis.UnixDomainSocketConnection}
                cls = _bounded(base.get(scheme, redis.Connection), self._budget)
                return redis.Redis.from_url(
                    self._address, connection_class=cls, **common, **opts.client
                )
            from redis.cluster import ClusterNode, RedisCluster

            nodes = cluster_nodes(self._address)
            tls = self._address.startswith("rediss")
            base_cls = redis.SSLConnection if tls else redis.Connection
            cls = _bounded(base_cls, self._budget, **(opts.client if tls else {}))
            userinfo = self._address.split("://", 1)[1].rpartition("@")
            auth = f"{userinfo[0]}@" if userinfo[1] else ""
            host, port = nodes[0]
            host = f"[{host}]" if ":" in host else host
            return RedisCluster(
                url=f"redis://{auth}{host}:{port}/0",  # TLS comes from the connection class
                startup_nodes=[ClusterNode(h, p) for h, p in nodes[1:]],
                connection_class=cls,
                require_full_coverage=False,
                **common,
            )
        except (ValueError, TypeError) as e:
            raise ConfigError(f"remote URL {self.url!r}: {scrub(str(e), self._secrets)}") from None

    @property
    def _client(self) -> Any:
        with self._client_lock:
            if self._client_obj is None:
                if self._budget.deadline is not None:  # making it connects (a cluster)
                    self._budget.deadline += self.options.connect_timeout or self.options.timeout
                self._client_obj = self._make_client()
            return self._client_obj

    def _run(self, client: Any, script: str, keys: list[str], args: list[Any]) -> Any:
        """Run one of the tier's scripts (``get``, ``acquire``, ``release``) on ``client``
        (EVALSHA, loading it where the server lacks it)."""
        found = self._scripts.get(script)
        if found is None or found.registered_client is not client:
            found = self._scripts[script] = client.register_script(_SCRIPTS[script])
        return found(keys=keys, args=args)

    def close(self) -> None:
        """Close the connections (the tier reconnects if used again)."""
        with self._client_lock:
            if self._client_obj is not None:
                self._client_obj.close()
            if self.cluster:
                self._client_obj = None

    # -- failure policy -------------------------------------------------------------------
    def _failed(self, what: str, e: BaseException, overrun: bool) -> None:
        """Account for an exception from redis-py; open the breaker if the server is gone."""
        reason = scrub(f"{e.__class__.__name__}: {e}", self._secrets)
        errors = self._errors
        if isinstance(e, (errors.OutOfMemoryError, errors.ReadOnlyError)):
            self._refuse_writes(reason)
        elif isinstance(e, errors.ResponseError) and not isinstance(e, errors.ClusterError):
            self._bump(errors=1)
            self._warn("response", "remote cache %s: %s", self.url, reason)
        else:  # refused, lost, timed out, too long a reply, TLS or auth failure, garbage
            if overrun:
                self._bump(oversize=1)
            timeouts = (errors.TimeoutError, TimeoutError)
            timeout = isinstance(e, timeouts) or isinstance(e.__context__, timeouts)
            self._trip(what, reason, timeout=timeout)
            self._disconnect()

    def _disconnect(self) -> None:
        client = self._client_obj
        if client is None:
            return
        if self.cluster:
            for node in client.get_nodes():
                if node.redis_connection is not None:
                    node.redis_connection.connection_pool.disconnect(inuse_connections=False)
        else:
            client.connection_pool.disconnect(inuse_connections=False)

    def _call(
        self, what: str, fn: Callable[..., Any], *args: Any, limit: int = _REPLY_LIMIT, **kw: Any
    ) -> Any:
        """``(fn(*args, **kw), False)``, or ``(None, True)`` after a Redis, socket or protocol
        failure, which is accounted for (counters, breaker, one warning). The call may take
        ``timeout`` seconds in all (plus the time to connect) and read ``limit`` reply bytes."""
        result, error, overrun = self._attempt(fn, *args, limit=limit, **kw)
        if error is None:
            return result, False
        self._failed(what, error, overrun)
        return None, True

    def _attempt(
        self, fn: Callable[..., Any], *args: Any, limit: int = _REPLY_LIMIT, **kw: Any
    ) -> tuple[Any, Exception | None, bool]:
        """``(fn(client, *args, **kw), None, False)``, or ``(None, the failure, whether the
        reply ran past ``limit``)``, within the call's deadline and reply budget."""
        budget, errors = self._budget, self._errors
        budget.deadline = time.monotonic() + self.options.timeout
        budget.left, budget.overrun = limit, False
        try:
            return fn(self._client, *args, **kw), None, False
        except (errors.RedisError, errors.RedisClusterException, OSError, ValueError) as e:
            return None, e, budget.overrun
        finally:
            budget.deadline = budget.left = None

    def probe(self) -> str | None:
        """Whether the server answers a PING within the bounds of a call: None, or why not
        (nothing is counted or warned about)."""
        _, error, _ = self._attempt(lambda c: c.ping())
        return None if error is None else scrub(f"{type(error).__name__}: {error}", self._secrets)

    def usage(self, limit: int = USAGE_SCAN_LIMIT) -> dict[str, Any]:
        """This tier's entries and their bytes (``kernelcache stats --remote``), bounded for a
        big server: ``SCAN`` of the namespace's keys, 1,000 a call, and ``STRLEN`` of each in
        one pipeline a batch, stopping after ``limit`` keys (``complete`` false: at least that
        many); ``server_keys``: every key of the database, from ``DBSIZE`` (O(1)). A cluster
        is not scanned (its keys are spread over nodes): only None values. Never raises."""
        out: dict[str, Any] = {"entries": None, "bytes": None, "complete": False}
        if self.cluster:
            out["server_keys"] = None
            return out
        size, error, _ = self._attempt(lambda c: c.dbsize())
        out["server_keys"] = int(size) if error is None else None
        pattern = f"{self.options.prefix}*"
        cursor, entries, total = 0, 0, 0
        while True:
            found, error, _ = self._attempt(
                lambda c, at=cursor: c.scan(cursor=at, match=pattern, count=1000)
            )
            if error is not None:
                return out
            cursor, names = found
            names = [n for n in names if not n.endswith(b":lock")]
            if names:
                lengths, error, _ = self._attempt(_strlens, names)
                if error is not None:
                    return out
                entries += len(names)
                total += sum(int(n) for n in lengths)
            if int(cursor) == 0 or entries >= limit:
                break
        out.update(entries=entries, bytes=total, complete=int(cursor) == 0)
        return out

    # -- the RemoteTier interface ---------------------------------------------------------
    def name(self, key: str) -> str:
        """The Redis key of an entry (on a cluster, the key is a hash tag: its lock, the
        entry's name plus ``:lock``, is in the same slot)."""
        if self.cluster:
            return f"{self.options.prefix}{{{key}}}"
        return self.options.prefix + key

    def _fetch(self, key: str) -> tuple[bytes | int | None, bool]:
        limit = self.options.max_size
        # the value is at most max_size; the call may also connect (a cluster reads its slots)
        return self._call(
            "get", self._run, "get", [self.name(key)], [limit], limit=limit + _REPLY_LIMIT
        )

    def _discard(self, key: str) -> None:
        self._call("delete", lambda c: c.delete(self.name(key)))

    def _send(self, key: str, value: bytes, replace: bool) -> tuple[bool, bool]:
        """Store ``value`` under the entry's key if it has none (``SET NX``), or whatever it
        has with ``replace``."""
        ttl_ms = math.ceil(self.options.ttl * 1000) if self.options.ttl else None
        done, failed = self._call(
            "put", lambda c: c.set(self.name(key), value, px=ttl_ms, nx=not replace)
        )
        return bool(done) and not failed, failed

    def acquire(self, key: str, timeout: float) -> Callable[[], None] | None:
        """Take the job-wide build lock of ``key``, waiting at most ``timeout`` seconds: the
        caller's remaining budget (:class:`kernelcache.Cache` gives one budget to a whole
        ``get_or_create_many`` call, not one per key).

        Returns a function that releases the lock (only while this owner still holds it), or a
        function that does nothing when the entry appeared in Redis meanwhile (the caller's
        remote read then hits) or the tier is read-only, or None when the lock was not had in
        time or the server is unavailable (the caller then builds privately). The lock expires
        after ``lock_ttl`` if its owner dies.

        Raises:
            ValueError: malformed ``key``.
        """
        check_key(key)
        if self.read_only:
            return _no_release
        if not self._usable():
            return None
        lock = self.name(key) + ":lock"
        ttl_ms = str(max(1, math.ceil(self.options.lock_ttl * 1000)))
        token = f"{ttl_ms}:{HOST}:{os.getpid()}:{uuid.uuid4().hex}"
        deadline = time.monotonic() + max(0.0, timeout)
        delay = _POLL_FIRST
        while True:
            state, failed = self._call(
                "lock", self._run, "acquire", [lock, self.name(key)], [token, ttl_ms]
            )
            if failed:
                return None
            if state == _BROKEN:
                self._bump(locks=1, locks_broken=1)
                self._warn(
                    "lock-broken",
                    "broke the build lock of %s in %s: it had no expiry or was held longer "
                    "than lock_ttl=%gs (a crashed or foreign client); building",
                    key,
                    self.url,
                    self.options.lock_ttl,
                )
                return lambda: self._release(lock, token)
            if state == _ACQUIRED:
                self._bump(locks=1)
                return lambda: self._release(lock, token)
            if state == _READY:
                self._bump(lock_ready=1)
                return _no_release
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self._bump(lock_timeouts=1)
                return None
            time.sleep(min(remaining, delay * random.uniform(0.5, 1.0)))
            delay = min(delay * 2, _POLL_MAX)
            if not self._usable():
                return None

    def _release(self, lock: str, token: str) -> None:
        if time.monotonic() < self._down_until:
            return  # the lock expires by itself
        released, failed = self._call("unlock", self._run, "release", [lock], [token])
        if not failed and not released:
            self._bump(locks_lost=1)
            logger.debug("kernelcache: build lock %s had expired before its release", lock)
