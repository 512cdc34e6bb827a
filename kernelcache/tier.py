"""The interface of a remote tier: what :class:`kernelcache.Cache` needs from a store shared by
many machines.

The cache and every implementation (:mod:`kernelcache.remote`'s Redis tier, or any object a
caller passes as ``Cache(remote=...)``) import this module; neither imports the other for it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class RemoteTier(Protocol):
    """What the cache needs from a shared tier (see kernelcache.remote).

    Implementations handle their own failures: ``get`` returns None and ``put`` returns
    without raising when the remote is down, slow or returns garbage.
    """

    def get(self, key: str, ext: str) -> tuple[bytes, dict[str, Any]] | None: ...

    def put(self, key: str, ext: str, data: bytes, meta: Mapping[str, Any]) -> bool:
        """Send an entry; return whether it was stored."""
        ...

    def acquire(self, key: str, timeout: float) -> Callable[[], None] | None:
        """Take the job-wide build lock of ``key`` (one builder across machines).

        Returns a function that releases it, or None if it could not be had within
        ``timeout`` seconds or the remote is unavailable (the caller then builds anyway).
        """
        ...
