"""The built-in remote tier: a Redis server (``redis://``, ``rediss://``, ``unix://``).

Invariants (docs/remote.md says more):

* Every value read is decoded and verified by :mod:`kernelcache.remote.codec` (and
  authenticated with a signing key); a bad value is a miss and is deleted, an unauthenticated
  one is a miss and is left in place.
* One builder per key across the job: the lock key is set only if absent, with an expiry
  (``SET NX PX``), and released only by the owner of its token; a lock without an expiry, or
  held longer than this client's ``lock_ttl``, is broken at once.
* The server never fails or stalls the caller: each socket operation is bounded by
  ``timeout``, nothing is retried within a call, and a connection failure opens a circuit
  breaker for ``breaker`` seconds. Each kind of failure is warned about once per process.
* redis-py is optional, imported when a tier is made.
"""

from __future__ import annotations

import logging
import math
import os
import random
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

from .. import stats
from ..errors import ConfigError, Problem
from ..keys import check_ext, check_key
from ..process import HOST, warn_once
from .codec import authenticate, decode_value, make_value
from .url import parse_url, redact, scrub, secrets_of

#: the remote tier's logger, whichever module logs (docs/remote.md names it)
logger = logging.getLogger("kernelcache.remote")


# -- the tier -------------------------------------------------------------------------------
# Both scripts run atomically in Redis. KEYS[1] is the lock, KEYS[2] the entry. A lock's value
# is "<its lock_ttl in ms>:<owner token>", so that its age is that ttl minus its PTTL.
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
_ACQUIRED, _READY, _BROKEN = 1, 2, 3
_POLL_FIRST, _POLL_MAX = 0.02, 0.5


def _no_release() -> None:
    """Release function returned when the entry appeared while waiting: nothing is held."""


