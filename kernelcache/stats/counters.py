"""Per-process counters, their append-only logs under each root, and the summary they fold into.

Counters are kept per writable root in memory; :func:`process_stats` sums them for this
process. Each process appends the changes since its last flush as one JSON line to its own file
``<root>/.stats/<host>-<pid>-<token>.jsonl`` (every :data:`FLUSH_INTERVAL` seconds at most,
after builds, and at exit), so writers never contend and ``kernelcache stats`` adds up every
log it finds. A killed process loses at most its last interval of counts. The writable root is
created for the log if it does not exist yet (a job served only by read-only layers); a root
that cannot hold it is warned about once.

Hits and misses count one lookup per kernel (the hit rate); entries read beside a kernel and
memoized values are counted apart (:data:`LOOKUP_CLASSES`).

The logs of finished processes are folded into ``.stats/summary.jsonl`` (:func:`fold_logs`,
run by ``prune``), so that totals are kept, never lost or counted twice, while logs go away.
Logs and the summary are untrusted input: a bad line or value is skipped, never raised.

A lock a call waited on for its whole lock timeout is noted in the log at once, with who held
it (:func:`note_lock_wait`), for ``kernelcache doctor`` (:func:`lock_waits`).
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
from collections.abc import Iterable
from typing import Any

from ..errors import (
    FileTooLarge,
    InvalidValue,
    LockTimeout,
    LockUnavailable,
    NotRegularFile,
    UnreadableFile,
)
from ..fsio import READ_FLAGS, changed_at
from ..jsonio import load_json
from ..process import HOST, warn_once
from ..store.layout import STATS_DIR, open_subdir, replace_file
from ..store.locks.liveness import pid_alive
from ..store.locks.locker import Locker

logger = logging.getLogger(__name__)

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
)

_lock = threading.Lock()
_counts: dict[str, dict[str, float]] = {}
_flushed: dict[str, dict[str, float]] = {}
_tier_counts: dict[str, dict[str, dict[str, float]]] = {}  # root -> tier label -> counters
_tier_flushed: dict[str, dict[str, dict[str, float]]] = {}
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


def count_hit(root: str, name: str, nbytes: int) -> None:
    """:func:`count` of one hit of the counter ``name`` that read ``nbytes``: the hot path's."""
    with _lock:
        counters = _counts.get(root)
        if counters is None:
            counters = _counts[root] = _zero()
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


def _stats_dir(root: str) -> int:
    """``<root>/.stats/``, opened; the root is created first if it does not exist yet (a job
    served only by read-only layers or a remote tier has written nothing there before).

    Raises:
        OSError: it cannot be opened or created.
    """
    try:
        return open_subdir(root, STATS_DIR, create=True)
    except FileNotFoundError:
        os.makedirs(root, exist_ok=True)
        return open_subdir(root, STATS_DIR, create=True)


