"""The scan index, ``<root>/.stats/index.json``: what each metadata file of a root said.

Rows are keyed by the entry's key and the metadata file's inode number. Metadata is written once
per entry and replaced (new inode) whenever the entry is republished, so a row whose key and
inode still match the directory listing is reused by :func:`kernelcache.maintenance.scan.scan` without
opening the file; new or replaced metadata is read and parsed. The first line holds the
signature of the listing the index was made from, with the totals and groups ``stats`` shows,
so that a summary of an unchanged root reads nothing else.

The index is a cache: it is rewritten atomically (``os.replace``) by whoever scans a writable
root, ignored when missing, unreadable or malformed (every field is validated), and never
needed for correctness. Last-used stamps (metadata mtimes) are never taken from it.

It lives in a directory others may write (``.stats/``), so it is a hint for listing speed only:
read only when the file passes the root's trust policy (a trusted owner, writable by no one
else: the store opens it, :meth:`~kernelcache.store.root.Store.open_trusted`), and only when
what it says is possible (no metadata file larger than a document may be, no more bytes than
the filesystem holds). Nothing selects a deletion by it: ``prune`` re-reads every field it
selects on from the entry itself, under the entry's lock.

Everything here works on descriptors the caller opened from its store: the index file, the
root and its ``.stats/`` directory; nothing is opened by path.
"""

from __future__ import annotations

import json
import logging
import os
from array import array
from collections.abc import Iterable, Mapping
from itertools import repeat
from operator import add
from typing import Any

import xxhash

from ..fsio import load_json
from ..keys import META_EXT, all_keys, valid_ext
from ..schema.document import MAX_META_BYTES
from ..store.layout import STATS_DIR, known_directories, replace_file
from ..store.removal import remove_own_file
from ..table import EntryTable

logger = logging.getLogger(__name__)

INDEX_NAME = "index.json"
#: 3: rows are entries that pass the metadata schema and its entry digest; 4: a kind column;
#: 5: a qualname column
INDEX_VERSION = 5
#: the columns whose groups (entries and bytes per value) ``stats`` shows
GROUPED = ("ext", "target", "kernel", "kind")
_TOTALS = ("entries", "size", "meta_size")
MAX_INDEX_BYTES = 512 << 20
#: what an index may hold per name of the root's listing, beyond its first MiB (one row per
#: entry of two names: about 140 bytes)
INDEX_BYTES_PER_NAME = 512


def listing_signature(pairs: list[tuple[str, int]]) -> str:
    """A digest of the names and inode numbers of a listing, in listing order."""
    names, inodes = zip(*pairs, strict=True) if pairs else ((), ())
    digest = xxhash.xxh3_128("\0".join(names).encode("utf-8", "surrogateescape"))
    digest.update(array("Q", inodes).tobytes())
    return digest.hexdigest()


def index_matches(index: EntryTable, names: Mapping[str, int]) -> bool:
    """Whether the listing holds exactly the index's entries, with the same metadata inodes.

    All of it runs in C: the common case of a scan of an unchanged (or only read) cache.
    """
    n = len(index)
    if len(names) != 2 * n + len(known_directories() & names.keys()):
        return False
    meta_names = map(add, index.key, repeat("." + META_EXT))
    if not dict(zip(meta_names, index.inode, strict=True)).items() <= names.items():
        return False
    return all(map(names.__contains__, map(add, map(add, index.key, repeat(".")), index.ext)))


def index_file(fd: int | None, names: int, *, header_only: bool) -> bytes | None:
    """The bytes (or the first line only) of the scan index open as ``fd`` (by the store, which
    applied its trust policy: :meth:`~kernelcache.store.root.Store.open_trusted`; left open)
    of a root whose listing holds ``names`` names; None if there is none (``fd`` None), it is
    larger than an index of such a root may be (what its JSON holds in memory is many times
    its bytes), or unreadable."""
    if fd is None:
        return None
    most = min(MAX_INDEX_BYTES, (1 << 20) + INDEX_BYTES_PER_NAME * names)
    try:
        if os.fstat(fd).st_size > most:
            return None
        with os.fdopen(os.dup(fd), "rb") as f:
            return f.readline(most) if header_only else f.read(most)
    except OSError:
        return None


def parse_header(line: bytes) -> dict[str, Any] | None:
    """The index's first line: version, listing signature, totals and groups; None if bad."""
    try:
        head = load_json(line)
        if not isinstance(head, dict) or head.get("v") != INDEX_VERSION:
            return None
        totals, groups = head["totals"], head["groups"]
        if not isinstance(head.get("listing"), (str, type(None))):
            return None
        if not all(type(totals.get(k)) is int and totals[k] >= 0 for k in _TOTALS):
            return None
        for column in GROUPED:
            rows = groups[column]
            if not isinstance(rows, list):
                return None
            for row in rows:
                if not (
                    isinstance(row, list)
                    and len(row) == 3
                    and isinstance(row[0], (str, type(None)))
                    and type(row[1]) is int
                    and type(row[2]) is int
                ):
                    return None
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    return head


def capacity(root_fd: int) -> int:
    """The bytes the filesystem of the root open as ``root_fd`` holds in all: what no listing
    of it can exceed."""
    try:
        vfs = os.fstatvfs(root_fd)
    except OSError:
        return 1 << 62
    return vfs.f_blocks * vfs.f_frsize


