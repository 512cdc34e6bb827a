"""Scanning a cache root into immutable records; problems are collected, never raised.

:func:`scan` lists a root once and describes every entry (:class:`EntryInfo`) from its
metadata, without reading artifacts: it is what ``stats``, ``ls``, ``prune`` and ``export`` use.
:func:`~kernelcache.maintenance.verify.verify` additionally reads every artifact and checks
its size, digest and structure (:mod:`kernelcache.formats`).

What is found wrong lands in ``CacheScan.issues`` as :class:`Issue` records (kinds in
:data:`~kernelcache.maintenance.records.ISSUE_KINDS`): bad entries here, the files that are not
entries (orphans, staging files, stale locks, foreign files) by
:mod:`kernelcache.maintenance.leftovers`; nothing here modifies an entry. Deciding what to
delete is :mod:`kernelcache.maintenance.prune`'s job.

Speed: metadata already described by the scan index (:mod:`kernelcache.maintenance.index`) is not read
again; the index is rewritten when a scan of a writable root finds it out of date. The index
is a hint for listing (read only if the trust policy accepts it); sizes and last-used stamps
of a scan with ``last_used`` come from the file system, and a prune re-reads what it selects
on from each entry under its lock.

A scan works on a :class:`~kernelcache.store.root.Store` (:func:`scan_store`; :func:`scan`
opens one for a root it is given): the store opens the root once, and its directories, and
applies its trust policy; the modules a scan hands work to are given those descriptors
(:func:`in_directory`), never the root.

Guarantees across processes: a scan runs concurrently with writers, readers and pruners. An
entry published or deleted during the scan may or may not be listed; a half-published entry
(artifact without metadata) is reported as an orphan only once it is older than
:data:`~kernelcache.maintenance.records.GRACE_SECONDS`, so a write in progress is never reported as a problem.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from operator import itemgetter
from typing import TypeVar

from ..config import DEFAULTS
from ..keys import KEY_PATTERN, META_EXT, all_keys, valid_ext
from ..problem import Problem
from ..stats.summary import foldable_logs
from ..store.layout import (
    LOCK_DIR,
    QUARANTINE_DIR,
    STATS_DIR,
    TMP_DIR,
    known_directories,
)
from ..store.root import Store
from ..table import COLUMNS, EntryInfo, EntryTable
from .index import (
    INDEX_NAME,
    index_matches,
    listing_signature,
    load_index,
    save_index,
)
from .leftovers import (
    aux_files,
    foreign_issues,
    lock_issues,
    lstat_at,
    orphans,
    stale_temps,
)
from .records import AuxFile, CacheScan, Issue, Progress, read_entry, with_last_used

logger = logging.getLogger(__name__)
T = TypeVar("T")


# -- listing ------------------------------------------------------------------------------
@dataclass
class _Listing:
    metas: dict[str, int]  # key -> inode of <key>.json
    arts: dict[str, str]  # key -> ext of its artifact file (the first one listed)
    extra: set[tuple[str, str]]  # (key, ext) of further artifact files of a key in arts
    foreign: list[str]
    dirs: int  # how many of the known directories are present


def read_dir(dfd: int) -> list[tuple[str, int]]:
    """(name, inode) of everything in the root open as ``dfd``.

    Raises:
        OSError: it cannot be listed.
    """
    with os.scandir(dfd) as it:
        return [(e.name, e.inode()) for e in it]


def in_directory(store: Store, name: str, work: Callable[[int], T], default: T) -> T:
    """``work`` of the root's directory ``name``, opened by ``store`` (never through a
    symlink) and closed after; ``default`` where it cannot be opened (there is none)."""
    try:
        dfd = store.open_dir(name)
    except OSError:
        return default
    try:
        return work(dfd)
    finally:
        os.close(dfd)


def files_in(store: Store, directory: str) -> tuple[AuxFile, ...]:
    """The files of the root's housekeeping ``directory`` (``.tmp``, ``.quarantine``:
    :func:`~kernelcache.maintenance.leftovers.aux_files`); none where it cannot be opened."""
    none: tuple[AuxFile, ...] = ()
    return in_directory(store, directory, partial(aux_files, directory=directory), none)


def finished_logs(store: Store, now: float) -> tuple[str, ...]:
    """The statistics logs of finished processes in the root's ``.stats/`` at ``now``
    (:func:`~kernelcache.stats.foldable_logs`): what a prune folds."""
    return tuple(in_directory(store, STATS_DIR, partial(foldable_logs, now=now), []))


def _parse_listing(pairs: list[tuple[str, int]]) -> _Listing:
    """Sort the names of a root into metadata, artifacts and foreign files."""
    suffix = "." + META_EXT
    metas = {n[: -len(suffix)]: ino for n, ino in pairs if n.endswith(suffix)}
    parts = [n.partition(".") for n, _ in pairs if not n.endswith(suffix)]
    keyed = [(key, ext) for key, dot, ext in parts if key and dot]
    others = [k + d + e for k, d, e in parts if not (k and d)]
    known = known_directories()
    foreign = [name for name in others if name not in known]
    arts = dict(reversed(keyed))  # the first file listed for a key wins
    extra = {(k, e) for k, e in keyed if arts[k] != e} if len(arts) < len(keyed) else set()
    # Validate the names in bulk; look at single names only when the bulk check fails.
    if metas and not all_keys(metas):
        for key in [k for k in metas if KEY_PATTERN.fullmatch(k) is None]:
            del metas[key]
            foreign.append(f"{key}.{META_EXT}")
    if arts and not all_keys(arts):
        for key in [k for k in arts if KEY_PATTERN.fullmatch(k) is None]:
            foreign.append(f"{key}.{arts.pop(key)}")
        foreign += [f"{k}.{e}" for k, e in extra if k not in arts]
        extra = {(k, e) for k, e in extra if k in arts}
    bad = {e for e in {*arts.values(), *(e for _, e in extra)} if not valid_ext(e)}
    if bad:
        foreign += [f"{k}.{e}" for k, e in (*arts.items(), *extra) if e in bad]
        arts = {k: e for k, e in arts.items() if e not in bad}
        extra = {(k, e) for k, e in extra if e not in bad}
        for key, ext in sorted(extra):  # a key whose first file had an invalid ext
            if key not in arts:
                arts[key] = ext
                extra.discard((key, ext))
    return _Listing(metas, arts, extra, foreign, len(others) - len(foreign))


# -- scanning -----------------------------------------------------------------------------
def scan(
    root: str | os.PathLike[str],
    *,
    last_used: bool = False,
    locks: bool = False,
    update_index: bool = True,
    lock_stale: float = DEFAULTS.lock_stale,
    progress: Progress | None = None,
    now: float | None = None,
    trust: str = DEFAULTS.trust,
) -> CacheScan:
    """Describe every entry under ``root`` without reading artifacts: :func:`scan_store` of
    a store of ``root`` (as given) under the trust policy ``trust`` (whose users' scan index
    is read, see :mod:`kernelcache.store.trust`) and soft-lock staleness ``lock_stale``
    (seconds after which an unrefreshed soft lock is stale)."""
    store = Store(root, lock_stale=lock_stale, trust=trust, resolved=True)
    return scan_store(
        store,
        last_used=last_used,
        locks=locks,
        update_index=update_index,
        progress=progress,
        now=now,
    )


def scan_store(
    store: Store,
    *,
    last_used: bool = True,
    locks: bool = True,
    update_index: bool = True,
    progress: Progress | None = None,
    now: float | None = None,
) -> CacheScan:
    """Describe every entry of ``store``'s root without reading artifacts, under the store's
    trust policy and soft-lock staleness; the root is opened once. The defaults make the scan
    ``verify`` and ``prune`` work from.

    Args:
        last_used: stat every metadata file for its last-used stamp (``EntryInfo.last_used``),
            and both files of every entry for their sizes.
        locks: also examine ``.locks/`` for stale locks (reported as ``stale-lock`` issues).
        update_index: rewrite the scan index when it changed and the root is writable.
        progress: called with a count of metadata files read (the slow part of a first scan).
        now: the time against which ages are judged (default: now).

    Never raises for what it finds; an unreadable root is an empty scan with one issue.
    """
    now = time.time() if now is None else now
    try:
        dfd = store.open_dir()
    except OSError as e:
        return unreadable(store.root, e, now)
    try:
        try:
            pairs = read_dir(dfd)
        except OSError as e:
            return unreadable(store.root, e, now)
        return scan_pairs(store, dfd, pairs, last_used, locks, update_index, progress, now)
    finally:
        os.close(dfd)


def unreadable(root: str, e: OSError, now: float) -> CacheScan:
    """The scan of a root that cannot be opened or listed (``e``): none when it does not
    exist, else one issue saying why."""
    if e.errno == errno.ENOENT:
        return CacheScan(root, False, EntryTable(), (), scanned_at=now)
    issue = Issue("foreign", ".", f"cannot read the root: {e.strerror}")
    return CacheScan(root, True, EntryTable(), (issue,), scanned_at=now)


def scan_pairs(
    store: Store,
    dfd: int,
    pairs: list[tuple[str, int]],
    last_used: bool,
    locks: bool,
    update_index: bool,
    progress: Progress | None,
    now: float,
    announce: Progress | None = None,
) -> CacheScan:
    """:func:`scan_store` of the root open as ``dfd`` whose listing is ``pairs``; ``announce``
    is told how many metadata files the scan index does not hold (read now), before they are
    read."""
    issues: list[Issue] = []
    index, known = _load_index(store, dfd, len(pairs))
    signature = listing_signature(pairs)
    table = index
    # The index is a cache in a shared directory: it is used only when the listing holds
    # exactly its entries (checked in C even when the listing's signature matches, which
    # anyone who can list the root could forge).
    may_write = update_index and store.writable()
    if index_matches(index, dict(pairs)):
        if known != signature and may_write:
            _save_index(store, dfd, index, signature)
    else:
        listing = _parse_listing(pairs)
        table, fresh = _entries(dfd, listing, index, issues, progress, announce)
        committed = dict(zip(table.key, table.ext, strict=True))
        issues.extend(
            orphans(dfd, listing.arts.items() | listing.extra, listing.metas, committed, now)
        )
        issues.extend(foreign_issues(dfd, sorted(listing.foreign)))
        # clean: the listing holds these entries' two files each, and nothing else
        clean = len(pairs) == 2 * len(table) + listing.dirs
        if may_write and (fresh or len(table) != len(index) or clean):
            _save_index(store, dfd, table, signature if clean else None)
    if last_used:
        table = with_last_used(dfd, table)
    temp = files_in(store, TMP_DIR)
    quarantine = files_in(store, QUARANTINE_DIR)
    issues.extend(stale_temps(temp, now))
    if locks:
        stale = store.locker.stale_after
        issues.extend(
            in_directory(store, LOCK_DIR, lambda d: lock_issues(d, table.key, now, stale), [])
        )
    logs = finished_logs(store, now)
    return CacheScan(store.root, True, table, tuple(issues), temp, quarantine, now, logs)


def _load_index(store: Store, dfd: int, names: int) -> tuple[EntryTable, str | None]:
    """The scan index of the root open as ``dfd`` (whose listing holds ``names`` names), where
    the store's trust policy accepts it."""
    fd = store.open_trusted(STATS_DIR, INDEX_NAME)
    try:
        return load_index(fd, dfd, names)
    finally:
        if fd is not None:
            os.close(fd)


