"""The interface of a remote tier: what :class:`kernelcache.Cache` needs from a store shared by
many machines (:class:`RemoteTier`), and how a tier is made from its URL (:class:`TierClass`).

The cache depends on this module and on the registry only; every implementation (the Redis
tier, a plugin's tier, or any object a caller passes as ``Cache(remote=...)``) implements it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class RemoteTier(Protocol):
    """What the cache needs from a shared tier (see docs/remote.md).

    Implementations handle their own failures: ``get`` returns None and ``put`` returns
    without raising when the remote is down, slow or returns garbage.
    """

    def get(self, key: str, ext: str) -> tuple[bytes, dict[str, Any]] | None: ...

    def put(self, key: str, ext: str, data: bytes, meta: Mapping[str, Any]) -> bool:
        """Send an entry; return whether it was stored. ``meta`` is the entry's metadata
        document as the cache holds it: a tier stores it as written (see
        :func:`kernelcache.remote.make_value`), never widened with its own covered fields."""
        ...

    def acquire(self, key: str, timeout: float) -> Callable[[], None] | None:
        """Take the job-wide build lock of ``key`` (one builder across machines).

        ``timeout`` is what is left of the caller's budget, which the cache gives to a whole
        call (many keys), not to each key: wait at most that long in all, and try at least
        once even when it is 0.

        Returns a function that releases it, or None if it could not be had within
        ``timeout`` seconds or the remote is unavailable (the caller then builds anyway).
        """
        ...


class TierClass(Protocol):
    """How the registry makes a tier of a URL scheme: a class (or a factory) called as
    ``cls(url, stats_root=..., signing_key=...)``, like :class:`kernelcache.remote.RedisTier`.

    ``url`` is the whole URL, secrets included (never show it: see
    :func:`kernelcache.remote.redact`); ``stats_root`` is the cache root whose counters
    (:func:`kernelcache.stats.count`) take the tier's errors, or None; with ``signing_key``,
    values are signed and only values signed with it are served (see
    :func:`kernelcache.remote.make_value` and :func:`kernelcache.remote.authenticate`).
    Construction does not connect; it raises :class:`kernelcache.ConfigError` for a URL or
    option the tier cannot use.
    """

    def __call__(
        self, url: str, *, stats_root: str | None = None, signing_key: bytes | None = None
    ) -> RemoteTier: ...
