"""Whole files in an object store: uploading and downloading bundles (``kernelcache export`` and
``import`` with an ``s3://`` or ``gs://`` URL), bounded by :data:`TRANSFER_TIMEOUT` and
:data:`TRANSFER_MAX_SIZE`.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ...errors import (
    ConfigError,
    ObjectExists,
    ObjectMissing,
    RemoteError,
)
from ...optional import require
from ..url import redact
from .location import parse_object_url
from .requests import first_line, make_store

#: defaults of a file transfer where the URL does not set them (bundles are large)
TRANSFER_TIMEOUT = 600.0
TRANSFER_MAX_SIZE = 16 << 30


def _file_location(url: str) -> tuple[Any, str, str]:
    """``(store, object name, shown URL)`` of a URL naming one object (a bundle).

    Raises:
        ConfigError: not an object URL, no object name, or a bad option.
        MissingDependency: obstore is not installed.
    """
    where = parse_object_url(url)
    shown = redact(url)
    directory, _, name = where.path.rpartition("/")
    if not name:
        raise ConfigError(f"{shown!r} names no object; use {where.scheme}://bucket/path/FILE")
    require("obstore", shown)
    query = urlsplit(url).query
    defaults: dict[str, Any] = {}
    if "timeout=" not in query:
        defaults["timeout"] = TRANSFER_TIMEOUT
    if "max_size=" not in query:
        defaults["max_size"] = TRANSFER_MAX_SIZE
    where = replace(where, **defaults)
    return make_store(where, directory, shown=shown), name, shown


def upload_file(url: str, path: str, *, overwrite: bool) -> None:
    """Copy the local file ``path`` to the object ``url`` names (``s3://bucket/dir/FILE``);
    without ``overwrite``, only if there is no such object yet.

    Raises:
        ConfigError: a bad URL.
        MissingDependency: obstore is not installed.
        FileExistsError: the object exists and ``overwrite`` is false.
        OSError: the store failed (the message says why, without credentials).
    """
    store, name, shown = _file_location(url)
    import obstore
    from obstore.exceptions import AlreadyExistsError, PreconditionError

    try:
        obstore.put(store, name, Path(path), mode="overwrite" if overwrite else "create")
    except (AlreadyExistsError, PreconditionError):
        raise ObjectExists(f"{shown} exists (use --force to replace it)") from None
    except Exception as e:
        raise RemoteError(f"cannot write {shown}: {first_line(e)}") from None


def download_file(url: str, path: str) -> int:
    """Copy the object ``url`` names to the new local file ``path``; its size. The object may
    be at most the URL's ``max_size`` (default 16G) and take at most its ``timeout`` (600s).

    Raises:
        ConfigError: a bad URL.
        MissingDependency: obstore is not installed.
        FileNotFoundError: there is no such object.
        OSError: the store failed, or the object is too large or too slow.
    """
    store, name, shown = _file_location(url)
    import obstore

    where = parse_object_url(url)
    limit = where.max_size if "max_size=" in urlsplit(url).query else TRANSFER_MAX_SIZE
    started = time.monotonic()
    try:
        result = obstore.get(store, name)
    except FileNotFoundError:
        raise ObjectMissing(f"no object {shown}") from None
    except Exception as e:
        raise RemoteError(f"cannot read {shown}: {first_line(e)}") from None
    if result.meta["size"] > limit:
        raise RemoteError(f"{shown} is {result.meta['size']} bytes, more than max_size={limit}")
    written = 0
    with open(path, "xb") as f:
        try:
            for chunk in result.stream(min_chunk_size=8 << 20):
                written += len(chunk)
                if written > limit:
                    break
                f.write(chunk)
        except Exception as e:
            elapsed = time.monotonic() - started
            raise RemoteError(f"cannot read {shown} ({elapsed:.1f}s): {first_line(e)}") from None
    if written > limit:
        raise RemoteError(f"{shown} is more than max_size={limit} bytes")
    return written
