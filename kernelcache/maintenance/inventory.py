"""What ``kernelcache stats`` reports of a root: entries and bytes, by kernel and target, ages
and last use, from a scan (:class:`CacheSummary`).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from ..config import DEFAULTS
from ..store.layout import QUARANTINE_DIR, STATS_DIR, TMP_DIR
from ..store.root import Store
from .index import (
    GROUPED,
    INDEX_NAME,
    capacity,
    index_file,
    listing_signature,
    parse_header,
    plausible_header,
)
from .records import GRACE_SECONDS, AuxFile, CacheScan, Progress
from .scan import files_in, read_dir, scan_pairs, scan_store


@dataclass(frozen=True)
class CacheSummary:
    """Totals of a root, as ``stats`` shows them. ``groups`` maps ``ext``, ``target`` and
    ``kernel`` to ``{value: (entries, bytes)}``, largest first; ``problems`` counts what a
    quick scan finds wrong."""

    root: str
    exists: bool
    entries: int
    artifact_bytes: int
    metadata_bytes: int
    groups: dict[str, dict[str | None, tuple[int, int]]]
    problems: int
    temp: tuple[AuxFile, ...] = ()
    quarantine: tuple[AuxFile, ...] = ()


def summarize(
    root: str | os.PathLike[str],
    *,
    now: float | None = None,
    trust: str = DEFAULTS.trust,
    progress: Progress | None = None,
    announce: Progress | None = None,
) -> CacheSummary:
    """Totals and groups of the entries of ``root``, from the scan index's first line when the
    root's listing is exactly the one the index was made from (and the index is accepted by
    the trust policy ``trust`` and plausible), else from a scan (of a store of ``root``, as
    :func:`~kernelcache.maintenance.scan.scan` makes one), which reads the metadata files the
    index does not hold: ``announce`` is told how many first, ``progress`` as they are read
    (the first summary of a large root, or one after many new entries, takes that long)."""
    store = Store(root, trust=trust, resolved=True)
    root = store.root
    now = time.time() if now is None else now
    try:
        dfd = store.open_dir()
    except FileNotFoundError:
        return CacheSummary(root, False, 0, 0, 0, {c: {} for c in GROUPED}, 0)
    except OSError:  # a scan says why it cannot be read
        return _summary(scan_store(store, last_used=False, locks=False, now=now))
    try:
        try:
            pairs = read_dir(dfd)
        except OSError:
            pairs = []
        fd = store.open_trusted(STATS_DIR, INDEX_NAME)
        try:
            raw = index_file(fd, len(pairs), header_only=True)
        finally:
            if fd is not None:
                os.close(fd)
        head = parse_header(raw) if raw else None
        if (
            head is not None
            and head["listing"] == listing_signature(pairs)
            and plausible_header(head, len(pairs), capacity(dfd))
        ):
            temp = files_in(store, TMP_DIR)
            totals = head["totals"]
            return CacheSummary(
                root,
                True,
                totals["entries"],
                totals["size"],
                totals["meta_size"],
                {c: {v: (n, b) for v, n, b in head["groups"][c]} for c in GROUPED},
                sum(1 for f in temp if now - f.mtime > GRACE_SECONDS),
                temp,
                files_in(store, QUARANTINE_DIR),
            )
        return _summary(scan_pairs(store, dfd, pairs, False, False, True, progress, now, announce))
    finally:
        os.close(dfd)


def _summary(scanned: CacheScan) -> CacheSummary:
    table = scanned.table
    return CacheSummary(
        scanned.root,
        scanned.exists,
        len(table),
        sum(table.size),
        sum(table.meta_size),
        {c: table.group(c) for c in GROUPED},
        len(scanned.issues),
        scanned.temp,
        scanned.quarantine,
    )
