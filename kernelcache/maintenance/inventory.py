"""What ``kernelcache stats`` reports of a root: entries and bytes, by kernel and target, ages
and last use, from a scan (:class:`CacheSummary`).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from ..config import DEFAULTS
from ..store.layout import (
    QUARANTINE_DIR,
    TMP_DIR,
)
from ..store.trust import TrustPolicy
from .index import (
    GROUPED,
    capacity,
    index_file,
    listing_signature,
    parse_header,
    plausible_header,
)
from .leftovers import aux_files
from .records import GRACE_SECONDS, AuxFile
from .scan import read_dir, scan_pairs


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
    root: str | os.PathLike[str], *, now: float | None = None, trust: str = DEFAULTS.trust
) -> CacheSummary:
    """Totals and groups of the entries of ``root``, from the scan index's first line when the
    root's listing is exactly the one the index was made from (and the index is accepted by
    the trust policy ``trust`` and plausible), else from a :func:`scan`."""
    root = os.fspath(root)
    now = time.time() if now is None else now
    try:
        pairs = read_dir(root)
    except OSError:
        pairs = []
    if pairs is None:
        return CacheSummary(root, False, 0, 0, 0, {c: {} for c in GROUPED}, 0)
    policy = TrustPolicy(root, trust)
    raw = index_file(root, header_only=True, trust=policy)
    head = parse_header(raw) if raw else None
    if (
        head is not None
        and head["listing"] == listing_signature(pairs)
        and plausible_header(head, len(pairs), capacity(root))
    ):
        temp = aux_files(root, TMP_DIR)
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
            aux_files(root, QUARANTINE_DIR),
        )
    scanned = scan_pairs(root, pairs, False, False, True, DEFAULTS.lock_stale, None, now, policy)
    table = scanned.table
    return CacheSummary(
        root,
        scanned.exists,
        len(table),
        sum(table.size),
        sum(table.meta_size),
        {c: table.group(c) for c in GROUPED},
        len(scanned.issues),
        scanned.temp,
        scanned.quarantine,
    )