def plausible_header(head: dict[str, Any], names: int, room: int) -> bool:
    """Whether the totals and groups of an index header can describe a listing of ``names``
    names on a filesystem of ``room`` bytes (each entry has two files; a metadata file is at
    most a document's size; the groups add up to at most the totals)."""
    totals = head["totals"]
    entries, nbytes = totals["entries"], totals["size"] + totals["meta_size"]
    if 2 * entries > names or totals["meta_size"] > entries * MAX_META_BYTES or nbytes > room:
        return False
    return all(
        sum(n for _, n, _ in head["groups"][c]) <= entries
        and sum(b for _, _, b in head["groups"][c]) <= nbytes
        for c in GROUPED
    )


def load_index(fd: int | None, root_fd: int, names: int) -> tuple[EntryTable, str | None]:
    """The entries the scan index open as ``fd`` (:func:`index_file`) remembers and the
    signature of the listing they were read from; (empty table, None) when there is none, or
    it is malformed or says what cannot be of the root open as ``root_fd``, whose listing
    holds ``names`` names (see the module's docstring). Never raises: it is a cache."""
    raw = index_file(fd, names, header_only=False)
    if raw is None:
        return EntryTable(), None
    first, _, rest = raw.partition(b"\n")
    head = parse_header(first)
    if head is None:
        return EntryTable(), None
    try:
        doc = load_json(rest)
        keys = doc["keys"].split("\n") if doc["keys"] else []
        strings = doc["strings"]
        inode, ext, size, meta_size, kernel, target, created, kind, qualname = (
            doc[c]
            for c in (
                "inode",
                "ext",
                "size",
                "meta_size",
                "kernel",
                "target",
                "created",
                "kind",
                "qualname",
            )
        )
        ints = (inode, ext, size, meta_size, kernel, target, kind, qualname)
        n = len(keys)
        if not all(isinstance(c, list) and len(c) == n for c in (*ints, created)):
            return EntryTable(), None
        if not isinstance(strings, list) or not set(map(type, strings)) <= {str}:
            return EntryTable(), None
        if not all(map(str.isprintable, strings)):  # what the schema lets into these columns
            return EntryTable(), None
        if not all_keys(keys) or len(set(keys)) != n:  # keys are joined to paths under the root
            return EntryTable(), None
        if not all(set(map(type, c)) <= {int} for c in ints):
            return EntryTable(), None
        if not set(map(type, created)) <= {int, float, type(None)}:
            return EntryTable(), None
        if not all(c is None or 0 <= c <= 1e11 for c in created):  # NaN and infinities too
            return EntryTable(), None
        if n:
            top = len(strings)
            if min(ext) < 0 or max(ext) >= top or min(size) < 0 or min(meta_size) < 0:
                return EntryTable(), None
            if max(meta_size) > MAX_META_BYTES or sum(size) + sum(meta_size) > capacity(root_fd):
                return EntryTable(), None
            if not all(valid_ext(strings[i]) for i in set(ext)):
                return EntryTable(), None
            for refs in (kernel, target, kind, qualname):
                if min(refs) < -1 or max(refs) >= top:
                    return EntryTable(), None
    except (ValueError, KeyError, TypeError, AttributeError):
        return EntryTable(), None
    lookup = [*strings, None]  # index -1 -> None
    string_at = lookup.__getitem__
    table = EntryTable(
        tuple(keys),
        tuple(map(string_at, ext)),
        tuple(size),
        tuple(meta_size),
        tuple(map(string_at, kernel)),
        tuple(map(string_at, target)),
        tuple(created),
        (None,) * n,
        tuple(inode),
        tuple(map(string_at, kind)),
        tuple(map(string_at, qualname)),
    )
    return table, head["listing"]


def discard_index(stats_fd: int) -> None:
    """Remove the scan index from the root's ``.stats/``, open as ``stats_fd`` (best effort):
    it said what an entry's own metadata does not, so the next scan reads every metadata file
    and writes a new one."""
    try:
        remove_own_file(stats_fd, INDEX_NAME)
    except OSError as e:
        logger.debug("kernelcache: cannot remove %s/%s: %s", STATS_DIR, INDEX_NAME, e)


def save_index(stats_fd: int, table: EntryTable, listing: str | None) -> None:
    """Atomically replace the scan index in the root's ``.stats/``, open as ``stats_fd`` (best
    effort: failures are only logged).

    ``listing`` is the signature of a listing that holds exactly these entries and nothing
    else (None if it held anything more): the same signature later means the same files.
    The first line holds the signature with the totals and groups ``stats`` shows, so that
    :func:`summarize` of an unchanged root reads nothing else.
    """
    strings: dict[str | None, int] = {None: -1}

    def refs(values: Iterable[str | None]) -> list[int]:
        return [strings.setdefault(v, len(strings) - 1) for v in values]

    head = {
        "v": INDEX_VERSION,
        "listing": listing,
        "totals": {
            "entries": len(table),
            "size": sum(table.size),
            "meta_size": sum(table.meta_size),
        },
        "groups": {c: [[v, n, b] for v, (n, b) in table.group(c).items()] for c in GROUPED},
    }
    doc = {
        "keys": "\n".join(table.key),
        "inode": table.inode,
        "ext": refs(table.ext),
        "size": table.size,
        "meta_size": table.meta_size,
        "kernel": refs(table.kernel),
        "target": refs(table.target),
        "created": table.created,
        "kind": refs(table.kind),
        "qualname": refs(table.qualname),
    }
    doc["strings"] = [v for v in strings if v is not None]
    data = b"%s\n%s" % (
        json.dumps(head, separators=(",", ":")).encode(),
        json.dumps(doc, separators=(",", ":")).encode(),
    )
    try:
        replace_file(stats_fd, INDEX_NAME, data)
    except OSError as e:
        logger.debug("kernelcache: not saving %s/%s: %s", STATS_DIR, INDEX_NAME, e)
