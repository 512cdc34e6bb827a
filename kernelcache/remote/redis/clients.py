"""The redis-py clients of the Redis tier: one for a single server, one per node of a cluster,
each made with the tier's timeouts, no retries and no health checks, speaking RESP2, and its
connections bounded by the tier's :class:`~.bounds.Budget` (a call's deadline and reply size).

RESP2 because the server is not trusted: under RESP3 a server may push messages between
replies, and redis-py acts on some (a ``MOVING`` push starts a timer of the server's length that
holds the process at exit, and moves the connections to an address the server names), and may
answer with maps and sets, which redis-py turns into dicts and sets of what the server chose.

No ``CLIENT SETINFO`` at connect: redis-py names itself to the server by default, two more
commands on every connection (a round trip each before redis-py 6), which a job of many
processes pays on each of its connections to each primary.

Invariant: nothing here connects; the first command does.
"""

from __future__ import annotations

import functools
import inspect
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
        **_unnamed(),
    }


@functools.cache
def _unnamed() -> dict[str, Any]:
    """The arguments that leave ``CLIENT SETINFO`` out: ``driver_info=None`` where redis-py
    has it (lib_name and lib_version are deprecated there), else ``lib_name=None`` and
    ``lib_version=None``."""
    from redis.connection import AbstractConnection

    if "driver_info" in inspect.signature(AbstractConnection.__init__).parameters:
        return {"driver_info": None}
    return {"lib_name": None, "lib_version": None}


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
