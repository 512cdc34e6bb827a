"""kernelcache: a persistent, content-addressed cache of compiled GPU kernels.

This package imports neither jax nor triton: operators can inspect and prune caches on machines
that have neither. See ``Cache`` for the guarantees across processes.
"""

from ._version import __version__
from .cache import BuildItem, Cache
from .config import settings
from .errors import CacheError, ConfigError, KernelCacheError, LockTimeout, LockUnavailable
from .keys import check_ext, check_key
from .remote import RemoteTier
from .stats.counters import process_stats
from .store.entry import Artifact
from .store.layout import default_root
from .store.root import Store

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
