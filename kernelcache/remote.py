"""The remote tier shared by many machines: a Redis server.

URL (``$KERNELCACHE_REMOTE`` or ``Cache(remote=...)``)::

    redis://[[user]:password@]host[:port][/db][?option=value&...]
    rediss://...            the same over TLS
    unix:///path/to/redis.sock?db=0[&option=value...]

Options (all optional; see :data:`OPTIONS`): ``timeout`` (seconds per socket operation, default
0.5), ``connect_timeout`` (default: ``timeout``), ``ttl`` (entries expire this long after they
were stored; default never), ``namespace`` (key prefix, default ``kc``), ``max_size`` (larger
entries are not sent, default 64M), ``breaker`` (after a connection failure the server is not
asked again for this long, default 30s), ``lock_ttl`` (a build lock expires after this long, so
a dead builder does not block the job, default 120s). ``rediss://`` also takes ``ssl_ca_certs``,
``ssl_ca_path``, ``ssl_certfile``, ``ssl_keyfile``, ``ssl_password``, ``ssl_cert_reqs``
(``none``/``optional``/``required``) and ``ssl_check_hostname``, passed to redis-py. Durations
take a unit (``500ms``, ``30s``, ``10m``, ``12h``, ``7d``, ``2w``, ``1d12h``; plain numbers are
seconds), sizes an optional unit (``512K``, ``64M``, ``1GiB``: powers of 1024; ``64MB``: powers of
1000); both are read by :mod:`kernelcache.units`, as on the command line.

Layout in Redis, one string per entry (one round trip per read)::

    <namespace>:v2:<key>        b"KCR1" | metadata length (uint32, big endian)
                                | the store's metadata JSON | the artifact bytes
    <namespace>:v2:<key>:lock   build lock: "<lock_ttl in ms>:<owner token>", set with NX and
                                an expiry (PX)

(``v1`` values, written by earlier versions without an entry digest, are never read.)

Guarantees across processes and machines:

* A value is used only if its header, its metadata (the schema of :mod:`kernelcache.schema`
  and the entry digest, which covers the launch metadata) and the artifact's size and xxh3-128
  digest all check out; anything else is a miss, counted as a remote error, and the bad value is
  deleted. The cache verifies again before publishing a remote hit into its local root.
* With a signing key (``KERNELCACHE_SIGNING_KEY``), values are stored with an HMAC-SHA256 over
  their covered metadata and artifact bytes, and a value without a valid one is refused: a
  miss, counted as ``unauthenticated``, one warning; it is left in place (a peer with the key
  overwrites it when it rebuilds).
* One builder per key across the job: :meth:`RedisTier.acquire` sets the lock key only if it is
  absent (``SET NX PX``) and releases it only while it still holds the owner's token; a dead
  builder's lock expires after ``lock_ttl``. A lock found without an expiry (left by anyone),
  or held longer than this client's ``lock_ttl``, is broken at once, with one warning. Waiters
  poll with backoff, stop waiting as soon as the entry has appeared, and give up after their
  timeout (the caller then builds privately).
* Redis down, slow, full, evicting or returning garbage never fails or stalls the caller: every
  socket operation is bounded by ``timeout``, nothing is retried within a call, and a connection
  failure opens a circuit breaker: the server is not asked again for ``breaker`` seconds. A
  full server (OOM) or a read-only replica stops puts for the same period while reads go on.
  Each kind of failure is logged as a warning once per process; failures are counted as
  ``remote_errors`` in :func:`kernelcache.process_stats`.
* Credentials never appear in ``repr``, ``str``, log messages or errors (they read ``***``).

redis-py is an optional dependency (``pip install 'kernelcache[redis]'``), imported only when
a Redis URL is opened.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import random
import re
import struct
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, quote, unquote, urlsplit

from . import process, stats
from .errors import ConfigError, Problem
from .keys import check_ext, check_key
from .process import HOST
from .schema import (
    HMAC_FIELD,
    MAX_META_BYTES,
    RESERVED_FIELDS,
    check_signature,
    digest,
    encode_metadata,
    make_metadata,
    parse_metadata,
    sign,
)
from .tier import RemoteTier
from .units import parse_bool, parse_duration, parse_size

logger = logging.getLogger(__name__)

#: version of the value layout; part of every Redis key, so a new layout never reads an old one
#: (2: the metadata carries an entry digest, and optionally an HMAC)
REMOTE_FORMAT = 2
MAGIC = b"KCR1"
_HEADER = struct.Struct(">4sI")
#: Redis refuses strings larger than this
REDIS_MAX_STRING = 512 << 20
SCHEMES = ("redis", "rediss", "unix")


# -- the value format ---------------------------------------------------------------------
def encode_value(meta: Mapping[str, Any], data: bytes) -> bytes:
    """One entry as a Redis value: magic, metadata length, metadata JSON, artifact bytes."""
    raw_meta = encode_metadata(meta)
    return b"".join((_HEADER.pack(MAGIC, len(raw_meta)), raw_meta, data))


def decode_value(raw: bytes, key: str) -> tuple[bytes, dict[str, Any]] | str:
    """Parse and verify a value read for ``key`` (header, metadata schema and entry digest,
    artifact size and digest; not the signature: see :func:`kernelcache.schema.check_signature`).

    Returns ``(data, metadata)``, or a string saying what is wrong (never raises).
    """
    if not isinstance(raw, bytes):
        return f"value is a {type(raw).__name__}, not bytes"
    if len(raw) < _HEADER.size:
        return "value is shorter than its header"
    magic, meta_len = _HEADER.unpack_from(raw)
    if magic != MAGIC:
        return "value does not start with the kernelcache header"
    if meta_len > MAX_META_BYTES or _HEADER.size + meta_len > len(raw):
        return "value is truncated (metadata length exceeds the value)"
    doc = parse_metadata(raw[_HEADER.size : _HEADER.size + meta_len], key)
    if isinstance(doc, Problem):
        return doc.reason
    data = raw[_HEADER.size + meta_len :]
    if doc["size"] != len(data):
        return f"artifact is {len(data)} bytes, metadata says {doc['size']}"
    if doc["digest"] != digest(data):
        return "artifact digest does not match its metadata"
    return data, doc


# -- configuration --------------------------------------------------------------------------
_NAMESPACE = re.compile(r"[A-Za-z0-9_.-]{1,64}")


def _parse_cert_reqs(text: str) -> str:
    value = text.strip().lower()
    if value not in ("none", "optional", "required"):
        raise ValueError("expected none, optional or required")
    return value


def _parse_db(text: str) -> int:
    value = int(text)
    if value < 0:
        raise ValueError("expected a database number >= 0")
    return value


@dataclass(frozen=True)
class RemoteOptions:
    """The policy of the Redis tier, from the URL's query string (see the module docstring)."""

    timeout: float = 0.5
    connect_timeout: float | None = None
    ttl: float = 0.0
    namespace: str = "kc"
    max_size: int = 64 << 20
    breaker: float = 30.0
    lock_ttl: float = 120.0
    #: options passed to redis-py as they are (TLS settings, ``db`` for unix sockets)
    client: Mapping[str, Any] = field(default_factory=dict)

    @property
    def prefix(self) -> str:
        return f"{self.namespace}:v{REMOTE_FORMAT}:"


