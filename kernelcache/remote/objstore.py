"""The object-store tier: S3 and S3-compatible stores (``s3://bucket/prefix``) and Google Cloud
Storage (``gs://bucket/prefix``), through obstore (docs/remote.md says why that library).

Invariants:

* One object per entry, ``<prefix>/v2/<key>``, holding the value every tier stores
  (:mod:`kernelcache.remote.codec`); what is read is verified like a Redis value.
* The first writer of a key wins: a conditional put (``If-None-Match: *``); a store without
  it is asked whether the object exists first.
* Every call is bounded: ``timeout`` for the whole request (connecting, headers, body), no
  retries, an object larger than ``max_size`` is refused from its length before its body is
  read, and a body is read in chunks that stop at ``max_size``.
* Credentials come only from the client library's standard sources (the environment,
  workload identity, instance metadata); a URL with credentials is refused, and none is logged.
* obstore is optional, imported when a tier is made.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ..errors import ConfigError
from ..keys import check_key
from ..units import parse_bool, parse_duration, parse_size
from .base import TierBase
from .codec import REMOTE_FORMAT
from .url import read_options, redact

#: the URL schemes of object stores
SCHEMES = ("s3", "gs")


def _endpoint(text: str) -> str:
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.username:
        raise ValueError("expected http(s)://host[:port], without credentials")
    return text.rstrip("/")


#: option -> (parser, meaning)
OPTIONS: dict[str, tuple[Callable[[str], Any], str]] = {
    "timeout": (parse_duration, "seconds one request may take in all (default 5)"),
    "connect_timeout": (parse_duration, "seconds to connect (default 2)"),
    "max_size": (parse_size, "entries larger than this are not sent or read (default 64M)"),
    "breaker": (parse_duration, "after a failure, skip the store this long (default 30s)"),
    "read_only": (parse_bool, "1: only read this tier: no puts or backfill (default 0)"),
    "endpoint": (_endpoint, "the store's URL, for S3-compatible stores and emulators"),
    "region": (str, "the S3 region (default: from the environment)"),
}


@dataclass(frozen=True)
class ObjectURL:
    """An object-store URL: scheme, bucket, path (a prefix, or an object) and options."""

    scheme: str
    bucket: str
    path: str
    timeout: float = 5.0
    connect_timeout: float = 2.0
    max_size: int = 64 << 20
    breaker: float = 30.0
    read_only: bool = False
    endpoint: str | None = None
    region: str | None = None


def parse_object_url(url: str) -> ObjectURL:
    """Read an ``s3://`` or ``gs://`` URL.

    Raises:
        ConfigError: another scheme, no bucket, credentials in the URL, an unknown option or
            a bad value; the message names it.
    """
    shown = redact(url)
    try:
        parts = urlsplit(url.strip())
    except ValueError as e:
        raise ConfigError(f"remote URL {shown!r} is malformed: {e}") from None
    if parts.scheme not in SCHEMES:
        raise ConfigError(f"remote URL {shown!r}: use s3://bucket/prefix or gs://bucket/prefix")
    if "@" in parts.netloc:
        raise ConfigError(
            f"remote URL {shown!r}: credentials do not go in the URL; the client library reads "
            "them from the environment (AWS_ACCESS_KEY_ID, GOOGLE_APPLICATION_CREDENTIALS, ...)"
        )
    if not parts.netloc:
        raise ConfigError(f"remote URL {shown!r} names no bucket; use {parts.scheme}://bucket/...")
    parsers = {name: parser for name, (parser, _) in OPTIONS.items()}
    values = read_options(shown, parts.query, parsers)
    if parts.scheme == "gs" and "region" in values:
        raise ConfigError(f"remote URL {shown!r}: region is an option of s3:// URLs")
    found = ObjectURL(parts.scheme, parts.netloc, parts.path.strip("/"), **values)
    problems = []
    for name in ("timeout", "connect_timeout"):
        if not (0 < getattr(found, name) <= 86400):
            problems.append(f"{name} must be more than 0 and at most 1d")
    if found.max_size <= 0:
        problems.append("max_size must be more than 0")
    if problems:
        raise ConfigError(f"remote URL {shown!r}: {'; '.join(problems)}")
    return found


def make_store(where: ObjectURL, prefix: str, *, shown: str) -> Any:
    """The obstore store of a bucket, its paths under ``prefix`` (the prefix goes into
    requests as it is; a path's own ``/`` are encoded, which some emulators do not read)."""

    try:
        from obstore.store import GCSStore, S3Store
    except ImportError:
        raise ConfigError(
            f"the remote tier {shown!r} needs obstore: pip install 'kernelcache[s3]'"
        ) from None
    client: dict[str, Any] = {
        "timeout": f"{round(where.timeout * 1000)}ms",
        "connect_timeout": f"{round(where.connect_timeout * 1000)}ms",
    }
    if where.endpoint is not None and where.endpoint.startswith("http://"):
        client["allow_http"] = True
    config: dict[str, Any] = {}
    if where.endpoint is not None:
        config["endpoint" if where.scheme == "s3" else "base_url"] = where.endpoint
    if where.region is not None:
        config["region"] = where.region
    retry = {"max_retries": 0, "retry_timeout": timedelta(seconds=where.timeout)}
    cls: Any = S3Store if where.scheme == "s3" else GCSStore
    try:
        return cls(
            where.bucket, prefix=prefix or None, client_options=client, retry_config=retry, **config
        )
    except Exception as e:  # obstore's configuration errors
        raise ConfigError(f"remote URL {shown!r}: {e}") from None


#: the process whose requests started obstore's runtime (one per process, made at the first
#: request); a process forked from it after that cannot make requests: they would hang
_runtime_pid: int | None = None


def _runtime_here() -> bool:
    """Whether obstore can make requests in this process (and notes that it will)."""
    global _runtime_pid
    if _runtime_pid is None:
        _runtime_pid = os.getpid()
    return _runtime_pid == os.getpid()


def _no_release() -> None:
    """An object store has no locks: machines may build a key at the same time (harmless)."""


class ObjectStoreTier(TierBase):
    """The shared tier in an S3-compatible or GCS bucket (a
    :class:`kernelcache.remote.RemoteTier`, made as every :class:`kernelcache.remote.TierClass`
    is). Thread-safe. Construction does not connect. A process forked after the tier made
    requests skips it (obstore's runtime does not survive a fork); one forked before makes its
    own store.

    Raises:
        ConfigError: bad URL or options, or obstore is not installed.
    """

    def __init__(
        self,
        url: str,
        *,
        stats_root: str | None = None,
        signing_key: bytes | None = None,
        store: Any = None,
        overwrite: bool = False,
    ) -> None:
        self.where = parse_object_url(url)
        super().__init__(
            redact(url),
            stats_root=stats_root,
            signing_key=signing_key,
            breaker=self.where.breaker,
            max_size=self.where.max_size,
            read_only=self.where.read_only,
            overwrite=overwrite,
        )
        #: the store's prefix: the URL's path, then the value layout's version
        self.prefix = "/".join(p for p in (self.where.path, f"v{REMOTE_FORMAT}") if p)
        self._made = threading.Lock()
        self._given = store
        self._store = store if store is not None else self._make()
        self._pid = os.getpid()

    def _make(self) -> Any:
        return make_store(self.where, self.prefix, shown=self.url)

    @property
    def store(self) -> Any:
        """The obstore store (made again after ``fork``: its runtime does not survive one)."""
        with self._made:
            if self._pid != os.getpid() and self._given is None:
                self._store = self._make()
                self._pid = os.getpid()
            return self._store

    def name(self, key: str) -> str:
        """The object of an entry in the bucket: ``<path>/v2/<key>`` (in :attr:`store`, whose
        paths are under :attr:`prefix`, it is ``key``)."""
        return f"{self.prefix}/{key}"

    # -- failure policy -------------------------------------------------------------------
    def _usable(self) -> bool:
        if not _runtime_here():
            self._bump(skipped=1)
            self._warn(
                "forked",
                "remote cache %s is not used in this process: it was forked from one that used "
                "it, and obstore cannot make requests after a fork (start workers with the "
                "'spawn' or 'forkserver' method)",
                self.url,
            )
            return False
        return super()._usable()

    def _failed(self, what: str, e: Exception) -> None:
        import obstore.exceptions as errors

        reason = f"{type(e).__name__}: {_first_line(e)}"
        if isinstance(e, errors.PermissionDeniedError) and what == "put":
            self._refuse_writes(reason)
            return
        text = str(e).lower()
        timeout = "timed out" in text or "timeout" in text
        self._trip(what, reason, timeout=timeout)

    def _call(self, what: str, fn: Callable[[Any], Any]) -> tuple[Any, bool]:
        """``(fn(store), False)``, or ``(None, True)`` after a failure of the store, which is
        accounted for (counters, breaker, one warning). A missing object is ``(None, False)``."""
        try:
            return fn(self.store), False
        except FileNotFoundError:
            return None, False
        except Exception as e:  # obstore raises its own errors and built-in ones
            self._failed(what, e)
            return None, True

    def probe(self) -> str | None:
        """Whether the store answers (a HEAD of an object that is not there): None, or why
        not (nothing is counted or warned about)."""
        import obstore

        if not _runtime_here():
            return "this process was forked from one that used obstore"
        try:
            obstore.head(self.store, "kernelcache-probe")
        except FileNotFoundError:
            return None
        except Exception as e:
            return f"{type(e).__name__}: {_first_line(e)}"
        return None

    # -- the RemoteTier interface ---------------------------------------------------------
    def _fetch(self, key: str) -> tuple[bytes | int | None, bool]:
        return self._call(
            "get", lambda store: read_object(store, key, self.where.max_size, self.where.timeout)
        )

    def _discard(self, key: str) -> None:
        if not self.read_only:
            import obstore

            self._call("delete", lambda store: obstore.delete(store, key))

    def _send(self, key: str, value: bytes, replace: bool) -> tuple[bool, bool]:
        """Store ``value`` unless the key is there already (the first writer wins), or
        whatever is there with ``replace``."""
        stored, failed = self._call("put", lambda store: self._create(store, key, value, replace))
        return bool(stored) and not failed, failed

    def _create(self, store: Any, key: str, value: bytes, replace: bool) -> bool:
        """Write ``value`` only if the object is absent (or ``replace``); whether it was
        written."""
        import obstore
        from obstore.exceptions import AlreadyExistsError, NotSupportedError, PreconditionError

        path = key
        if replace:
            obstore.put(store, path, value)
            return True
        try:
            obstore.put(store, path, value, mode="create")
            return True
        except (AlreadyExistsError, PreconditionError):
            return False
        except NotSupportedError:
            pass  # a store without conditional puts: ask first (two writers may race)
        try:
            obstore.head(store, path)
            return False
        except FileNotFoundError:
            obstore.put(store, path, value)
            return True

    def acquire(self, key: str, timeout: float) -> Callable[[], None] | None:
        """An object store has no build locks: a function that releases nothing."""
        check_key(key)
        return _no_release


def read_object(store: Any, path: str, max_size: int, timeout: float) -> bytes | int | None:
    """The bytes of the object at ``path``, its size when it is larger than ``max_size`` (the
    body is then not read), or None if there is none. The body is read in chunks and refused
    past ``max_size`` whatever the length announced; the whole read takes at most ``timeout``
    (the client's own bound) and is checked against it here too.

    Raises:
        TimeoutError: the read took longer than ``timeout``.
        Exception: what obstore raises for a failure of the store.
    """
    import obstore

    started = time.monotonic()
    try:
        result = obstore.get(store, path)
    except FileNotFoundError:
        return None
    size = result.meta["size"]
    if size > max_size:
        return int(size)
    chunks, got = [], 0
    for chunk in result.stream(min_chunk_size=1 << 20):
        got += len(chunk)
        if got > max_size:
            return got
        if time.monotonic() - started > timeout:
            raise TimeoutError(f"reading {path} took more than {timeout:g}s")
        chunks.append(bytes(chunk))
    return b"".join(chunks)


# -- whole files (bundles) ----------------------------------------------------------------------
#: defaults of a file transfer where the URL does not set them (bundles are large)
TRANSFER_TIMEOUT = 600.0
TRANSFER_MAX_SIZE = 16 << 30


def _file_location(url: str) -> tuple[Any, str, str]:
    """``(store, object name, shown URL)`` of a URL naming one object (a bundle).

    Raises:
        ConfigError: not an object URL, no object name, or a bad option.
    """
    where = parse_object_url(url)
    shown = redact(url)
    directory, _, name = where.path.rpartition("/")
    if not name:
        raise ConfigError(f"{shown!r} names no object; use {where.scheme}://bucket/path/FILE")
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
        ConfigError: a bad URL, or obstore is not installed.
        FileExistsError: the object exists and ``overwrite`` is false.
        OSError: the store failed (the message says why, without credentials).
    """
    import obstore
    from obstore.exceptions import AlreadyExistsError, PreconditionError

    store, name, shown = _file_location(url)
    try:
        obstore.put(store, name, Path(path), mode="overwrite" if overwrite else "create")
    except (AlreadyExistsError, PreconditionError):
        raise FileExistsError(f"{shown} exists (use --force to replace it)") from None
    except Exception as e:
        raise OSError(f"cannot write {shown}: {_first_line(e)}") from None


def download_file(url: str, path: str) -> int:
    """Copy the object ``url`` names to the new local file ``path``; its size. The object may
    be at most the URL's ``max_size`` (default 16G) and take at most its ``timeout`` (600s).

    Raises:
        ConfigError: a bad URL, or obstore is not installed.
        FileNotFoundError: there is no such object.
        OSError: the store failed, or the object is too large or too slow.
    """
    import obstore

    store, name, shown = _file_location(url)
    where = parse_object_url(url)
    limit = where.max_size if "max_size=" in urlsplit(url).query else TRANSFER_MAX_SIZE
    started = time.monotonic()
    try:
        result = obstore.get(store, name)
    except FileNotFoundError:
        raise FileNotFoundError(f"no object {shown}") from None
    except Exception as e:
        raise OSError(f"cannot read {shown}: {_first_line(e)}") from None
    if result.meta["size"] > limit:
        raise OSError(f"{shown} is {result.meta['size']} bytes, more than max_size={limit}")
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
            raise OSError(f"cannot read {shown} ({elapsed:.1f}s): {_first_line(e)}") from None
    if written > limit:
        raise OSError(f"{shown} is more than max_size={limit} bytes")
    return written


def _first_line(e: Exception) -> str:
    return (str(e).splitlines() or [type(e).__name__])[0][:300]
