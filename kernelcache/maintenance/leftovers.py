"""What a scan finds under a root besides its entries: artifacts no metadata claims
(:func:`orphans`), the files of ``.tmp/`` and ``.quarantine/`` (:func:`aux_files`, and the
staging files left by writes that did not finish: :func:`stale_temps`), lock files and soft
locks nobody holds (:func:`lock_issues`) and files the cache does not know
(:func:`foreign_issues`).

Invariants: nothing here modifies or removes a file; each finding is an
:class:`~kernelcache.maintenance.records.Issue`. A file younger than
:data:`~kernelcache.maintenance.records.GRACE_SECONDS` may belong to a write in progress: it
is never an orphan, a stale staging file or a stale lock (a soft lock is judged by its holder
instead). Files are looked at relative to the directory's descriptor, which the caller opened
from its store (never through a symlink); nothing here is given the root.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Container, Iterable, Iterator, Mapping, Sequence, Set
from itertools import repeat
from operator import add

from ..fsio import changed_at
from ..store.layout import LOCK_DIR
from ..store.locks.flock import flock_held, lock_name
from ..store.locks.soft import STAGED, read_soft_record, soft_lock_stale
from .records import GRACE_SECONDS, AuxFile, Issue


def orphans(
    dfd: int,
    artifacts: Set[tuple[str, str]],
    metas: Container[str],
    committed: Mapping[str, str],
    now: float,
) -> Iterable[Issue]:
    """The artifact files ``(key, ext)`` listed in the root ``dfd`` that no committed metadata
    claims, once older than the grace period. ``metas``: the keys with a metadata file;
    ``committed``: the entries found good, key -> ext.

    Keys whose metadata exists but is bad are not listed here: they are corrupt entries.
    """
    candidates = artifacts - committed.items()
    unclaimed = [(k, e) for k, e in candidates if k in committed or k not in metas]
    for key, ext in sorted(unclaimed):
        name = f"{key}.{ext}"
        try:
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        except OSError:
            continue
        stamp = changed_at(st)
        if now - stamp <= GRACE_SECONDS:
            continue
        owner = committed.get(key)
        why = "no metadata" if owner is None else f"the entry holds a .{owner} artifact"
        yield Issue("orphan-artifact", name, why, key, st.st_size, stamp)


def aux_files(dfd: int, directory: str) -> tuple[AuxFile, ...]:
    """The files of the housekeeping ``directory`` (``.tmp``, ``.quarantine``), open as
    ``dfd``, sorted by path; none when it cannot be read."""
    found = []
    try:
        it = os.scandir(dfd)
    except OSError:
        return ()
    with it:
        for entry in it:
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISDIR(st.st_mode):
                continue
            found.append(AuxFile(f"{directory}/{entry.name}", st.st_size, changed_at(st)))
    found.sort(key=lambda f: f.path)
    return tuple(found)


def stale_temps(temp: Iterable[AuxFile], now: float) -> Iterator[Issue]:
    """An issue for each staging file of ``temp`` older than the grace period: a write that
    did not finish."""
    for f in temp:
        if now - f.mtime > GRACE_SECONDS:
            why = "staging file of a write that did not finish"
            yield Issue("stale-temp", f.path, why, None, f.size, f.mtime)


def lock_issues(dfd: int, live: Sequence[str], now: float, lock_stale: float) -> list[Issue]:
    """The stale locks of the root's ``.locks/``, open as ``dfd``.

    A ``.lock``/``.build.lock`` file is stale when its key has no entry, it is older than the
    grace period and nobody holds it (a non-blocking flock succeeds). A ``.softlock`` is stale
    when its holder is a dead process on this host or it has not been refreshed for
    ``lock_stale`` seconds; leftovers of broken soft locks are stale after the grace period.
    """
    issues: list[Issue] = []
    # The lock files of live entries are normal: set arithmetic sets them aside in C.
    try:
        names = set(os.listdir(dfd))
    except OSError:
        return []
    names.difference_update(map(add, live, repeat(".lock")))
    names.difference_update(map(add, live, repeat(".build.lock")))
    for name in sorted(names):
        issue = _lock_issue(dfd, name, now, lock_stale)
        if issue is not None:
            issues.append(issue)
    return issues


def _lock_issue(dfd: int, name: str, now: float, lock_stale: float) -> Issue | None:
    path = f"{LOCK_DIR}/{name}"
    parts = lock_name(name)
    if parts is None:
        if ".softlock.broken-" in name:
            why = "leftover of a broken soft lock"
        elif f".softlock{STAGED}" in name:
            why = "leftover of a soft lock being taken"
        else:
            return None  # .probe and other names of the lock machinery
        st = lstat_at(dfd, name)
        if st is None or now - changed_at(st) <= GRACE_SECONDS:
            return None
        return Issue("stale-lock", path, why, None, 0, changed_at(st))
    key, suffix = parts
    if suffix == ".softlock":
        record = read_soft_record(dfd, name)
        if record is None or not soft_lock_stale(record, lock_stale):
            return None
        who = f"host {record.get('host')} pid {record.get('pid')}"
        return Issue(
            "stale-lock", path, f"soft lock of a gone holder ({who})", key, 0, record.get("mtime")
        )
    st = lstat_at(dfd, name)
    if st is None or now - changed_at(st) <= GRACE_SECONDS or not stat.S_ISREG(st.st_mode):
        return None
    if flock_held(dfd, name):
        return None
    return Issue(
        "stale-lock", path, "lock file of a missing entry, not held", key, 0, changed_at(st)
    )


def foreign_issues(dfd: int, names: list[str]) -> Iterator[Issue]:
    """An issue for each file the cache does not know, with its size on disk."""
    for name in names:
        st = lstat_at(dfd, name)
        size = st.st_size if st is not None else 0
        why = "not a cache file; remove it by hand if it is not needed"
        yield Issue("foreign", name, why, size=size)


def lstat_at(dfd: int, name: str) -> os.stat_result | None:
    """The status of ``name`` in the directory ``dfd`` (a link's own); None where there is
    none to be had."""
    try:
        return os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except OSError:
        return None
