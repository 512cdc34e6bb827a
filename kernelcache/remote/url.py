"""Remote URLs: the Redis tier's URL and options (:func:`parse_url`), and the redaction of
secrets (a password, secret options) that every message about any remote URL goes through.

Invariant: a secret given in a URL never appears in ``repr``, ``str``, a log message or an
error; it reads ``***``. The options are described in docs/remote.md.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, quote, unquote, urlsplit

from ..errors import ConfigError, InvalidValue
from ..units import parse_bool, parse_duration, parse_size
from .codec import REMOTE_FORMAT

#: the URL schemes of the Redis tier: one server, or a Redis Cluster (``+cluster``)
SCHEMES = ("redis", "rediss", "unix", "redis+cluster", "rediss+cluster")
#: Redis refuses strings larger than this
REDIS_MAX_STRING = 512 << 20
#: the longest expiry (``ttl``, ``lock_ttl``) in seconds: Redis takes at most 2**63-1 ms less
#: the clock, and its scripts pass numbers on as text of 14 significant digits (Redis 6)
REDIS_MAX_EXPIRE = (10**14 - 1) / 1000
_NAMESPACE = re.compile(r"[A-Za-z0-9_.-]{1,64}")
#: the shortest default lease of a build lock, in seconds
MIN_LEASE = 5.0


def default_lease(timeout: float, lock_ttl: float) -> float:
    """A build lock's lease where the URL gives none: twice the time one call may take (a
    renewal must fit in a third of it, with room), at least :data:`MIN_LEASE`, at most
    ``lock_ttl``."""
    return min(max(MIN_LEASE, 2 * timeout), lock_ttl)


def lease_problems(lease: float | None, timeout: float, lock_ttl: float) -> list[str]:
    """What is wrong with a ``lease`` option given with these ``timeout`` and ``lock_ttl``."""
    if lease is None:
        return []
    if not (0.001 <= lease <= lock_ttl):
        return ["lease must be from 1ms to lock_ttl"]
    if lease <= timeout:
        return ["lease must be longer than timeout (a renewal may take that long)"]
    return []


def _parse_cert_reqs(text: str) -> str:
    value = text.strip().lower()
    if value not in ("none", "optional", "required"):
        raise InvalidValue("expected none, optional or required")
    return value


def _parse_db(text: str) -> int:
    value = int(text)
    if value < 0:
        raise InvalidValue("expected a database number >= 0")
    return value


@dataclass(frozen=True)
class RemoteOptions:
    """The policy of the Redis tier, from the URL's query string (see docs/remote.md)."""

    timeout: float = 0.5
    connect_timeout: float | None = None
    ttl: float = 0.0
    namespace: str = "kc"
    max_size: int = 64 << 20
    breaker: float = 30.0
    lock_ttl: float = 120.0
    lease: float | None = None
    read_only: bool = False
    #: options passed to redis-py as they are (TLS settings, ``db`` for unix sockets)
    client: Mapping[str, Any] = field(default_factory=dict)

    @property
    def prefix(self) -> str:
        return f"{self.namespace}:v{REMOTE_FORMAT}:"

    @property
    def lease_s(self) -> float:
        """The lease of a build lock, in seconds (given, or :func:`default_lease`)."""
        return default_lease(self.timeout, self.lock_ttl) if self.lease is None else self.lease


