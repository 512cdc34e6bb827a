"""kernelcache: a persistent, content-addressed cache of compiled GPU kernels.

This package imports neither jax nor triton: operators can inspect and prune caches on machines
that have neither. See ``Cache`` for the guarantees across processes.

Importing ``kernelcache`` is cheap: the modules behind a name below (the cache, its store, the
remote tiers) are imported when the name is first used, so a process imports only what it uses.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

from ._version import __version__
from .errors import CacheError, ConfigError, KernelCacheError, LockTimeout, LockUnavailable

if TYPE_CHECKING:
    from .cache import Cache
    from .cache.builds import BuildItem
    from .config import settings
    from .keys import check_ext, check_key
    from .remote import RemoteTier
    from .stats.counters import process_stats
    from .store.entry import Artifact
    from .store.layout import default_root
    from .store.root import Store

#: public name -> the module that defines it, imported on first use
_LAZY = {
    "Artifact": ".store.entry",
    "BuildItem": ".cache.builds",
    "Cache": ".cache",
    "RemoteTier": ".remote",
    "Store": ".store.root",
    "check_ext": ".keys",
    "check_key": ".keys",
    "default_root": ".store.layout",
    "process_stats": ".stats.counters",
    "settings": ".config",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is not None:
        value = getattr(importlib.import_module(module, __name__), name)
        globals()[name] = value
        return value
    # a module of the package used as an attribute (``kernelcache.config``), as when this
    # package imported them all
    if not name.startswith("_") and importlib.util.find_spec(f"{__name__}.{name}") is not None:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


__all__ = [
    "Artifact",
    "BuildItem",
    "Cache",
    "CacheError",
    "ConfigError",
    "KernelCacheError",
    "LockTimeout",
    "LockUnavailable",
    "RemoteTier",
    "Store",
    "__version__",
    "check_ext",
    "check_key",
    "default_root",
    "process_stats",
    "settings",
]
