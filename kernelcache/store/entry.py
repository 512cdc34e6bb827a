"""An entry of a root as readers get it: :class:`Artifact`, and the rules every read and
write applies to one (whole entries: :func:`not_whole`; bytes-like data; how often a last-used
stamp is refreshed, and how far in the future one may be).

An entry is two files, ``<key>.<ext>`` (the artifact bytes, loadable as is) and
``<key>.json`` (its metadata, written last: the commit marker).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import WrongType
from ..keys import META_EXT
from ..schema.document import entry_problem

#: metadata documents remembered per store and process (see Store.read)
MEMO_ENTRIES = 4096
#: how often a hit refreshes an entry's last-used stamp (the metadata file's mtime)
TOUCH_INTERVAL = 3600.0
#: a last-used stamp further in the future than this is clock skew: it is reset to now
FUTURE_SLACK = 300.0
META_SUFFIX = "." + META_EXT


@dataclass(frozen=True)
class Artifact:
    """An artifact and its metadata.

    ``path`` is the file a loader can open as is, or None when the artifact exists only in
    memory (the cache could not store it). ``source`` says where it came from: ``"local"``,
    ``"readonly"``, ``"remote"`` or ``"memory"``.
    """

    key: str
    ext: str
    data: bytes = field(repr=False)
    path: str | None
    meta: Mapping[str, Any] = field(repr=False)
    source: str = "local"


def as_bytes(data: object) -> bytes:
    """``data`` as bytes, if it is bytes-like (bytes, bytearray, memoryview).

    Raises:
        TypeError: anything else (``bytes(5)`` would be five zero bytes).
    """
    if isinstance(data, bytes):
        return data
    if isinstance(data, (bytearray, memoryview)):
        return bytes(data)
    raise WrongType(f"an artifact's data must be bytes, not {type(data).__name__}")


def not_whole(art: Artifact) -> str | None:
    """Why ``art`` is not a whole entry (:func:`kernelcache.schema.entry_problem`, in full: its
    artifact whole for its extension, its launch metadata there), None when it is: what
    ``verify`` reports and ``repair(refuse=not_whole)`` quarantines."""
    return entry_problem(art.ext, art.data, art.meta)
