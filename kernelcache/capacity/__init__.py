"""The size cap of a writable root (``KERNELCACHE_MAX_SIZE``, ``Cache(max_size=)``), kept while the
cache runs.

What enters: a store and its cap. What leaves: :class:`~.size_cap.SizeCap`, which a cache holds:
every put adds its bytes to the root's shared usage estimate (:mod:`.usage`), and when the
estimate passes the cap an eviction pass (:mod:`.eviction`: the least recently used entries, down
to the low-water mark) runs in a helper process (:mod:`.helper`) or a thread. Offline tools that
scan, verify and prune a root on request are :mod:`kernelcache.maintenance`'s; a pass removes
files only through the store's removal functions, under the entries' locks.
"""

from .size_cap import SizeCap

__all__ = ["SizeCap"]
