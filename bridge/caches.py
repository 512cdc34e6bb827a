"""Which kernel cache a call uses: the process's default one per configuration, or the one the
caller passed (a ``kernelcache.Cache`` or a cache root directory)."""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING, TypeAlias

if TYPE_CHECKING:
    from kernelcache import Cache
    from kernelcache.config import Settings

    #: what callers may pass as a cache: a Cache, a cache root directory, or None (the default)
    CacheArg: TypeAlias = Cache | str | os.PathLike[str] | None

_default: dict[Settings, Cache] = {}
_default_lock = threading.Lock()


def default_cache(cfg: Settings | None = None) -> Cache:
    """The process's kernel cache configured from the environment (one per configuration;
    ``cfg`` is a ``kernelcache.config.settings()`` snapshot, read now when None)."""
    import kernelcache
    from kernelcache.config import settings

    cfg = cfg or settings()
    with _default_lock:
        cache = _default.get(cfg)
        if cache is None:
            cache = _default[cfg] = kernelcache.Cache()
        return cache


def as_cache(cache: CacheArg, cfg: Settings | None = None) -> Cache:
    """``cache`` as a kernelcache.Cache: None for the default, or a root directory path."""
    if cache is None:
        return default_cache(cfg)
    if isinstance(cache, (str, os.PathLike)):
        import kernelcache

        return kernelcache.Cache(root=cache)
    return cache