#: option -> (parser, meaning); the tier's own policy
OPTIONS: dict[str, tuple[Callable[[str], Any], str]] = {
    "timeout": (parse_duration, "seconds per socket operation (default 0.5)"),
    "connect_timeout": (parse_duration, "seconds to connect (default: timeout)"),
    "ttl": (parse_duration, "entries expire this long after being stored (default 0: never)"),
    "namespace": (str, "key prefix, [A-Za-z0-9_.-]{1,64} (default kc)"),
    "max_size": (parse_size, "entries larger than this are not sent (default 64M)"),
    "breaker": (parse_duration, "after a connection failure, skip the server this long (30s)"),
    "lock_ttl": (parse_duration, "a build lock lasts at most this long (default 120s)"),
    "lease": (
        parse_duration,
        "a build lock whose holder stops renewing it lasts this long (default 2 x timeout, "
        "at least 5s)",
    ),
    "read_only": (parse_bool, "1: only read this tier: no puts, backfill or locks (default 0)"),
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


def secrets_of(url: str) -> list[str]:
    """The secrets in ``url`` (as written and unquoted), longest first, for :func:`scrub`."""
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


def scrub(text: str, secrets: list[str]) -> str:
    """``text`` (e.g. an exception's message) with each of ``secrets`` replaced by ``***``."""
    for secret in secrets:
        text = text.replace(secret, "***")
    return text


def read_options(
    shown: str, query: str, parsers: Mapping[str, Callable[[str], Any]]
) -> dict[str, Any]:
    """The options of a URL's query string, each read by its parser.

    Raises:
        ConfigError: an option set twice, unknown (the message lists the valid ones) or with
            a bad value (a secret option's value is shown as ``***``).
    """
    values: dict[str, Any] = {}
    for name, raw in parse_qsl(query, keep_blank_values=True):
        if name in values:
            raise ConfigError(f"remote URL {shown!r} sets option {name!r} twice")
        parser = parsers.get(name)
        if parser is None:
            raise ConfigError(
                f"remote URL {shown!r}: unknown option {name!r}; valid options: "
                + ", ".join(sorted(parsers))
            )
        try:
            values[name] = parser(raw)
        except ValueError as e:
            what = "***" if name in _SECRET_OPTIONS else repr(raw)
            raise ConfigError(f"remote URL {shown!r}: option {name}={what}: {e}") from None
    return values


def parse_url(url: str) -> tuple[str, RemoteOptions]:
    """Split a Redis tier URL into the address for redis-py (no query) and the options.

    Raises:
        ConfigError: unsupported scheme, no host, unknown option or a bad value; the message
            names it and lists the valid options (and never shows a password).
    """
    shown = redact(url)
    try:
        parts = urlsplit(url.strip())
        if not parts.scheme.endswith("+cluster"):
            parts.port  # noqa: B018 -- validates the port (a cluster's nodes: cluster_nodes)
    except ValueError as e:
        raise ConfigError(f"remote URL {shown!r} is malformed: {e}") from None
    if parts.scheme not in SCHEMES:
        raise ConfigError(
            f"remote URL {shown!r}: unsupported scheme {parts.scheme!r}; use redis://host:port/db,"
            " rediss:// (TLS), unix:///path/to/socket or redis+cluster://host:port,..."
        )
    if parts.scheme.endswith("+cluster"):
        cluster_nodes(url)
    elif parts.scheme != "unix" and not parts.hostname:
        raise ConfigError(f"remote URL {shown!r} names no host; use redis://host:6379/0")
    if parts.scheme == "unix" and not parts.path:
        raise ConfigError(f"remote URL {shown!r} names no socket; use unix:///path/to/redis.sock")
    if parts.scheme.endswith("+cluster") and parts.path.strip("/") not in ("", "0"):
        raise ConfigError(f"remote URL {shown!r}: a Redis Cluster has only database 0")
    if parts.scheme != "unix" and parts.path.strip("/"):
        try:
            _parse_db(parts.path.strip("/"))
        except ValueError:
            raise ConfigError(
                f"remote URL {shown!r}: the path must be a database number, e.g. /0"
            ) from None
    parsers = {name: parser for name, (parser, _) in OPTIONS.items()}
    found = read_options(shown, parts.query, {**parsers, **CLIENT_OPTIONS})
    values = {k: v for k, v in found.items() if k in OPTIONS}
    client = {k: v for k, v in found.items() if k not in OPTIONS}
    if any(name.startswith("ssl_") for name in client) and not parts.scheme.startswith("rediss"):
        raise ConfigError(f"remote URL {shown!r}: ssl_* options need a rediss:// URL")
    if "db" in client and parts.scheme != "unix":
        raise ConfigError(f"remote URL {shown!r}: give the database as the path, e.g. /0")
    options = RemoteOptions(**values, client=client)
    problems = []
    if not (0 < options.timeout <= 3600):
        problems.append("timeout must be more than 0 and at most 1h")
    if options.connect_timeout is not None and not (0 < options.connect_timeout <= 3600):
        problems.append("connect_timeout must be more than 0 and at most 1h")
    years = f"{REDIS_MAX_EXPIRE / 31_557_600:.0f} years"
    if options.ttl != 0 and not (0.001 <= options.ttl <= REDIS_MAX_EXPIRE):
        problems.append(f"ttl must be 0 (never expire) or from 1ms to {years} (Redis's range)")
    if _NAMESPACE.fullmatch(options.namespace) is None:
        problems.append("namespace must be 1 to 64 characters of [A-Za-z0-9_.-]")
    if not (0 < options.max_size <= REDIS_MAX_STRING):
        problems.append("max_size must be more than 0 and at most 512M")
    if not (0.001 <= options.lock_ttl <= REDIS_MAX_EXPIRE):
        problems.append(f"lock_ttl must be from 1ms to {years} (Redis's range)")
    problems += lease_problems(options.lease, options.timeout, options.lock_ttl)
    if problems:
        raise ConfigError(f"remote URL {shown!r}: {'; '.join(problems)}")
    address = f"{parts.scheme}://{parts.netloc}{parts.path}"
    return address, options


def cluster_nodes(url: str) -> list[tuple[str, int]]:
    """The ``(host, port)`` of each node a ``redis+cluster://`` URL names (comma-separated,
    ``host:port``, IPv6 in brackets; the port defaults to 6379).

    Raises:
        ConfigError: no node, or a node that is not ``host:port``.
    """
    netloc = urlsplit(url.strip()).netloc.rpartition("@")[2]
    nodes = []
    for item in netloc.split(","):
        probe = urlsplit(f"//{item.strip()}")
        try:
            host, port = probe.hostname, probe.port or 6379
        except ValueError:
            host = None
        if not host or probe.path:
            raise ConfigError(
                f"remote URL {redact(url)!r}: {item!r} is not a node; use "
                "redis+cluster://host:port,host:port,..."
            )
        nodes.append((host, port))
    return nodes
