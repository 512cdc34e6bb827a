"""Per-process counters, and append-only per-process statistics logs under each root.

Counters are kept per writable root in memory. :func:`process_stats` sums them for this
process. Each process appends the changes since its last flush as one JSON line to its own file
``<root>/.stats/<host>-<pid>-<token>.jsonl`` (at most once a minute, after builds, and at exit),
so writers never contend and ``kernelcache stats`` aggregates every file it finds. A killed
process loses at most its last minute of counts.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import json
import logging
import os
import stat
import threading
import time
import uuid
from typing import Any

from .fsio import READ_FLAGS
from .jsonio import load_json
from .locks import open_subdir
from .process import HOST

logger = logging.getLogger(__name__)

STATS_DIR = ".stats"
LOG_VERSION = 1
FLUSH_INTERVAL = 60.0
#: a statistics log larger than this is not read (a process appends one line a minute)
MAX_LOG_BYTES = 256 << 20
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
)

_lock = threading.Lock()
_counts: dict[str, dict[str, float]] = {}
_flushed: dict[str, dict[str, float]] = {}
_logged_roots: set[str] = set()
_last_flush = time.monotonic()
_token = uuid.uuid4().hex[:8]


def _zero() -> dict[str, float]:
    return dict.fromkeys(COUNTERS, 0)


def count(root: str, **deltas: float) -> None:
    """Add ``deltas`` to the counters of ``root`` (names from :data:`COUNTERS`)."""
    with _lock:
        counters = _counts.get(root)
        if counters is None:
            counters = _counts[root] = _zero()
        for name, value in deltas.items():
            counters[name] += value
    if time.monotonic() - _last_flush > FLUSH_INTERVAL:
        flush()


def enable_log(root: str) -> None:
    """Append this process's counters for ``root`` to a log under it (at flushes and exit)."""
    with _lock:
        _logged_roots.add(root)


def process_stats() -> dict[str, Any]:
    """This process's counters, summed over every cache root it used."""
    total = _zero()
    with _lock:
        for counters in _counts.values():
            for name, value in counters.items():
                total[name] += value
    result: dict[str, Any] = {}
    for name, value in total.items():
        result[name] = round(value, 6) if name.endswith("seconds") else int(value)
    return result


def root_stats(root: str) -> dict[str, float]:
    with _lock:
        return dict(_counts.get(root) or _zero())


def flush() -> None:
    """Append the changes since the last flush to each logged root's per-process log."""
    global _last_flush
    with _lock:
        _last_flush = time.monotonic()
        pending = []
        for root in _logged_roots:
            now = _counts.get(root)
            if now is None:
                continue
            before = _flushed.get(root) or _zero()
            delta = {k: v - before.get(k, 0) for k, v in now.items() if v != before.get(k, 0)}
            if delta:
                pending.append((root, delta))
                _flushed[root] = dict(now)
    for root, delta in pending:
        _append(root, delta)


def log_name() -> str:
    """This process's log file name (the same under every root)."""
    return f"{HOST}-{os.getpid()}-{_token}.jsonl"


def _append(root: str, delta: dict[str, float]) -> None:
    line = json.dumps(
        {"v": LOG_VERSION, "host": HOST, "pid": os.getpid(), "time": time.time(), "delta": delta},
        sort_keys=True,
    )
    try:
        dfd = open_subdir(root, STATS_DIR, create=True)
    except OSError as e:
        logger.debug("kernelcache: no stats log under %s: %s", root, e)
        return
    try:
        fd = os.open(
            log_name(),
            os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
            0o666,
            dir_fd=dfd,
        )
        try:
            os.write(fd, (line + "\n").encode())
        finally:
            os.close(fd)
    except OSError as e:
        logger.debug("kernelcache: cannot append stats log under %s: %s", root, e)
    finally:
        os.close(dfd)


#: the largest counter value a log record may add (a log is untrusted: a huge integer or one
#: near float's limit must not overflow a sum, and no process counts this much)
MAX_DELTA = 2**53


def add_delta(totals: dict[str, float], delta: dict[Any, Any]) -> None:
    """Add a log record's counters to ``totals``; unknown names and anything but a number from
    0 to :data:`MAX_DELTA` are ignored (a log is untrusted input)."""
    for k, v in delta.items():
        if k in totals and type(v) in (int, float) and 0 <= v <= MAX_DELTA:
            totals[k] += v


def read_log_file(dfd: int, name: str) -> bytes:
    """The bytes of the log ``name`` in the directory ``dfd``, read without blocking: no
    symlink is followed, and anything but a regular file (a planted FIFO or device) or a file
    over :data:`MAX_LOG_BYTES` is refused.

    Raises:
        OSError: it cannot be read (the message says why).
    """
    fd = os.open(name, READ_FLAGS, dir_fd=dfd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        if st.st_size > MAX_LOG_BYTES:
            raise OSError(errno.EFBIG, f"larger than {MAX_LOG_BYTES >> 20} MiB")
        chunks = []
        remaining = MAX_LOG_BYTES + 1
        while remaining > 0:
            chunk = os.read(fd, min(remaining, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            remaining -= len(chunk)
        if remaining <= 0:
            raise OSError(errno.EFBIG, f"larger than {MAX_LOG_BYTES >> 20} MiB")
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_logs(root: str) -> tuple[dict[str, float], int, list[str]]:
    """Sum every stats log under ``root``.

    Returns (totals, number of processes, problems). Unreadable files and lines are skipped
    and listed in problems, never raised; nothing there can block the reader.
    """
    totals = _zero()
    processes = 0
    problems: list[str] = []
    directory = os.path.join(root, STATS_DIR)
    try:
        dfd = open_subdir(root, STATS_DIR, create=False)
    except OSError:
        return totals, 0, problems
    try:
        names = sorted(os.listdir(dfd))
        for name in names:
            if not name.endswith(".jsonl"):
                continue
            processes += 1
            path = os.path.join(directory, name)
            try:
                lines = read_log_file(dfd, name).splitlines()
            except OSError as e:
                problems.append(f"{path}: {e.strerror or e}")
                continue
            for number, raw in enumerate(lines, 1):
                with contextlib.suppress(ValueError):
                    record = load_json(raw)
                    delta = record.get("delta") if isinstance(record, dict) else None
                    if isinstance(delta, dict):
                        add_delta(totals, delta)
                        continue
                problems.append(f"{path}:{number}: unreadable line")
    finally:
        os.close(dfd)
    return totals, processes, problems


atexit.register(flush)