def _save_index(store: Store, dfd: int, table: EntryTable, listing: str | None) -> None:
    """Write the scan index of the root open as ``dfd`` (best effort)."""
    # Create .stats/ only in a root of our own: a .stats/ made by another user (say, an
    # operator running as root) could keep the cache's users from writing their logs.
    try:
        stats = store.open_dir(STATS_DIR, create=os.fstat(dfd).st_uid == os.geteuid())
    except OSError as e:
        logger.debug("kernelcache: not saving the scan index under %s: %s", store.root, e)
        return
    try:
        save_index(stats, table, listing)
    finally:
        os.close(stats)


def _entries(
    dfd: int,
    listing: _Listing,
    index: EntryTable,
    issues: list[Issue],
    progress: Progress | None,
    announce: Progress | None = None,
) -> tuple[EntryTable, int]:
    """The committed entries: index rows whose key and metadata inode still match, plus
    metadata read for the rest. Returns the table and how many metadata files were read."""
    metas, arts = listing.metas, listing.arts
    table = index
    same = dict(zip(index.key, index.inode, strict=True)) == metas and (
        dict(zip(index.key, index.ext, strict=True)).items() <= arts.items()
    )
    if not same:  # some metadata files are new, replaced or gone: keep the rows that match
        pos = dict(zip(index.key, range(len(index)), strict=True))
        inodes, exts = index.inode, index.ext
        hits = [
            i
            for key, ino in metas.items()
            if (i := pos.get(key, -1)) >= 0 and inodes[i] == ino and arts.get(key) == exts[i]
        ]
        columns = [getattr(index, c) for c in COLUMNS]
        take = itemgetter(*hits) if len(hits) > 1 else lambda c: tuple(c[i] for i in hits)
        table = EntryTable(*map(take, columns))
    missing = metas.keys() - set(table.key) if len(table) != len(metas) else ()
    if missing and announce is not None:
        announce(len(missing))
    fresh: list[EntryInfo] = []
    for count, key in enumerate(sorted(missing), 1):
        if progress is not None and count % 256 == 0:
            progress(256)
        got = read_entry(dfd, key, metas[key])
        if got is None:  # deleted since the listing
            continue
        if isinstance(got, Problem):
            kind = "outdated" if got.outdated else "corrupt"
            issues.append(Issue(kind, f"{key}.{META_EXT}", got.reason, key))
            continue
        # The artifact's size is what the file system says. (A directory listing is not a
        # snapshot: an entry published during it may show its metadata without its artifact;
        # this look settles it.)
        st = lstat_at(dfd, got.filename)
        if st is None:
            issues.append(Issue("corrupt", f"{key}.{META_EXT}", "artifact missing", key))
        elif not stat.S_ISREG(st.st_mode):
            issues.append(
                Issue("corrupt", f"{key}.{META_EXT}", "artifact is not a regular file", key)
            )
        else:
            fresh.append(got._replace(size=st.st_size))
    if progress is not None and len(missing) % 256:
        progress(len(missing) % 256)
    if fresh:
        table = EntryTable.from_rows([*table.rows(), *fresh])
    return table, len(missing)
