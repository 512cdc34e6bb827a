"""This process's counters, kept per writable root in memory, and their flush to the root's log.

Counters are kept per writable root; :func:`process_stats` sums them for this process. Each
process appends the changes since its last flush as one JSON line to its own file
``<root>/.stats/<host>-<pid>-<token>.jsonl`` (every :data:`FLUSH_INTERVAL` seconds at most,
after builds, and at exit), so writers never contend. A killed process loses at most its last
interval of counts. The writable root is created for the log if this process has never seen it
exist (a job served only by read-only layers or a remote tier); a root deleted while the process
ran stays deleted, and its counts are dropped. A root that cannot hold the log is warned about
once.

Hits and misses count one lookup per kernel (the hit rate); entries read beside a kernel and
memoized values are counted apart (:data:`LOOKUP_CLASSES`). A lock a call waited on for its
whole lock timeout is noted in the log at once, with who held it (:func:`note_lock_wait`).
Counting never raises.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import threading
import time
import uuid
from typing import Any

from ..errors import (
    InvalidValue,
)
from ..fsio import open_planted
from ..process import HOST, warn_once
from ..store.layout import STATS_DIR, open_subdir

logger = logging.getLogger(__name__)

LOG_VERSION = 1
FLUSH_INTERVAL = 60.0


#: counters every snapshot reports, in this order
COUNTERS = (
    "hits",
    "misses",
    "builds",
    "puts",
    "corrupt",
    "untrusted",
    "errors",
    "lock_waits",
    "lock_timeouts",
    "bytes_read",
    "bytes_written",
    "build_seconds",
    "remote_hits",
    "remote_misses",
    "remote_errors",
    "remote_puts",
    "unauthenticated",
    "kept_unverified",
    "companion_hits",
    "companion_misses",
    "memo_hits",
    "memo_misses",
)
#: lookups counted apart from the hit rate's (which is one lookup per kernel): ``companion``,
#: an entry read beside another (a kernel's PTX); ``memo``, a memoized value (an identity)
LOOKUP_CLASSES = ("companion", "memo")
#: counters of each remote tier (``"tiers"`` in a log record, keyed by the tier's label)
TIER_COUNTERS = (
    "hits",
    "misses",
    "errors",
    "timeouts",
    "bytes_read",
    "puts",
    "bytes_written",
    "backfills",
    "skipped",  # requests not made: a breaker open, the server full, another's first request
)

_lock = threading.Lock()
_counts: dict[str, dict[str, float]] = {}
_flushed: dict[str, dict[str, float]] = {}
_tier_counts: dict[str, dict[str, dict[str, float]]] = {}  # root -> tier label -> counters
_tier_flushed: dict[str, dict[str, dict[str, float]]] = {}
_logged_roots: set[str] = set()
#: logged roots this process has seen exist: a flush never creates one of them again
_existed: set[str] = set()
#: whether a log that cannot be written is warned about (not after a command reported an error,
#: which named the root: :func:`quiet`)
_warn_unlogged = True
_last_flush = time.monotonic()
_token = uuid.uuid4().hex[:8]


def zero_counters() -> dict[str, float]:
    return dict.fromkeys(COUNTERS, 0)


def count(root: str, **deltas: float) -> None:
    """Add ``deltas`` to the counters of ``root`` (names from :data:`COUNTERS`)."""
    with _lock:
        counters = _counts.get(root)
        if counters is None:
            counters = _counts[root] = zero_counters()
        for name, value in deltas.items():
            counters[name] += value
    if time.monotonic() - _last_flush > FLUSH_INTERVAL:
        flush()


def count_hit(root: str, name: str, nbytes: int) -> None:
    """:func:`count` of one hit of the counter ``name`` that read ``nbytes``: the hot path's."""
    with _lock:
        counters = _counts.get(root)
        if counters is None:
            counters = _counts[root] = zero_counters()
        counters[name] += 1
        counters["bytes_read"] += nbytes
    if time.monotonic() - _last_flush > FLUSH_INTERVAL:
        flush()


def lookup_counters(counted: bool | str) -> tuple[str, str] | None:
    """The (hit, miss) counters of a lookup: the hit rate's for True, those of the class
    ``counted`` (one of :data:`LOOKUP_CLASSES`), None for False (not counted).

    Raises:
        ValueError: ``counted`` is none of these.
    """
    if counted is True:
        return "hits", "misses"
    if counted is False:
        return None
    if counted in LOOKUP_CLASSES:
        return f"{counted}_hits", f"{counted}_misses"
    raise InvalidValue(f"counted must be True, False or one of {', '.join(LOOKUP_CLASSES)}")


def count_tier(root: str, tier: str, **deltas: float) -> None:
    """Add ``deltas`` (names from :data:`TIER_COUNTERS`; others are ignored) to the counters
    of the remote tier labelled ``tier`` under ``root``."""
    with _lock:
        counters = _tier_counts.setdefault(root, {}).setdefault(
            tier, dict.fromkeys(TIER_COUNTERS, 0)
        )
        for name, value in deltas.items():
            if name in counters:
                counters[name] += value


def tier_stats() -> dict[str, dict[str, float]]:
    """This process's counters of each remote tier, summed over every cache root."""
    total: dict[str, dict[str, float]] = {}
    with _lock:
        for tiers in _tier_counts.values():
            for tier, counters in tiers.items():
                add_delta(total.setdefault(tier, dict.fromkeys(TIER_COUNTERS, 0)), counters)
    return total