def _append(root: str, delta: dict[str, float], **extra: object) -> None:
    record = {"v": LOG_VERSION, "host": HOST, "pid": os.getpid(), "time": time.time()}
    line = json.dumps({**record, "delta": delta, **extra}, sort_keys=True)
    try:
        dfd = _stats_dir(root)
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
        finally:
            os.close(dfd)
    except OSError as e:
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
            raise NotRegularFile(errno.EINVAL, "not a regular file")
        if st.st_size > MAX_LOG_BYTES:
            raise FileTooLarge(errno.EFBIG, f"larger than {MAX_LOG_BYTES >> 20} MiB")
        chunks = []
        remaining = MAX_LOG_BYTES + 1
        while remaining > 0:
            chunk = os.read(fd, min(remaining, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            remaining -= len(chunk)
        if remaining <= 0:
            raise FileTooLarge(errno.EFBIG, f"larger than {MAX_LOG_BYTES >> 20} MiB")
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_logs(
    root: str, tiers: dict[str, dict[str, float]] | None = None
) -> tuple[dict[str, float], int, list[str]]:
    """Sum every stats log under ``root`` (and, into ``tiers`` if given, the counters of each
    remote tier): the summary, the logs, and the logs a fold renamed out of the way that its
    summary does not name yet (a fold killed half-way).

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
        try:
            summary = _read_summary(dfd)
        except ValueError:
            summary = None
        absorbed = set(summary["folded"]) if summary else set()
        names = sorted(os.listdir(dfd))
        for name in names:
            if name.endswith(".jsonl" + _FOLDING):
                if name[: -len(_FOLDING)] in absorbed:
                    continue  # counted by the summary
            elif not name.endswith(".jsonl"):
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
                        if tiers is not None:
                            add_tiers(tiers, record.get("tiers"))
                        continue
                problems.append(f"{path}:{number}: unreadable line")
    finally:
        os.close(dfd)
    return totals, processes, problems


# -- folding logs into the summary ----------------------------------------------------------
#: statistics logs of other hosts are folded once untouched for this long
LOG_FOLD_AGE = 86400.0
SUMMARY_NAME = "summary.jsonl"
_FOLDING = ".folding"
_SUMMARY_LOCK = "stats-summary"


def lock_waits(root: str) -> list[dict[str, Any]]:
    """The lock waits noted in the statistics logs under ``root`` (:func:`note_lock_wait`),
    oldest first: ``{"time", "host", "pid", "key", "seconds", "holder"}``; malformed ones are
    skipped."""
    found: list[dict[str, Any]] = []
    try:
        dfd = open_subdir(root, STATS_DIR, create=False)
    except OSError:
        return found
    try:
        try:
            names = os.listdir(dfd)
        except OSError:
            names = []
        for name in names:
            if not name.endswith(".jsonl") or name == SUMMARY_NAME:
                continue
            try:
                lines = read_log_file(dfd, name).splitlines()
            except OSError:
                continue
            for raw in lines:
                if b'"waited"' not in raw:
                    continue
                with contextlib.suppress(ValueError):
                    wait = _lock_wait(load_json(raw))
                    if wait is not None:
                        found.append(wait)
    finally:
        os.close(dfd)
    return sorted(found, key=lambda w: w["time"])


def _lock_wait(record: Any) -> dict[str, Any] | None:
    """A lock-wait record of a log line, checked (a log is untrusted); None if it is not one."""
    if not isinstance(record, dict) or not isinstance(record.get("waited"), dict):
        return None
    waited, holder = record["waited"], record["waited"].get("holder")
    numbers = (record.get("time"), waited.get("seconds"))
    if not all(isinstance(n, (int, float)) and 0 <= n < 1e11 for n in numbers):
        return None
    if not isinstance(waited.get("key"), str) or type(record.get("pid")) is not int:
        return None
    if holder is not None and not (
        isinstance(holder, dict)
        and type(holder.get("pid")) is int
        and isinstance(holder.get("host"), str)
        and (holder.get("since") is None or type(holder.get("since")) in (int, float))
    ):
        return None
    return {
        "time": record["time"],
        "host": str(record.get("host")),
        "pid": record["pid"],
        "key": waited["key"],
        "seconds": waited["seconds"],
        "holder": holder,
    }


def foldable_logs(root: str, now: float | None = None) -> list[str]:
    """Statistics logs of finished processes: a dead pid on this host, or untouched for
    :data:`LOG_FOLD_AGE` seconds (any host); and logs a killed fold left renamed (the next
    fold finishes them)."""
    now = time.time() if now is None else now
    directory = os.path.join(root, STATS_DIR)
    try:
        it = os.scandir(directory)
    except OSError:
        return []
    host = HOST
    found = []
    with it:
        for entry in it:
            name = entry.name
            if name.endswith(".jsonl" + _FOLDING):  # hidden by a fold that was killed
                found.append(name)
                continue
            if not name.endswith(".jsonl") or name == SUMMARY_NAME:
                continue
            parts = name[: -len(".jsonl")].rsplit("-", 2)
            if len(parts) != 3 or not (parts[1].isascii() and parts[1].isdigit()):
                continue
            if parts[0] == host and not pid_alive(int(parts[1])):
                found.append(name)
                continue
            try:
                if now - changed_at(entry.stat(follow_symlinks=False)) > LOG_FOLD_AGE:
                    found.append(name)
            except OSError:
                continue
    return sorted(found)


def read_summary(root: str) -> dict[str, Any] | None:
    """The folded statistics summary of a root, or None when there is none (or it is bad)."""
    try:
        dfd = open_subdir(root, STATS_DIR, create=False)
    except OSError:
        return None
    try:
        return _read_summary(dfd)
    except ValueError:
        return None
    finally:
        os.close(dfd)


def _read_summary(dfd: int) -> dict[str, Any] | None:
    """The summary record; None if absent. Raises ValueError if it exists but is unreadable."""
    try:
        raw = read_log_file(dfd, SUMMARY_NAME)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise UnreadableFile(f"cannot read {SUMMARY_NAME}: {e.strerror or e}") from e
    try:
        record = load_json(raw)
    except ValueError:
        raise UnreadableFile(f"{SUMMARY_NAME} is not valid JSON") from None
    if (
        not isinstance(record, dict)
        or not isinstance(record.get("delta"), dict)
        or type(record.get("logs")) is not int
        or not 0 <= record["logs"] <= MAX_DELTA
        or not isinstance(record.get("folded"), list)
        or not all(isinstance(name, str) for name in record["folded"])
    ):
        raise UnreadableFile(f"{SUMMARY_NAME} is not a kernelcache statistics summary")
    return record


def _sum_log(
    dfd: int, name: str, totals: dict[str, float], tiers: dict[str, dict[str, float]]
) -> None:
    with contextlib.suppress(OSError):
        lines = read_log_file(dfd, name).splitlines()
        for raw in lines:
            try:
                record = load_json(raw)
                delta = record.get("delta")
            except (ValueError, AttributeError):
                continue
            if isinstance(delta, dict):
                add_delta(totals, delta)
                add_tiers(tiers, record.get("tiers"))


def fold_logs(
    locker: Locker, names: Iterable[str], *, timeout: float = 10.0
) -> tuple[int, str | None]:
    """Fold the named statistics logs of ``locker``'s root into ``.stats/summary.jsonl``;
    (logs folded, error).

    Totals are preserved and never counted twice by :func:`read_logs`: each log is first
    renamed out of its view (``*.jsonl.folding``), then the summary is replaced atomically
    (naming the logs it absorbed), then the renamed logs are deleted. After a crash the next
    fold finishes the job: a renamed log the summary names is deleted, any other is folded.
    Folds are serialized by a lock; the summary is never rewritten if it is unreadable.
    """
    try:
        held = locker.acquire(_SUMMARY_LOCK, shared=False, timeout=timeout)
    except LockTimeout:
        return 0, "another process is folding the statistics logs"
    except LockUnavailable as e:
        return 0, str(e)
    try:
        try:
            dfd = open_subdir(locker.root, STATS_DIR, create=False)
        except FileNotFoundError:
            return 0, None
        try:
            return _fold_locked(dfd, names), None
        except ValueError as e:
            return 0, str(e)
        except OSError as e:
            return 0, f"cannot fold statistics logs: {e.strerror}"
        finally:
            os.close(dfd)
    finally:
        held.release()


def _may_replace(dfd: int, name: str) -> bool:
    """Whether this user may replace the file ``name`` in the directory ``dfd``: anyone may in
    a plain directory; in a sticky one, only the file's owner, the directory's and root."""
    try:
        st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        return True
    me = os.geteuid()
    directory = os.fstat(dfd)
    return me in (0, st.st_uid, directory.st_uid) or not directory.st_mode & stat.S_ISVTX


def _fold_locked(dfd: int, names: Iterable[str]) -> int:
    if not _may_replace(dfd, SUMMARY_NAME):
        return 0  # another user's summary in the sticky .stats/: theirs to fold
    summary = _read_summary(dfd)
    absorbed = set(summary["folded"]) if summary else set()
    pending: list[str] = []
    for name in os.listdir(dfd):
        if name.endswith(_FOLDING):
            if name[: -len(_FOLDING)] in absorbed:
                with contextlib.suppress(FileNotFoundError, PermissionError):
                    os.unlink(name, dir_fd=dfd)  # counted by the summary before a crash
            else:
                pending.append(name)
    for name in names:
        if name == SUMMARY_NAME or not name.endswith(".jsonl") or "/" in name:
            continue
        try:
            os.rename(name, name + _FOLDING, src_dir_fd=dfd, dst_dir_fd=dfd)
        except (FileNotFoundError, PermissionError):  # gone, or another user's (sticky .stats/)
            continue
        pending.append(name + _FOLDING)
    if not pending:
        return 0
    totals = dict.fromkeys(COUNTERS, 0.0)
    tiers: dict[str, dict[str, float]] = {}
    if summary:
        add_delta(totals, summary["delta"])
        add_tiers(tiers, summary.get("tiers"))
    for name in pending:
        _sum_log(dfd, name, totals, tiers)
    record = {
        "v": LOG_VERSION,
        "summary": True,
        "time": time.time(),
        "logs": (summary["logs"] if summary else 0) + len(pending),
        "delta": {k: (round(v, 6) if k.endswith("seconds") else int(v)) for k, v in totals.items()},
        "folded": sorted(n[: -len(_FOLDING)] for n in pending),
    }
    if tiers:
        record["tiers"] = {t: {k: int(v) for k, v in c.items()} for t, c in tiers.items()}
    replace_file(dfd, SUMMARY_NAME, (json.dumps(record, sort_keys=True) + "\n").encode())
    for name in pending:
        with contextlib.suppress(FileNotFoundError, PermissionError):  # (named by the summary)
            os.unlink(name, dir_fd=dfd)
    return len(pending)


def zero_logs(locker: Locker, *, timeout: float = 10.0) -> tuple[int, list[str], str | None]:
    """Zero the statistics of ``locker``'s root (``kernelcache stats --zero``): remove every
    statistics log and the folded summary; (files removed, files left, error).

    Runs under the lock folds take, so no fold writes back what was removed. Each file goes
    with one ``unlink``: a process that appends afterwards starts a new log holding only what
    it counted since its last flush, so nothing is counted twice (what a process flushes at
    that very moment may be lost with the zeroed counts). Logs of other users in a sticky
    ``.stats/`` cannot be removed: they are left and named.
    """
    try:
        held = locker.acquire(_SUMMARY_LOCK, shared=False, timeout=timeout)
    except LockTimeout:
        return 0, [], "another process is folding the statistics logs; try again"
    except LockUnavailable as e:
        return 0, [], str(e)
    removed, left = 0, []
    try:
        try:
            dfd = open_subdir(locker.root, STATS_DIR, create=False)
        except FileNotFoundError:
            return 0, [], None
        try:
            for name in sorted(os.listdir(dfd)):
                if not (name.endswith(".jsonl") or name.endswith(".jsonl" + _FOLDING)):
                    continue
                try:
                    os.unlink(name, dir_fd=dfd)
                    removed += 1
                except FileNotFoundError:
                    continue
                except OSError as e:
                    left.append(f"{os.path.join(locker.root, STATS_DIR, name)}: {e.strerror}")
        except OSError as e:
            return removed, left, f"cannot zero the statistics: {e.strerror}"
        finally:
            os.close(dfd)
    finally:
        held.release()
    return removed, left, None


atexit.register(flush)