#: option -> (parser, meaning); the tier's own policy
OPTIONS: dict[str, tuple[Callable[[str], Any], str]] = {
    "timeout": (parse_duration, "seconds per socket operation (default 0.5)"),
    "connect_timeout": (parse_duration, "seconds to connect (default: timeout)"),
    "ttl": (parse_duration, "entries expire this long after being stored (default 0: never)"),
    "namespace": (str, "key prefix, [A-Za-z0-9_.-]{1,64} (default kc)"),
    "max_size": (parse_size, "entries larger than this are not sent (default 64M)"),
    "breaker": (parse_duration, "after a connection failure, skip the server this long (30s)"),
    "lock_ttl": (parse_duration, "a build lock expires after this long (default 120s)"),
}
#: option -> parser; passed through to redis-py (TLS options need rediss://)
CLIENT_OPTIONS: dict[str, Callable[[str], Any]] = {
    "db": _parse_db,
    "ssl_ca_certs": str,
    "ssl_ca_path": str,
    "ssl_certfile": str,
    "ssl_keyfile": str,
    "ssl_password": str,
    "ssl_cert_reqs": _parse_cert_reqs,
    "ssl_check_hostname": parse_bool,
}
_SECRET_OPTIONS = frozenset({"ssl_password"})


def redact(url: str) -> str:
    """``url`` with its password (and any secret option) replaced by ``***``."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparsable URL>"
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, _, hostport = netloc.rpartition("@")
        user, colon, _password = userinfo.partition(":")
        netloc = f"{user}{':***' if colon else ''}@{hostport}"
    query = "&".join(
        f"{name}=***" if name in _SECRET_OPTIONS else f"{quote(name)}={quote(value, safe='/.:')}"
        for name, value in parse_qsl(parts.query, keep_blank_values=True)
    )
    return f"{parts.scheme}://{netloc}{parts.path}" + (f"?{query}" if query else "")


def _secrets(url: str) -> list[str]:
    """The secrets in ``url`` (as written and unquoted), to scrub from messages."""
    found: list[str] = []
    try:
        parts = urlsplit(url)
        password = parts.password
        pairs = parse_qsl(parts.query, keep_blank_values=True)
    except ValueError:
        return found
    values = [password] if password else []
    values += [v for k, v in pairs if k in _SECRET_OPTIONS and v]
    for value in values:
        found += {value, unquote(value), quote(value, safe="")}
    return sorted(found, key=len, reverse=True)


def parse_url(url: str) -> tuple[str, RemoteOptions]:
    """Split a remote URL into the address for redis-py (no query) and the options.

    Raises:
        ConfigError: unsupported scheme, no host, unknown option or a bad value; the message
            names it and lists the valid options (and never shows a password).
    """
    shown = redact(url)
    try:
        parts = urlsplit(url.strip())
        parts.port  # noqa: B018 -- validates the port
    except ValueError as e:
        raise ConfigError(f"remote URL {shown!r} is malformed: {e}") from None
    if parts.scheme not in SCHEMES:
        raise ConfigError(
            f"remote URL {shown!r}: unsupported scheme {parts.scheme!r}; use redis://host:port/db,"
            " rediss:// (TLS) or unix:///path/to/socket"
        )
    if parts.scheme != "unix" and not parts.hostname:
        raise ConfigError(f"remote URL {shown!r} names no host; use redis://host:6379/0")
    if parts.scheme == "unix" and not parts.path:
        raise ConfigError(f"remote URL {shown!r} names no socket; use unix:///path/to/redis.sock")
    if parts.scheme != "unix" and parts.path.strip("/"):
        try:
            _parse_db(parts.path.strip("/"))
        except ValueError:
            raise ConfigError(
                f"remote URL {shown!r}: the path must be a database number, e.g. /0"
            ) from None
    values: dict[str, Any] = {}
    client: dict[str, Any] = {}
    valid = sorted([*OPTIONS, *CLIENT_OPTIONS])
    for name, raw in parse_qsl(parts.query, keep_blank_values=True):
        if name in values or name in client:
            raise ConfigError(f"remote URL {shown!r} sets option {name!r} twice")
        parser = OPTIONS[name][0] if name in OPTIONS else CLIENT_OPTIONS.get(name)
        if parser is None:
            raise ConfigError(
                f"remote URL {shown!r}: unknown option {name!r}; valid options: {', '.join(valid)}"
            )
        try:
            value = parser(raw)
        except ValueError as e:
            what = "***" if name in _SECRET_OPTIONS else repr(raw)
            raise ConfigError(f"remote URL {shown!r}: option {name}={what}: {e}") from None
        (values if name in OPTIONS else client)[name] = value
    if any(name.startswith("ssl_") for name in client) and parts.scheme != "rediss":
        raise ConfigError(f"remote URL {shown!r}: ssl_* options need a rediss:// URL")
    if "db" in client and parts.scheme != "unix":
        raise ConfigError(f"remote URL {shown!r}: give the database as the path, e.g. /0")
    options = RemoteOptions(**values, client=client)
    problems = []
    if not (0 < options.timeout <= 3600):
        problems.append("timeout must be more than 0 and at most 1h")
    if options.connect_timeout is not None and not (0 < options.connect_timeout <= 3600):
        problems.append("connect_timeout must be more than 0 and at most 1h")
    if options.ttl != 0 and options.ttl < 0.001:
        problems.append("ttl must be 0 (never expire) or at least 1ms")
    if _NAMESPACE.fullmatch(options.namespace) is None:
        problems.append("namespace must be 1 to 64 characters of [A-Za-z0-9_.-]")
    if not (0 < options.max_size <= REDIS_MAX_STRING):
        problems.append("max_size must be more than 0 and at most 512M")
    if options.lock_ttl < 0.001:
        problems.append("lock_ttl must be at least 1ms")
    if problems:
        raise ConfigError(f"remote URL {shown!r}: {'; '.join(problems)}")
    address = f"{parts.scheme}://{parts.netloc}{parts.path}"
    return address, options


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
    """The shared tier on a Redis server (implements :class:`kernelcache.tier.RemoteTier`).

    Thread-safe; usable after ``fork`` (redis-py reconnects in the child). Construction does
    not connect: the first call does, bounded by ``connect_timeout``.

    Args:
        url: see the module docstring.
        stats_root: the cache root whose counters take this tier's errors (default: a
            label of the URL; they still show in :func:`kernelcache.process_stats`).
        signing_key: sign values with this key, and refuse values not signed with it (see
            the module docstring); None: values are neither signed nor authenticated.

    Raises:
        ConfigError: bad URL or options, or redis-py is not installed.
    """

    def __init__(
        self, url: str, *, stats_root: str | None = None, signing_key: bytes | None = None
    ) -> None:
        self._signing_key = signing_key
        self.url = redact(url)
        self._secrets = _secrets(url)
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
            raise ConfigError(f"remote URL {self.url!r}: {self._scrub(str(e))}") from None
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

    def _scrub(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text

    def _warn_once(self, topic: str, message: str, *args: object) -> None:
        if not process.warn_once(logger, (self.url, topic), message, *args):
            logger.debug(message, *args)

    def _usable(self) -> bool:
        """False while the circuit breaker is open (the server failed recently)."""
        if time.monotonic() < self._down_until:
            self._bump(skipped=1)
            return False
        return True

    def _failed(self, what: str, e: BaseException) -> None:
        """Account for an exception from redis-py; open the breaker if the server is gone."""
        stats.count(self._stats_root, remote_errors=1)
        reason = self._scrub(f"{e.__class__.__name__}: {e}")
        errors = self._errors
        if isinstance(e, (errors.OutOfMemoryError, errors.ReadOnlyError)):
            self._full_until = time.monotonic() + self.options.breaker
            self._bump(errors=1, full=1)
            self._warn_once(
                "full",
                "kernelcache: remote cache %s refuses writes (%s); not storing new entries "
                "there for %gs",
                self.url,
                reason,
                self.options.breaker,
            )
        elif isinstance(e, errors.ResponseError):
            self._bump(errors=1)
            self._warn_once("response", "kernelcache: remote cache %s: %s", self.url, reason)
        else:  # connection refused or lost, timeout, TLS or auth failure, protocol garbage
            self._down_until = time.monotonic() + self.options.breaker
            self._bump(errors=1, breaker_trips=1)
            self._client.connection_pool.disconnect(inuse_connections=False)
            self._warn_once(
                "unavailable",
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
        if isinstance(found, str):
            self._reject(key, found)
            return None
        data, meta = found
        if meta["ext"] != ext:
            self._bump(misses=1)
            logger.debug("kernelcache: remote %s holds .%s, not .%s", key, meta["ext"], ext)
            return None
        if self._signing_key is not None:
            why = check_signature(meta, hashlib.sha256(data).digest(), self._signing_key)
            if why is not None:
                stats.count(self._stats_root, unauthenticated=1)
                self._bump(misses=1, unauthenticated=1)
                self._warn_once(
                    "unauthenticated",
                    "kernelcache: refused a value without a valid signature in %s (%s): %s "
                    "(KERNELCACHE_SIGNING_KEY is set: only values signed with it are used)",
                    self.url,
                    key,
                    why,
                )
                return None
        self._bump(hits=1)
        return data, meta

    def _reject(self, key: str, reason: str) -> None:
        stats.count(self._stats_root, remote_errors=1)
        self._bump(misses=1, rejected=1)
        self._warn_once(
            "rejected", "kernelcache: rejected a bad entry in %s (%s): %s", self.url, key, reason
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
        doc = make_metadata(
            key, ext, data, {k: v for k, v in meta.items() if k not in RESERVED_FIELDS}
        )
        if self._signing_key is not None:
            doc[HMAC_FIELD] = sign(doc, hashlib.sha256(data).digest(), self._signing_key)
        value = encode_value(doc, data)
        if len(value) > self.options.max_size:
            self._bump(oversize=1)
            self._warn_once(
                "oversize",
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
                self._warn_once(
                    "lock-broken",
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


def open_remote(
    url: str, *, stats_root: str | None = None, signing_key: bytes | None = None
) -> RemoteTier:
    """Open the remote tier named by ``url`` (see the module docstring). Does not connect.

    Raises:
        ConfigError: the URL or an option is invalid (message lists the valid options), or
            the redis client is not installed.
    """
    return RedisTier(url, stats_root=stats_root, signing_key=signing_key)