def _changes(now: dict[str, float], before: dict[str, float] | None) -> dict[str, float]:
    before = before or {}
    return {k: v - before.get(k, 0) for k, v in now.items() if v != before.get(k, 0)}


def enable_log(root: str) -> None:
    """Append this process's counters for ``root`` to a log under it (at flushes and exit)."""
    with _lock:
        _logged_roots.add(root)
    if os.path.isdir(root):
        _existed.add(root)


def process_stats() -> dict[str, Any]:
    """This process's counters, summed over every cache root it used."""
    total = zero_counters()
    with _lock:
        for counters in _counts.values():
            for name, value in counters.items():
                total[name] += value
    result: dict[str, Any] = {}
    for name, value in total.items():
        result[name] = round(value, 6) if name.endswith("seconds") else int(value)
    return result


def flush() -> None:
    """Append the changes since the last flush to each logged root's per-process log."""
    global _last_flush
    with _lock:
        _last_flush = time.monotonic()
        pending = []
        for root in _logged_roots:
            delta = _changes(_counts.get(root) or {}, _flushed.get(root))
            tiers = {}
            for tier, now in _tier_counts.get(root, {}).items():
                changed = _changes(now, _tier_flushed.get(root, {}).get(tier))
                if changed:
                    tiers[tier] = changed
                    _tier_flushed.setdefault(root, {})[tier] = dict(now)
            if delta or tiers:
                pending.append((root, delta, tiers))
                _flushed[root] = dict(_counts.get(root) or {})
    for root, delta, tiers in pending:
        _append(root, delta, **({"tiers": tiers} if tiers else {}))


atexit.register(flush)  # what a process counted since its last flush is logged when it exits


def quiet() -> None:
    """Say nothing more of a log that cannot be written: a command has reported an error,
    which named what was wrong with the root."""
    global _warn_unlogged
    _warn_unlogged = False


def log_name() -> str:
    """This process's log file name (the same under every root)."""
    return f"{HOST}-{os.getpid()}-{_token}.jsonl"


def note_lock_wait(root: str, key: str, waited: float, holder: dict[str, Any] | None) -> None:
    """Note in this process's log under ``root`` that it waited ``waited`` seconds for the lock
    of ``key``, held by ``holder`` (``{"pid", "host", "since"}``, None if unknown)."""
    with _lock:
        if root not in _logged_roots:
            return
    _append(root, {}, waited={"key": key, "seconds": waited, "holder": holder})


def _stats_dir(root: str) -> int | None:
    """``<root>/.stats/``, opened (created if missing). The root is created first only if
    this process has never seen it exist (a job served only by read-only layers or a remote
    tier has written nothing there before); one that existed (when the cache was opened, or
    since this process put into it) and is gone was deleted while the process ran: None.

    Raises:
        OSError: it cannot be opened or created.
    """
    try:
        dfd = open_subdir(root, STATS_DIR, create=True)
    except FileNotFoundError:  # the root is missing
        with _lock:
            put_into = bool((_counts.get(root) or {}).get("puts"))
        if root in _existed or put_into:
            return None
        os.makedirs(root, exist_ok=True)
        dfd = open_subdir(root, STATS_DIR, create=True)
    _existed.add(root)
    return dfd


def _append(root: str, delta: dict[str, float], **extra: object) -> None:
    record = {"v": LOG_VERSION, "host": HOST, "pid": os.getpid(), "time": time.time()}
    line = json.dumps({**record, "delta": delta, **extra}, sort_keys=True)
    try:
        dfd = _stats_dir(root)
        if dfd is None:
            logger.debug("kernelcache: statistics not logged under %s: deleted", root)
            return
        try:
            # (what was planted under the log's name, a FIFO or a hard link, is refused)
            fd = open_planted(log_name(), os.O_WRONLY | os.O_APPEND | os.O_CREAT, dir_fd=dfd)
            try:
                os.write(fd, (line + "\n").encode())
            finally:
                os.close(fd)
        finally:
            os.close(dfd)
    except OSError as e:
        if not _warn_unlogged:
            logger.debug("kernelcache: statistics not logged under %s: %s", root, e)
            return
        warn_once(
            logger,
            (root, "stats-log"),
            "kernelcache: cannot log statistics under %s: %s (make the root writable, or set "
            "KERNELCACHE_STATS_LOG=0)",
            root,
            e.strerror or e,
        )


#: the largest counter value a log record may add (a log is untrusted: a huge integer or one
#: near float's limit must not overflow a sum, and no process counts this much)
MAX_DELTA = 2**53


def add_delta(totals: dict[str, float], delta: dict[Any, Any]) -> None:
    """Add a log record's counters to ``totals``; unknown names and anything but a number from
    0 to :data:`MAX_DELTA` are ignored (a log is untrusted input)."""
    for k, v in delta.items():
        if k in totals and type(v) in (int, float) and 0 <= v <= MAX_DELTA:
            totals[k] += v


#: the most remote tiers a log record or the summary may name (labels come from URLs)
MAX_TIERS = 64


def add_tiers(totals: dict[str, dict[str, float]], tiers: object) -> None:
    """Add a record's per-tier counters (``{label: {counter: n}}``) to ``totals``; anything
    malformed is ignored, and at most :data:`MAX_TIERS` labels are kept (untrusted input)."""
    if not isinstance(tiers, dict):
        return
    for label, delta in tiers.items():
        if not isinstance(label, str) or len(label) > 1024 or not isinstance(delta, dict):
            continue
        if label not in totals and len(totals) >= MAX_TIERS:
            continue
        add_delta(totals.setdefault(label, dict.fromkeys(TIER_COUNTERS, 0)), delta)
