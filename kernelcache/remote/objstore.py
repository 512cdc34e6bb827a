"""The object-store tier: S3 and S3-compatible stores (``s3://bucket/prefix``) and Google Cloud
Storage (``gs://bucket/prefix``), through obstore (docs/remote.md says why that library).

Invariants:

* One object per entry, ``<prefix>/v3/<key>`` (the value layout's version), holding the value
  every tier stores (:mod:`kernelcache.remote.codec`); what is read is verified like a Redis
  value.
* The first writer of a key wins: a conditional put (``If-None-Match: *``); a store without
  it is asked whether the object exists first.
* One builder per key across the job: a build lock is the object ``<key>.lock``, created only
  if absent, renewed by its holder (a conditional put on the version it wrote,
  ``If-Match``) every third of ``lease``, and deleted at its release. A waiter that sees the
  same version of a lock for ``lease`` seconds of its own clock (the holder stopped renewing
  it) takes it over with a conditional put on that version: no clock is compared across
  machines, and of two waiters that take over at once one wins. A store without conditional
  puts has no build locks.
* Every call is bounded: ``timeout`` for the whole request (connecting, headers, body), no
  retries, an object larger than ``max_size`` is refused from its length before its body is
  read, and a body is read in chunks that stop at ``max_size``.
* Credentials come only from the client library's standard sources (the environment,
  workload identity, instance metadata); a URL with credentials is refused, and none is logged.
* obstore is optional, imported when a tier is made.
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ..errors import (
    ConfigError,
    InvalidValue,
    ObjectExists,
    ObjectMissing,
    RemoteError,
    RemoteTimeout,
)
from ..process import HOST
from ..units import parse_bool, parse_duration, parse_size
from .base import TierBase, no_release
from .codec import REMOTE_FORMAT
from .tier import Busy, Claim
from .url import default_lease, lease_problems, read_options, redact

#: the URL schemes of object stores
SCHEMES = ("s3", "gs")


def _endpoint(text: str) -> str:
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.username:
        raise InvalidValue("expected http(s)://host[:port], without credentials")
    return text.rstrip("/")


#: option -> (parser, meaning)
OPTIONS: dict[str, tuple[Callable[[str], Any], str]] = {
    "timeout": (parse_duration, "seconds one request may take in all (default 5)"),
    "connect_timeout": (parse_duration, "seconds to connect (default 2)"),
    "max_size": (parse_size, "entries larger than this are not sent or read (default 64M)"),
    "breaker": (parse_duration, "after a failure, skip the store this long (default 30s)"),
    "read_only": (parse_bool, "1: only read this tier: no puts, backfill or locks (default 0)"),
    "lock_ttl": (parse_duration, "a build lock is renewed for at most this long (default 120s)"),
    "lease": (
        parse_duration,
        "a build lock not renewed for this long is taken over (default 2 x timeout, at least 5s)",
    ),
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
    lock_ttl: float = 120.0
    lease: float | None = None
    endpoint: str | None = None
    region: str | None = None

    @property
    def lease_s(self) -> float:
        """The lease of a build lock, in seconds (given, or :func:`default_lease`)."""
        return default_lease(self.timeout, self.lock_ttl) if self.lease is None else self.lease


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
    if not (0.001 <= found.lock_ttl <= 10**9):
        problems.append("lock_ttl must be from 1ms to 1,000,000,000s")
    problems += lease_problems(found.lease, found.timeout, found.lock_ttl)
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


#: the calls that write (a refusal of one is a bucket that refuses writes, not a down one)
_WRITES = ("put", "lock", "renew", "unlock")
#: the most bytes of a lock object read (its holder record is far smaller)
_LOCK_RECORD_MAX = 4096
#: the most locks a tier watches for renewals at once
_MAX_WATCHED = 4096
#: an object's version as its store tells it: (e_tag, version), either possibly None
Version = tuple[Any, Any]


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
            lease=self.where.lease_s,
            lock_ttl=self.where.lock_ttl,
            overwrite=overwrite,
        )
        #: the store's prefix: the URL's path, then the value layout's version
        self.prefix = "/".join(p for p in (self.where.path, f"v{REMOTE_FORMAT}") if p)
        self._made = threading.Lock()
        self._given = store
        self._store = store if store is not None else self._make()
        self._pid = os.getpid()
        #: lock object -> (the version seen, when this process first saw it): a version seen
        #: for ``lease`` seconds is a lock its holder stopped renewing
        self._watched: dict[str, tuple[Version, float]] = {}
        #: False once the store refused a conditional put: no build locks
        self._conditional = True

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
        """The object of an entry in the bucket: ``<path>/v3/<key>`` (in :attr:`store`, whose
        paths are under :attr:`prefix`, it is ``key``; its build lock is ``<key>.lock``)."""
        return f"{self.prefix}/{key}"

    # -- failure policy -------------------------------------------------------------------
    def _usable(self, shard: str = "") -> bool:
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
        return super()._usable(shard)

    def _failed(self, what: str, e: Exception) -> None:
        import obstore.exceptions as errors

        reason = f"{type(e).__name__}: {_first_line(e)}"
        if isinstance(e, errors.PermissionDeniedError) and what in _WRITES:
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

    # -- build locks ----------------------------------------------------------------------
    def _try_lock(self, key: str) -> Claim:
        """One try at the build lock of ``key`` (see :meth:`TierBase.try_acquire`): the entry
        is looked for first (there: nothing to build), then the lock object is created only
        if absent; a lock whose version this process has seen unchanged for its lease is
        taken over (one warning)."""
        if not self._conditional:
            return no_release
        if not self._writable():
            return None
        found, failed = self._call("lock", lambda store: _exists(store, key))
        if failed:
            return None
        if found:
            self._bump(lock_ready=1)
            return no_release
        lock = f"{key}.lock"
        token = uuid.uuid4().hex
        made, failed = self._call("lock", lambda store: self._put_lock(store, lock, token, None))
        if failed:
            return None
        if made == "unsupported":
            self._conditional = False
            self._warn(
                "no-locks",
                "remote cache %s has no conditional puts: no build locks there (machines may "
                "build a key at the same time)",
                self.url,
            )
            return no_release
        if isinstance(made, tuple):
            return self._held(key, lock, token, made)
        seen, failed = self._call("lock", lambda store: _read_lock(store, lock))
        if failed or seen is None:
            return Busy(self.name(lock), "unknown", self.label)  # gone meanwhile: try again
        version, record = seen
        holder = _holder(record)
        if not self._stale(lock, version, record):
            return Busy(self.name(lock), holder, self.label)
        taken, failed = self._call(
            "lock", lambda store: self._put_lock(store, lock, token, version)
        )
        if failed or not isinstance(taken, tuple):
            return Busy(self.name(lock), holder, self.label)
        self._bump(locks_broken=1)
        self._warn(
            "lock-broken",
            "took over the build lock of %s in %s: its holder (%s) had not renewed it for "
            "%gs; building",
            key,
            self.url,
            holder,
            self.lease,
        )
        return self._held(key, lock, token, taken)

    def _stale(self, lock: str, version: Version, record: bytes) -> bool:
        """Whether this process has seen ``version`` of ``lock`` for longer than its lease
        (the holder's, at least this tier's, at most ``lock_ttl``)."""
        now = time.monotonic()
        with self._lock:
            seen = self._watched.get(lock)
            if seen is None or seen[0] != version:
                if len(self._watched) >= _MAX_WATCHED:
                    del self._watched[next(iter(self._watched))]
                self._watched[lock] = (version, now)
                return False
        lease = min(max(self.lease, _declared_lease(record)), self.where.lock_ttl)
        return now - seen[1] > lease

    def _held(self, key: str, lock: str, token: str, version: Version) -> Callable[[], None]:
        """The release of a lock this process holds at ``version``, renewed meanwhile."""
        with self._lock:
            self._watched.pop(lock, None)
        current = [version]
        self._bump(locks=1)

        def renew(_seconds: float) -> bool | None:
            done, failed = self._call(
                "renew", lambda store: self._put_lock(store, lock, token, current[0])
            )
            if failed:
                return None
            if not isinstance(done, tuple):
                return False
            current[0] = done
            return True

        def release() -> None:
            gone, failed = self._call("unlock", lambda store: _delete_if(store, lock, current[0]))
            if not failed and not gone:
                self._bump(locks_lost=1)

        return self._holding(token, renew, release)

    def _put_lock(
        self, store: Any, lock: str, token: str, version: Version | None
    ) -> Version | str | None:
        """Write this process's record into ``lock``: only if absent (``version`` None), else
        only if it is still at ``version``. The version written; None when the condition
        failed; ``"unsupported"`` for a store without conditional puts."""
        import obstore
        from obstore.exceptions import AlreadyExistsError, NotSupportedError, PreconditionError

        record = {
            "holder": f"{HOST} pid {os.getpid()}",
            "token": token,
            "lease": self.lease,
            "time": time.time(),  # every write differs: a renewal makes a new version
        }
        mode: Any = "create" if version is None else _update_mode(version)
        try:
            result = obstore.put(store, lock, json.dumps(record).encode(), mode=mode)
        except (AlreadyExistsError, PreconditionError):
            return None
        except NotSupportedError:
            return "unsupported"
        return _version_of(result)


def _version_of(meta: Any) -> Version:
    return (meta.get("e_tag"), meta.get("version"))


def _update_mode(version: Version) -> dict[str, str]:
    """obstore's put mode that writes only over ``version`` (S3: If-Match on the e_tag; GCS:
    the generation)."""
    e_tag, generation = version
    mode = {"e_tag": e_tag} if e_tag is not None else {}
    if generation is not None:
        mode["version"] = generation
    return mode


def _read_lock(store: Any, path: str) -> tuple[Version, bytes] | None:
    """The version and record of the lock object ``path`` (a record larger than a holder's is
    not read: empty), or None if there is none."""
    import obstore

    try:
        result = obstore.get(store, path)
    except FileNotFoundError:
        return None
    if result.meta["size"] > _LOCK_RECORD_MAX:
        return _version_of(result.meta), b""
    return _version_of(result.meta), bytes(result.bytes())


def _exists(store: Any, path: str) -> bool:
    import obstore

    try:
        obstore.head(store, path)
    except FileNotFoundError:
        return False
    return True


def _delete_if(store: Any, path: str, version: Version) -> bool:
    """Delete ``path`` if it is still at ``version``; whether it was (a writer between the
    check and the delete loses its lock: the next waiter builds again, which is harmless)."""
    import obstore

    try:
        if _version_of(obstore.head(store, path)) != version:
            return False
    except FileNotFoundError:
        return False
    obstore.delete(store, path)
    return True


def _holder(record: bytes) -> str:
    """Who holds a lock, from its record, or "unknown"."""
    try:
        holder = json.loads(record).get("holder")
    except (ValueError, AttributeError):
        return "unknown"
    return holder[:200] if isinstance(holder, str) else "unknown"


def _declared_lease(record: bytes) -> float:
    """The lease a lock's record declares, in seconds (0 when it declares none)."""
    try:
        lease = json.loads(record).get("lease")
    except (ValueError, AttributeError):
        return 0.0
    return float(lease) if isinstance(lease, (int, float)) and lease > 0 else 0.0


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
            raise RemoteTimeout(f"reading {path} took more than {timeout:g}s")
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
        raise ObjectExists(f"{shown} exists (use --force to replace it)") from None
    except Exception as e:
        raise RemoteError(f"cannot write {shown}: {_first_line(e)}") from None


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
        raise ObjectMissing(f"no object {shown}") from None
    except Exception as e:
        raise RemoteError(f"cannot read {shown}: {_first_line(e)}") from None
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
            raise RemoteError(f"cannot read {shown} ({elapsed:.1f}s): {_first_line(e)}") from None
    if written > limit:
        raise RemoteError(f"{shown} is more than max_size={limit} bytes")
    return written


def _first_line(e: Exception) -> str:
    return (str(e).splitlines() or [type(e).__name__])[0][:300]
