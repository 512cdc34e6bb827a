"""Requests to an object store through obstore, each bounded: making the store of a URL, reading
an object no larger than ``max_size`` within ``timeout`` (from its length before its body, in
chunks that stop at ``max_size``), lock objects and their versions, conditional deletes.
obstore is imported when a store is made; a process forked after obstore's runtime started
makes no requests (they would hang).
"""

from __future__ import annotations

import json
import os
import time
from datetime import timedelta
from typing import Any

from ...errors import (
    ConfigError,
    RemoteTimeout,
)
from ...optional import needs
from ...process import printable
from .location import ObjectURL

#: a request the store answered with a server error (5xx) or whose connection failed is sent
#: once more after about this long, when it failed within half its timeout: one bad answer of
#: a bucket (S3 asks clients to retry its sporadic 500 and 503) does not make the node give up
#: the tier, and a request that timed out is not sent again (a hung store costs one timeout).
#: A write sent again after its first try landed finds its own write (see ``written_by``).
_RETRY_WAIT = timedelta(milliseconds=50)
#: the most bytes of a lock object read (its holder record is far smaller)
_LOCK_RECORD_MAX = 4096
#: the longest lease a lock's record may declare, in seconds (a day)
_LONGEST_LEASE = 86400
#: an object's version as its store tells it: (e_tag, version), either possibly None
Version = tuple[Any, Any]


def make_store(where: ObjectURL, prefix: str, *, shown: str) -> Any:
    """The obstore store of a bucket, its paths under ``prefix`` (the prefix goes into
    requests as it is; a path's own ``/`` are encoded, which some emulators do not read)."""

    try:
        from obstore.store import GCSStore, S3Store
    except ImportError:
        raise ConfigError(needs(f"the remote tier {shown!r}", "obstore")) from None
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
    retry = {
        "max_retries": 1,
        "retry_timeout": timedelta(seconds=where.timeout / 2),
        "backoff": {"init_backoff": _RETRY_WAIT, "max_backoff": _RETRY_WAIT * 4},
    }
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


def runtime_here() -> bool:
    """Whether obstore can make requests in this process (and notes that it will)."""
    global _runtime_pid
    if _runtime_pid is None:
        _runtime_pid = os.getpid()
    return _runtime_pid == os.getpid()


def version_of(meta: Any) -> Version:
    return (meta.get("e_tag"), meta.get("version"))


def update_mode(version: Version) -> dict[str, str]:
    """obstore's put mode that writes only over ``version`` (S3: If-Match on the e_tag; GCS:
    the generation)."""
    e_tag, generation = version
    mode = {"e_tag": e_tag} if e_tag is not None else {}
    if generation is not None:
        mode["version"] = generation
    return mode


def read_lock(store: Any, path: str) -> tuple[Version, bytes] | None:
    """The version and record of the lock object ``path`` (a record larger than a holder's is
    not read: empty), or None if there is none."""
    import obstore

    try:
        result = obstore.get(store, path)
    except FileNotFoundError:
        return None
    version = version_of(result.meta)
    if result.meta["size"] > _LOCK_RECORD_MAX:
        return version, b""
    chunks, got = [], 0  # (in chunks, whatever length was announced: a body may go on)
    for chunk in result.stream(min_chunk_size=_LOCK_RECORD_MAX + 1):
        got += len(chunk)
        if got > _LOCK_RECORD_MAX:
            return version, b""
        chunks.append(bytes(chunk))
    return version, b"".join(chunks)


def written_by(store: Any, path: str, token: str) -> Version | None:
    """The version of the lock object ``path`` if its record is the one of ``token`` (a
    conditional write that failed its condition because its own first try had landed), else
    None."""
    seen = read_lock(store, path)
    return seen[0] if seen is not None and _field(seen[1], "token") == token else None


def delete_if(store: Any, path: str, version: Version) -> bool:
    """Delete ``path`` if it is still at ``version``; whether it was (a writer between the
    check and the delete loses its lock: the next waiter builds again, which is harmless)."""
    import obstore

    try:
        if version_of(obstore.head(store, path)) != version:
            return False
    except FileNotFoundError:
        return False
    obstore.delete(store, path)
    return True


def _field(record: bytes, name: str) -> Any:
    """The field ``name`` of a lock's record (untrusted JSON), or None."""
    try:
        return json.loads(record).get(name)
    except (ValueError, AttributeError, RecursionError):
        return None


def lock_holder(record: bytes) -> str:
    """Who holds a lock, from its record, or "unknown"."""
    holder = _field(record, "holder")
    return printable(holder[:200]) if isinstance(holder, str) else "unknown"


def declared_lease(record: bytes) -> float:
    """The lease a lock's record declares, in seconds (0 when it declares none)."""
    lease = _field(record, "lease")
    # (compared before conversion: a float cannot hold 10**400)
    if type(lease) in (int, float) and 0 < lease <= _LONGEST_LEASE:
        return float(lease)
    return 0.0


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


def first_line(e: Exception) -> str:
    """The first line of what a failure says (the server's words, escaped)."""
    return printable((str(e).splitlines() or [type(e).__name__])[0][:300])