class RedisTier:
    """The shared tier on a Redis server (a :class:`kernelcache.remote.RemoteTier`, made as
    every :class:`kernelcache.remote.TierClass` is).

    Thread-safe; usable after ``fork`` (redis-py reconnects in the child). Construction does
    not connect: the first call does, bounded by ``connect_timeout``.

    Args:
        url: ``redis://``, ``rediss://`` or ``unix://``, options in the query (docs/remote.md).
        stats_root: the cache root whose counters take this tier's errors (default: a
            label of the URL; they still show in :func:`kernelcache.process_stats`).
        signing_key: sign values with this key, and refuse values not signed with it (see
            docs/remote.md); None: values are neither signed nor authenticated.

    Raises:
        ConfigError: bad URL or options, or redis-py is not installed.
    """

    def __init__(
        self, url: str, *, stats_root: str | None = None, signing_key: bytes | None = None
    ) -> None:
        self._signing_key = signing_key
        self.url = redact(url)
        self._secrets = secrets_of(url)
        address, self.options = parse_url(url)
        try:
            import redis
            from redis.backoff import NoBackoff
            from redis.retry import Retry
        except ImportError:
            raise ConfigError(
                f"the remote tier {self.url!r} needs the redis client: "
                "pip install 'kernelcache[redis]'"
            ) from None
        self._errors = redis.exceptions
        opts = self.options
        try:
            self._client = redis.Redis.from_url(
                address,
                socket_timeout=opts.timeout,
                socket_connect_timeout=opts.connect_timeout or opts.timeout,
                retry=Retry(NoBackoff(), 0),
                health_check_interval=0,
                **opts.client,
            )
        except (ValueError, TypeError) as e:
            raise ConfigError(f"remote URL {self.url!r}: {scrub(str(e), self._secrets)}") from None
        self._acquire_script = self._client.register_script(_ACQUIRE)
        self._release_script = self._client.register_script(_RELEASE)
        self._stats_root = stats_root or f"remote:{self.url}"
        self._lock = threading.Lock()
        self._down_until = 0.0
        self._full_until = 0.0
        self._counters: Counter[str] = Counter()

    def __repr__(self) -> str:
        return f"RedisTier({self.url!r})"

    __str__ = __repr__

    @property
    def counters(self) -> dict[str, int]:
        """This tier's own counters in this process (gets, hits, errors, breaker_trips, ...)."""
        with self._lock:
            return dict(self._counters)

    def close(self) -> None:
        """Close the connections (the tier reconnects if used again)."""
        self._client.close()

    # -- failure policy -------------------------------------------------------------------
    def _bump(self, **deltas: int) -> None:
        with self._lock:
            self._counters.update(deltas)

    def _usable(self) -> bool:
        """False while the circuit breaker is open (the server failed recently)."""
        if time.monotonic() < self._down_until:
            self._bump(skipped=1)
            return False
        return True

    def _failed(self, what: str, e: BaseException) -> None:
        """Account for an exception from redis-py; open the breaker if the server is gone."""
        stats.count(self._stats_root, remote_errors=1)
        reason = scrub(f"{e.__class__.__name__}: {e}", self._secrets)
        errors = self._errors
        if isinstance(e, (errors.OutOfMemoryError, errors.ReadOnlyError)):
            self._full_until = time.monotonic() + self.options.breaker
            self._bump(errors=1, full=1)
            warn_once(
                logger,
                (self.url, "full"),
                "kernelcache: remote cache %s refuses writes (%s); not storing new entries "
                "there for %gs",
                self.url,
                reason,
                self.options.breaker,
            )
        elif isinstance(e, errors.ResponseError):
            self._bump(errors=1)
            warn_once(
                logger, (self.url, "response"), "kernelcache: remote cache %s: %s", self.url, reason
            )
        else:  # connection refused or lost, timeout, TLS or auth failure, protocol garbage
            self._down_until = time.monotonic() + self.options.breaker
            self._bump(errors=1, breaker_trips=1)
            self._client.connection_pool.disconnect(inuse_connections=False)
            warn_once(
                logger,
                (self.url, "unavailable"),
                "kernelcache: remote cache %s unavailable during %s (%s); continuing with the "
                "local cache and not asking it again for %gs",
                self.url,
                what,
                reason,
                self.options.breaker,
            )

    def _call(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``(fn(*args, **kwargs), False)``, or ``(None, True)`` after a Redis, socket or
        protocol failure, which is accounted for (counters, breaker, one warning)."""
        try:
            return fn(*args, **kwargs), False
        except (self._errors.RedisError, OSError, ValueError) as e:
            self._failed(what, e)
            return None, True

    # -- the RemoteTier interface ---------------------------------------------------------
    def name(self, key: str) -> str:
        """The Redis key of an entry."""
        return self.options.prefix + key

    def get(self, key: str, ext: str) -> tuple[bytes, dict[str, Any]] | None:
        """The verified ``(data, metadata)`` of ``key``, or None (absent, bad or unavailable).

        Never raises for a failure of the server; costs at most ``timeout`` (plus one connect).

        Raises:
            ValueError: malformed ``key`` or ``ext``.
        """
        check_key(key)
        check_ext(ext)
        if not self._usable():
            return None
        self._bump(gets=1)
        raw, failed = self._call("get", self._client.get, self.name(key))
        if failed or raw is None:
            self._bump(misses=1)
            return None
        found = decode_value(raw, key)
        if isinstance(found, Problem):
            self._reject(key, found.reason)
            return None
        data, meta = found
        if meta["ext"] != ext:
            self._bump(misses=1)
            logger.debug("kernelcache: remote %s holds .%s, not .%s", key, meta["ext"], ext)
            return None
        if self._signing_key is not None:
            refused = authenticate(key, data, meta, self._signing_key)
            if refused is not None:
                stats.count(self._stats_root, unauthenticated=1)
                self._bump(misses=1, unauthenticated=1)
                warn_once(
                    logger,
                    (self.url, "unauthenticated"),
                    "kernelcache: refused a value without a valid signature in %s (%s): %s "
                    "(KERNELCACHE_SIGNING_KEY is set: only values signed with it are used)",
                    self.url,
                    key,
                    refused.reason,
                )
                return None
        self._bump(hits=1)
        return data, meta

    def _reject(self, key: str, reason: str) -> None:
        stats.count(self._stats_root, remote_errors=1)
        self._bump(misses=1, rejected=1)
        warn_once(
            logger,
            (self.url, "rejected"),
            "kernelcache: rejected a bad entry in %s (%s): %s",
            self.url,
            key,
            reason,
        )
        self._call("delete", self._client.delete, self.name(key))

    def put(self, key: str, ext: str, data: bytes, meta: Mapping[str, Any]) -> bool:
        """Send an entry (overwriting what is there), unless it is larger than ``max_size``,
        the breaker is open or the server recently refused writes. Never raises for a failure
        of the server. Returns whether the entry was stored.

        Raises:
            ValueError: malformed ``key`` or ``ext``, or ``meta`` is not JSON-serializable
                (the local store rejects such entries first).
        """
        check_key(key)
        check_ext(ext)
        if not self._usable():
            return False
        if time.monotonic() < self._full_until:
            self._bump(skipped=1)
            return False
        value = make_value(key, ext, data, meta, self._signing_key)
        if len(value) > self.options.max_size:
            self._bump(oversize=1)
            warn_once(
                logger,
                (self.url, "oversize"),
                "kernelcache: not sending %s (%d bytes) to %s: larger than max_size=%d",
                key,
                len(value),
                self.url,
                self.options.max_size,
            )
            return False
        ttl_ms = math.ceil(self.options.ttl * 1000) if self.options.ttl else None
        _, failed = self._call("put", self._client.set, self.name(key), value, px=ttl_ms)
        if not failed:
            self._bump(puts=1)
        return not failed

    def acquire(self, key: str, timeout: float) -> Callable[[], None] | None:
        """Take the job-wide build lock of ``key``.

        Returns a function that releases the lock (only while this owner still holds it), or a
        function that does nothing when the entry appeared in Redis meanwhile (the caller's
        remote read then hits), or None when the lock was not had within ``timeout`` seconds
        or the server is unavailable (the caller then builds privately). The lock expires
        after ``lock_ttl`` if its owner dies.

        Raises:
            ValueError: malformed ``key``.
        """
        check_key(key)
        if not self._usable():
            return None
        lock = self.name(key) + ":lock"
        ttl_ms = str(max(1, math.ceil(self.options.lock_ttl * 1000)))
        token = f"{ttl_ms}:{HOST}:{os.getpid()}:{uuid.uuid4().hex}"
        deadline = time.monotonic() + max(0.0, timeout)
        delay = _POLL_FIRST
        while True:
            state, failed = self._call(
                "lock", self._acquire_script, keys=[lock, self.name(key)], args=[token, ttl_ms]
            )
            if failed:
                return None
            if state == _BROKEN:
                self._bump(locks=1, locks_broken=1)
                warn_once(
                    logger,
                    (self.url, "lock-broken"),
                    "kernelcache: broke the build lock of %s in %s: it had no expiry or was "
                    "held longer than lock_ttl=%gs (a crashed or foreign client); building",
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
        released, failed = self._call("unlock", self._release_script, keys=[lock], args=[token])
        if not failed and not released:
            self._bump(locks_lost=1)
            logger.debug("kernelcache: build lock %s had expired before its release", lock)
