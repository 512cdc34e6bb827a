"""What a root holds, as :mod:`kernelcache.maintenance.scan` and its index describe it: one
:class:`EntryInfo` per committed entry, and an :class:`EntryTable` of them by column.

These records are immutable values built from one listing of a root; nothing here touches disk.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from operator import add
from typing import Any, NamedTuple


class EntryInfo(NamedTuple):
    """One committed entry as its metadata describes it (immutable).

    ``size`` is the artifact file's size and ``meta_size`` the metadata file's, as the file
    system reports them (never what the metadata claims); ``kernel`` and ``target`` are the
    metadata's ``name`` and ``target`` fields (None when absent); ``kind`` is its ``kind``
    field: None for a compiled kernel, else what else the entry is (the bridge stores
    ``"ptx"`` text and ``"identity"`` records). ``last_used`` is the metadata file's mtime,
    the last-used stamp, or None when the scan did not stat files. ``qualname`` is the
    metadata's ``kernel`` field, where the kernel is defined (``module:name``), when it is
    printable text. An entry that holds several kernels lists them in ``name`` (and
    ``kernel``), separated by :data:`~kernelcache.naming.NAME_SEPARATOR`. (A NamedTuple: a scan
    builds one per entry, and a root may hold a great many.)
    """

    key: str
    ext: str
    size: int
    meta_size: int
    kernel: str | None
    target: str | None
    created: float | None
    last_used: float | None = None
    inode: int = 0
    kind: str | None = None
    qualname: str | None = None

    @property
    def nbytes(self) -> int:
        """Bytes on disk (apparent size): the artifact plus its metadata."""
        return self.size + self.meta_size

    @property
    def filename(self) -> str:
        return f"{self.key}.{self.ext}"

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "ext": self.ext,
            "size": self.size,
            "meta_size": self.meta_size,
            "kernel": self.kernel,
            "qualname": self.qualname,
            "target": self.target,
            "created": self.created,
            "last_used": self.last_used,
            "kind": self.kind,
        }


#: EntryInfo's fields, in order: the columns of an EntryTable
COLUMNS = EntryInfo._fields


@dataclass(frozen=True)
class EntryTable:
    """Entries stored by column (one tuple per EntryInfo field), cheap to aggregate."""

    key: tuple[str, ...] = ()
    ext: tuple[str, ...] = ()
    size: tuple[int, ...] = ()
    meta_size: tuple[int, ...] = ()
    kernel: tuple[str | None, ...] = ()
    target: tuple[str | None, ...] = ()
    created: tuple[float | None, ...] = ()
    last_used: tuple[float | None, ...] = ()
    inode: tuple[int, ...] = ()
    kind: tuple[str | None, ...] = ()
    qualname: tuple[str | None, ...] = ()

    @classmethod
    def from_rows(cls, rows: Iterable[EntryInfo]) -> EntryTable:
        columns = list(zip(*rows, strict=True))
        return cls(*columns) if columns else cls()

    def __len__(self) -> int:
        return len(self.key)

    def rows(self) -> list[EntryInfo]:
        make = tuple.__new__
        return [make(EntryInfo, r) for r in zip(*(getattr(self, c) for c in COLUMNS), strict=True)]

    @property
    def nbytes(self) -> int:
        return sum(self.size) + sum(self.meta_size)

    def group(self, column: str) -> dict[str | None, tuple[int, int]]:
        """{value of ``column``: (entries, bytes)}, largest first. Grouped by ``kernel``, only
        kernels count (entries without a ``kind``)."""
        values = getattr(self, column)
        nbytes: Iterable[int] = map(add, self.size, self.meta_size)
        if column == "kernel" and any(k is not None for k in self.kind):
            rows = [(v, b) for v, b, k in zip(values, nbytes, self.kind, strict=True) if k is None]
            values = [v for v, _ in rows]
            nbytes = [b for _, b in rows]
        counts = Counter(values)
        sizes = dict.fromkeys(counts, 0)
        for value, n in zip(values, nbytes, strict=True):
            sizes[value] += n
        order = sorted(counts, key=lambda v: (-sizes[v], str(v)))
        return {v: (counts[v], sizes[v]) for v in order}
