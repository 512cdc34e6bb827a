"""Counters of this process, their logs under a root's ``.stats/`` and the summary they fold
into.

What enters: counts from the store, the cache and the remote tiers (hits, misses, builds, puts,
corrupt entries, lock waits, per-tier counts). What leaves: :func:`process_stats` for this
process, and per-process append-only logs that the command line reads and folds into one summary.
Counting never raises and never blocks a read or a write. The summary (:mod:`.summary`) is
imported where it is first used: a process that only counts never folds.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .counters import (
    COUNTERS,
    FLUSH_INTERVAL,
    LOG_VERSION,
    LOOKUP_CLASSES,
    MAX_DELTA,
    MAX_TIERS,
    TIER_COUNTERS,
    add_delta,
    add_tiers,
    count,
    count_hit,
    count_tier,
    enable_log,
    flush,
    log_name,
    lookup_counters,
    note_lock_wait,
    process_stats,
    tier_stats,
)
from .logs import (
    MAX_LOG_BYTES,
    read_log_file,
)

if TYPE_CHECKING:
    from .summary import (
        LOG_FOLD_AGE,
        SUMMARY_NAME,
        fold_logs,
        foldable_logs,
        lock_waits,
        read_logs,
        read_summary,
        zero_logs,
    )

#: the summary's names (:mod:`.summary`: what the commands read), imported at first use
_SUMMARY = (
    "LOG_FOLD_AGE",
    "SUMMARY_NAME",
    "fold_logs",
    "foldable_logs",
    "lock_waits",
    "read_logs",
    "read_summary",
    "zero_logs",
)


def __getattr__(name: str) -> Any:
    if name not in _SUMMARY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from . import summary

    return getattr(summary, name)


__all__ = [
    "COUNTERS",
    "FLUSH_INTERVAL",
    "LOG_FOLD_AGE",
    "LOG_VERSION",
    "LOOKUP_CLASSES",
    "MAX_DELTA",
    "MAX_LOG_BYTES",
    "MAX_TIERS",
    "SUMMARY_NAME",
    "TIER_COUNTERS",
    "add_delta",
    "add_tiers",
    "count",
    "count_hit",
    "count_tier",
    "enable_log",
    "flush",
    "fold_logs",
    "foldable_logs",
    "lock_waits",
    "log_name",
    "lookup_counters",
    "note_lock_wait",
    "process_stats",
    "read_log_file",
    "read_logs",
    "read_summary",
    "tier_stats",
    "zero_logs",
]
