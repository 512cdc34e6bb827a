"""The summary logs fold into (``.stats/summary.jsonl``), and the lock waits ``doctor`` shows.

The logs of finished processes are folded into the summary (:func:`fold_logs`, run by
``prune``) under a lock, so that totals are kept, never lost or counted twice, while logs go
away. The summary is untrusted input: a bad line is skipped, a file that is not a summary is
an :class:`~kernelcache.errors.UnreadableFile`.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import time
from collections.abc import Iterable
from typing import Any

from ..errors import (
    LockTimeout,
    LockUnavailable,
    UnreadableFile,
)
from ..fsio import changed_at, load_json
from ..process import HOST, pid_alive
from ..store.layout import STATS_DIR, open_subdir, replace_file
from ..store.locks.locker import Locker
from ..store.removal import remove_own_file
from .counters import (
    COUNTERS,
    LOG_VERSION,
    MAX_DELTA,
    add_delta,
    add_tiers,
    zero_counters,
)
from .logs import read_log_file, read_log_lines

#: statistics logs of other hosts are folded once untouched for this long
LOG_FOLD_AGE = 86400.0
SUMMARY_NAME = "summary.jsonl"
#: the largest summary that is read: one record, naming the logs its last fold absorbed (a fold
#: of 400,000 logs)
MAX_SUMMARY_BYTES = 16 << 20
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
                lines = read_log_lines(dfd, name)
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


def foldable_logs(root: str | int, now: float | None = None) -> list[str]:
    """Statistics logs of finished processes: a dead pid on this host, or untouched for
    :data:`LOG_FOLD_AGE` seconds (any host); and logs a killed fold left renamed (the next
    fold finishes them). ``root``: the root, or its ``.stats/`` directory open as a descriptor
    (which a scan opened from its store; left open)."""
    now = time.time() if now is None else now
    directory = os.path.join(root, STATS_DIR) if isinstance(root, str) else root
    try:
        it = os.scandir(directory)
    except OSError:
        return []
    host = HOST
    found = []
    with it:
        for entry in it:
            name = entry.name
            if not entry.is_file(follow_symlinks=False):  # (a directory planted: never a log)
                continue
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
        # (no larger: its JSON would hold many times its bytes in memory)
        raw = read_log_file(dfd, SUMMARY_NAME, MAX_SUMMARY_BYTES)
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
        lines = read_log_lines(dfd, name)
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
    with os.scandir(dfd) as it:
        listed = [e.name for e in it if e.is_file(follow_symlinks=False)]  # (no directory)
    for name in listed:
        if name.endswith(_FOLDING):
            if name[: -len(_FOLDING)] in absorbed:
                with contextlib.suppress(PermissionError):
                    remove_own_file(dfd, name)  # counted by the summary before a crash
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
        with contextlib.suppress(PermissionError):  # (named by the summary)
            remove_own_file(dfd, name)
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
                    removed += remove_own_file(dfd, name)
                except OSError as e:
                    left.append(f"{os.path.join(locker.root, STATS_DIR, name)}: {e.strerror}")
        except OSError as e:
            return removed, left, f"cannot zero the statistics: {e.strerror}"
        finally:
            os.close(dfd)
    finally:
        held.release()
    return removed, left, None


def read_logs(
    root: str, tiers: dict[str, dict[str, float]] | None = None
) -> tuple[dict[str, float], int, list[str]]:
    """Sum every stats log under ``root`` (and, into ``tiers`` if given, the counters of each
    remote tier): the summary, the logs, and the logs a fold renamed out of the way that its
    summary does not name yet (a fold killed half-way).

    Returns (totals, number of processes, problems). Unreadable files and lines are skipped
    and listed in problems, never raised; nothing there can block the reader.
    """
    totals = zero_counters()
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
                lines = read_log_lines(dfd, name)
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
