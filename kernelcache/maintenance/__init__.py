"""Maintenance of a root, on request: scanning, verifying, pruning (the size cap kept while the
cache runs is :mod:`kernelcache.capacity`'s).

What enters: a store (and the settings that name its limits). What leaves: a scan (entries and
problems found), plans (what a prune, a repair or a clear would remove, and why) and their
results once executed. Planning never removes anything; executing removes files only through
the store's removal functions or the locks.
"""

from .scan import CacheScan, scan

__all__ = ["CacheScan", "scan"]
