"""The bundle format: a POSIX tar archive, compressed with zstd unless asked otherwise (a
name ending in ``.tar``, ``--compression none``), holding exactly:

* ``entries/<key>.<ext>``: each artifact, a regular file;
* ``manifest.json`` (written last): ``{"format": "kernelcache-bundle", "version": 1,
  "created": <unix time>, "compatibility": {...}, "entries": [<metadata document>, ...]}``,
  where each metadata document is the entry's own ``<key>.json`` (with its size and xxh3-128
  digest) and ``compatibility`` holds the entry format version, this package's version, and the
  producer versions, targets and extensions found in the entries.

Also the limits a reader applies and the results of an export and an import.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..optional import require
from ..schema.document import MAX_META_BYTES

BUNDLE_FORMAT = "kernelcache-bundle"
BUNDLE_VERSION = 1
MANIFEST = "manifest.json"
MEMBER_DIR = "entries"
#: default limit on one artifact in a bundle (``import --max-member-size``)
MAX_MEMBER_BYTES = 256 << 20
#: a manifest may be this large, plus, for every entry member before it, MANIFEST_PER_ENTRY and
#: as many bytes as the member holds, up to MANIFEST_ENTRY_MAX (see manifest_limit); never more
#: than MAX_MANIFEST_BYTES
MANIFEST_BASE = 1 << 20
MANIFEST_PER_ENTRY = 16 << 10
#: the most characters one entry's document may take in a manifest (the window it is parsed in)
MANIFEST_ENTRY_MAX = MAX_META_BYTES + 1024
MAX_MANIFEST_BYTES = 64 << 20
#: the most characters a field name and any other value of a manifest may take
NAME_MAX = 256
VALUE_MAX = MANIFEST_BASE
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
OTHER_MAGIC = {
    b"\x1f\x8b": "gzip",
    b"BZh": "bzip2",
    b"\xfd7zXZ\x00": "xz",
    b"PK\x03\x04": "zip",
}
CHUNK = 1 << 20

Progress = Callable[[int], object]


@dataclass(frozen=True)
class ExportResult:
    path: str
    entries: int
    bytes: int
    compression: str
    skipped: tuple[tuple[str, str], ...] = ()  # (key, reason)
    compatibility: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ImportResult:
    path: str
    entries: int  # in the bundle
    imported: int
    present: int
    bytes: int  # of the imported artifacts
    conflicts: tuple[tuple[str, str], ...] = ()  # (key, reason)
    compatibility: dict[str, Any] = field(default_factory=dict)
    dry_run: bool = False
    #: with a judge: entries this machine would look up, and the others counted by reason
    looked_up: int | None = None
    not_looked_up: tuple[tuple[str, int], ...] = ()


def zstandard_module() -> Any:
    """The zstandard package.

    Raises:
        MissingDependency: it is not installed (the message says how to install it).
    """
    return require("zstandard", "a zstd bundle")
