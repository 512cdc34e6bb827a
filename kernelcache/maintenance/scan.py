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

Guarantees across processes: a scan runs concurrently with writers, readers and pruners. An
entry published or deleted during the scan may or may not be listed; a half-published entry
(artifact without metadata) is reported as an orphan only once it is older than
:data:`~kernelcache.maintenance.records.GRACE_SECONDS`, so a write in progress is never reported as a problem.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import time
from dataclasses import dataclass, replace
from functools import partial
from itertools import repeat
from operator import add, itemgetter
from typing import Any

from ..config import DEFAULTS
from ..keys import KEY_PATTERN, META_EXT, all_keys, valid_ext
from ..problem import Problem
from ..schema.fields import KERNEL_NAME
from ..store.entry import FUTURE_SLACK
from ..store.layout import (
    QUARANTINE_DIR,
    TMP_DIR,
    known_directories,
    read_metadata,
    writable,
)
from ..store.trust import TrustPolicy
from ..table import COLUMNS, EntryInfo, EntryTable
from .index import (
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
from .records import CacheScan, Issue, Progress


# -- listing ------------------------------------------------------------------------------
@dataclass
class _Listing:
    metas: dict[str, int]  # key -> inode of <key>.json
    arts: dict[str, str]  # key -> ext of its artifact file (the first one listed)
    extra: set[tuple[str, str]]  # (key, ext) of further artifact files of a key in arts
    foreign: list[str]
    dirs: int  # how many of the known directories are present


def read_dir(root: str) -> list[tuple[str, int]] | None:
    """(name, inode) of everything in the root; None when it does not exist."""
    try:
        with os.scandir(root) as it:
            return [(e.name, e.inode()) for e in it]
    except FileNotFoundError:
        return None


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


def _read_entry(dfd: int, key: str, inode: int) -> EntryInfo | Problem | None:
    """Read one metadata file: the entry it describes, why it is not one, or None when it was
    deleted since the listing. The metadata is checked against the schema and its entry
    digest, so every value in the record is of its type and range."""
    loaded = read_metadata(f"{key}.{META_EXT}", key, dir_fd=dfd)
    if not isinstance(loaded, tuple):
        return loaded
    doc, st = loaded
    return EntryInfo(
        key,
        doc["ext"],
        -1,  # the artifact's size: measured by the caller, never taken from the metadata
        st.st_size,
        doc.get("name"),
        doc.get("target"),
        float(doc["created"]) if "created" in doc else None,
        None,
        inode,
        doc.get("kind"),  # (the schema checked these fields' types)
        _qualname(doc.get("kernel")),
    )


def _qualname(value: Any) -> str | None:
    """The ``kernel`` field (a package's, which the schema may not know) if it is a name."""
    return value if isinstance(value, str) and KERNEL_NAME(value) is None else None


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
    """Describe every entry under ``root`` without reading artifacts.

    Args:
        last_used: stat every metadata file for its last-used stamp (``EntryInfo.last_used``),
            and both files of every entry for their sizes.
        locks: also examine ``.locks/`` for stale locks (reported as ``stale-lock`` issues).
        update_index: rewrite the scan index when it changed and the root is writable.
        lock_stale: seconds after which an unrefreshed soft lock is stale.
        progress: called with a count of metadata files read (the slow part of a first scan).
        now: the time against which ages are judged (default: now).
        trust: the trust policy whose users' scan index is read (see :mod:`kernelcache.store.trust`).

    Never raises for what it finds; an unreadable root is an empty scan with one issue.
    """
    root = os.fspath(root)
    now = time.time() if now is None else now
    try:
        pairs = read_dir(root)
    except OSError as e:
        issue = Issue("foreign", ".", f"cannot read the root: {e.strerror}")
        return CacheScan(root, True, EntryTable(), (issue,), scanned_at=now)
    if pairs is None:
        return CacheScan(root, False, EntryTable(), (), scanned_at=now)
    policy = TrustPolicy(root, trust)
    return scan_pairs(
        root, pairs, last_used, locks, update_index, lock_stale, progress, now, policy
    )


def scan_pairs(
    root: str,
    pairs: list[tuple[str, int]],
    last_used: bool,
    locks: bool,
    update_index: bool,
    lock_stale: float,
    progress: Progress | None,
    now: float,
    trust: TrustPolicy,
) -> CacheScan:
    try:
        dfd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as e:
        if e.errno == errno.ENOENT:
            return CacheScan(root, False, EntryTable(), (), scanned_at=now)
        issue = Issue("foreign", ".", f"cannot read the root: {e.strerror}")
        return CacheScan(root, True, EntryTable(), (issue,), scanned_at=now)
    issues: list[Issue] = []
    try:
        index, known = load_index(root, trust)
        signature = listing_signature(pairs)
        table = index
        # The index is a cache in a shared directory: it is used only when the listing holds
        # exactly its entries (checked in C even when the listing's signature matches, which
        # anyone who can list the root could forge).
        may_write = update_index and writable(root)
        if index_matches(index, dict(pairs)):
            if known != signature and may_write:
                save_index(root, index, signature)
        else:
            listing = _parse_listing(pairs)
            table, fresh = _entries(dfd, listing, index, issues, progress)
            committed = dict(zip(table.key, table.ext, strict=True))
            issues.extend(
                orphans(dfd, listing.arts.items() | listing.extra, listing.metas, committed, now)
            )
            issues.extend(foreign_issues(dfd, sorted(listing.foreign)))
            # clean: the listing holds these entries' two files each, and nothing else
            clean = len(pairs) == 2 * len(table) + listing.dirs
            if may_write and (fresh or len(table) != len(index) or clean):
                save_index(root, table, signature if clean else None)
        if last_used:
            table = _with_last_used(dfd, table)
    finally:
        os.close(dfd)
    temp = aux_files(root, TMP_DIR)
    quarantine = aux_files(root, QUARANTINE_DIR)
    issues.extend(stale_temps(temp, now))
    if locks:
        issues.extend(lock_issues(root, table.key, now, lock_stale))
    return CacheScan(root, True, table, tuple(issues), temp, quarantine, now)


def _entries(
    dfd: int,
    listing: _Listing,
    index: EntryTable,
    issues: list[Issue],
    progress: Progress | None,
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
    fresh: list[EntryInfo] = []
    for count, key in enumerate(sorted(missing), 1):
        if progress is not None and count % 256 == 0:
            progress(256)
        got = _read_entry(dfd, key, metas[key])
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


def _with_last_used(dfd: int, table: EntryTable) -> EntryTable:
    """The table with last-used stamps, and the sizes of both files of each entry as the file
    system reports them now (an artifact changed in place keeps its metadata's inode; the scan
    index's sizes are never used here); entries deleted since the listing are dropped. Stamps
    further in the future than ``FUTURE_SLACK`` are reset to now (on disk too)."""
    stat_at = partial(os.stat, dir_fd=dfd, follow_symlinks=False)
    names = list(map(add, table.key, repeat("." + META_EXT)))
    artifacts = list(map(add, map(add, table.key, repeat(".")), table.ext))
    stamps: list[float | None]
    sizes: list[int | None]
    meta_sizes: list[int | None]
    try:
        metas = list(map(stat_at, names))
        stamps = [st.st_mtime for st in metas]
        meta_sizes = [st.st_size for st in metas]
        sizes = [st.st_size for st in map(stat_at, artifacts)]
    except OSError:  # some entry went away meanwhile: one at a time
        stamps, sizes, meta_sizes = [], [], []
        for name, artifact in zip(names, artifacts, strict=True):
            stamp: float | None
            size: int | None
            meta_size: int | None
            try:
                meta = stat_at(name)
                stamp, meta_size, size = meta.st_mtime, meta.st_size, stat_at(artifact).st_size
            except OSError:
                stamp, meta_size, size = None, None, None
            stamps.append(stamp)
            sizes.append(size)
            meta_sizes.append(meta_size)
    now = time.time()
    for i, stamp in enumerate(stamps):
        if stamp is not None and stamp > now + FUTURE_SLACK:
            # a stamp from a host whose clock was ahead: reset it as a hit would, so that the
            # entry ages from now instead of being kept until that date
            with contextlib.suppress(OSError):
                os.utime(names[i], dir_fd=dfd, follow_symlinks=False)
            stamps[i] = now
    table = replace(
        table,
        last_used=tuple(stamps),
        size=tuple(sizes),  # type: ignore[arg-type]
        meta_size=tuple(meta_sizes),  # type: ignore[arg-type]
    )
    if None not in stamps:
        return table
    keep = [i for i, t in enumerate(stamps) if t is not None]
    columns = [getattr(table, c) for c in COLUMNS]
    return EntryTable(*([c[i] for i in keep] for c in columns))  # type: ignore[arg-type]
