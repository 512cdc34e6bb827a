"""What a scan of a root produces: :class:`CacheScan` (the entries, as a table, and the issues
found), :class:`Issue` (what is wrong, of the kinds in :data:`ISSUE_KINDS`) and
:class:`AuxFile` (a file of ``.tmp/`` or ``.quarantine/``). Immutable records; a half-published
entry is an issue only once older than :data:`GRACE_SECONDS`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from ..table import EntryInfo, EntryTable

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

    ``table`` holds the entries by column; ``entries`` gives them as :class:`EntryInfo` rows.
    """

    root: str
    exists: bool
    table: EntryTable
    issues: tuple[Issue, ...]
    temp: tuple[AuxFile, ...] = ()
    quarantine: tuple[AuxFile, ...] = ()
    scanned_at: float = 0.0

    @cached_property
    def entries(self) -> tuple[EntryInfo, ...]:
        return tuple(self.table.rows())

    @property
    def nbytes(self) -> int:
        return self.table.nbytes
