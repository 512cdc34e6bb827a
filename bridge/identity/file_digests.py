"""Digests of files by content, memoized per process by the file's identity (:func:`file_digest`:
path, size and modification time): how tools, libraries and plugins the compile reads count in
keys (never by their path or the version they report).
"""

from __future__ import annotations

import functools
import hashlib


@functools.lru_cache(maxsize=1024)
def file_digest(path: str, size: int, mtime_ns: int) -> str:
    """sha256 of a file's content, memoized per process by its identity (path, size and
    modification time)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
