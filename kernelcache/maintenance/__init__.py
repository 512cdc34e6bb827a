"""Maintenance of a root: scanning, verifying, pruning and the size cap.

What enters: a store (and the settings that name its limits). What leaves: a scan (entries and
problems found), plans (what a prune, a repair or a clear would remove, and why) and their
results once executed. Planning never removes anything; executing removes files only through
the store's removal functions or the locks.
"""

from .scan import CacheScan, scan

__all__ = ["CacheScan", "scan"]
