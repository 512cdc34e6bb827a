"""What a scan of a root produces: :class:`CacheScan` (the entries, as a table, and the issues
found), :class:`Issue` (what is wrong, of the kinds in :data:`ISSUE_KINDS`) and
:class:`AuxFile` (a file of ``.tmp/`` or ``.quarantine/``). Immutable records; a half-published
entry is an issue only once older than :data:`GRACE_SECONDS`. What a scan records of an entry
is read relative to the root's descriptor: its metadata (:func:`read_entry`), and the status
of its files (:func:`with_last_used`).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import cached_property, partial
from itertools import repeat
from operator import add
from typing import Any

from ..keys import META_EXT
from ..problem import Problem
from ..schema.fields import KERNEL_NAME
from ..store.entry import FUTURE_SLACK
from ..store.layout import read_metadata
from ..table import COLUMNS, EntryInfo, EntryTable

#: files younger than this may belong to a write in progress: never reported or removed
GRACE_SECONDS = 3600.0
#: kind -> what it means
ISSUE_KINDS: dict[str, str] = {
    "corrupt": "an entry that must not be served: bad metadata, missing or wrong artifact",
    "outdated": "an entry of an older format, or holding fields its digest does not cover that "
    "this kernelcache requires covered: never served, rebuilt",
    "orphan-artifact": "an artifact file without metadata (older than the grace period)",
    "stale-temp": "a staging file in .tmp/ older than the grace period",
    "stale-lock": "a lock file nobody holds, or a soft lock whose holder is gone",
    "untrusted": "an entry written by a user the trust policy excludes; left alone",
    "foreign": "a file the cache does not know; left alone",
}

Progress = Callable[[int], object]


@dataclass(frozen=True)
class Issue:
    """Something wrong under a root. ``path`` is relative to the root."""

    kind: str
    path: str
    detail: str
    key: str | None = None
    size: int = 0
    mtime: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "path": self.path,
            "key": self.key,
            "detail": self.detail,
            "size": self.size,
        }


@dataclass(frozen=True)
class AuxFile:
    """A file in one of the root's housekeeping directories (``.tmp``, ``.quarantine``, ...)."""

    path: str  # relative to the root
    size: int
    mtime: float


@dataclass(frozen=True)
class CacheScan:
    """The result of :func:`scan`: immutable; problems collected in ``issues``.

    ``table`` holds the entries by column; ``entries`` gives them as :class:`EntryInfo` rows;
    ``logs`` names the statistics logs of finished processes found in ``.stats/``
    (:func:`~kernelcache.stats.foldable_logs`), which a prune folds.
    """

    root: str
    exists: bool
    table: EntryTable
    issues: tuple[Issue, ...]
    temp: tuple[AuxFile, ...] = ()
    quarantine: tuple[AuxFile, ...] = ()
    scanned_at: float = 0.0
    logs: tuple[str, ...] = ()

    @cached_property
    def entries(self) -> tuple[EntryInfo, ...]:
        return tuple(self.table.rows())

    @property
    def nbytes(self) -> int:
        return self.table.nbytes


def read_entry(dfd: int, key: str, inode: int) -> EntryInfo | Problem | None:
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
        qualname_of(doc.get("kernel")),
    )


def qualname_of(value: Any) -> str | None:
    """The ``kernel`` field (a package's, which the schema may not know) if it is a name."""
    return value if isinstance(value, str) and KERNEL_NAME(value) is None else None


def with_last_used(dfd: int, table: EntryTable) -> EntryTable:
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
