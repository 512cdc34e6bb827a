"""The redis-py clients of the Redis tier: one for a single server, one per node of a cluster,
each made with the tier's timeouts, no retries and no health checks, speaking RESP2, and its
connections bounded by the tier's :class:`~.bounds.Budget` (a call's deadline and reply size).

RESP2 because the server is not trusted: under RESP3 a server may push messages between
replies, and redis-py acts on some (a ``MOVING`` push starts a timer of the server's length that
holds the process at exit, and moves the connections to an address the server names), and may
answer with maps and sets, which redis-py turns into dicts and sets of what the server chose.

Invariant: nothing here connects; the first command does.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote, urlsplit

from ..url import RemoteOptions
from .bounds import Budget, bounded_connection


def _common(options: RemoteOptions) -> dict[str, Any]:
    """What every redis-py connection of a tier is made with."""
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    return {
        "socket_timeout": options.timeout,
        "socket_connect_timeout": options.connect_timeout or options.timeout,
        "retry": Retry(NoBackoff(), 0),
        "health_check_interval": 0,
        "protocol": 2,
    }


def server_client(address: str, options: RemoteOptions, budget: Budget) -> Any:
    """The client of a single server at ``address`` (a ``redis://``, ``rediss://`` or
    ``unix://`` URL).

    Raises:
        ValueError, TypeError: redis-py refuses the URL or an option.
    """
    import redis

    scheme = address.split("://", 1)[0]
    base = {"rediss": redis.SSLConnection, "unix": redis.UnixDomainSocketConnection}
    cls = bounded_connection(base.get(scheme, redis.Connection), budget)
    return redis.Redis.from_url(address, connection_class=cls, **_common(options), **options.client)


def node_client(address: str, name: str, options: RemoteOptions, budget: Budget) -> Any:
    """The client of the node ``name`` ("host:port") of the cluster at ``address`` (its
    credentials and TLS)."""
    import redis

    host, _, port = name.rpartition(":")
    tls = address.startswith("rediss")
    base = redis.SSLConnection if tls else redis.Connection
    cls = bounded_connection(base, budget, **(options.client if tls else {}))
    auth = urlsplit(address)
    pool = redis.ConnectionPool(
        connection_class=cls,
        host=host.strip("[]"),
        port=int(port),
        username=unquote(auth.username) if auth.username else None,
        password=unquote(auth.password) if auth.password else None,
        **_common(options),
    )
    return redis.Redis(connection_pool=pool)
