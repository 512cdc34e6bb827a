"""The object-store tier: S3 and S3-compatible stores (``s3://bucket/prefix``) and Google Cloud
Storage (``gs://bucket/prefix``), through obstore (docs/remote.md says why that library).

Invariants:

* One object per entry, ``<prefix>/v3/<group>/<key>`` (the value layout's version; the group of
  a key and of the companions derived from it: :func:`kernelcache.keys.group_of`), holding the value
  every tier stores (:mod:`kernelcache.remote.codec`); what is read is verified like a Redis
  value.
* The first writer of a key wins: a conditional put (``If-None-Match: *``); a store without
  it is asked whether the object exists first.
* One builder per key across the job: a build lock is the entry's object plus ``.lock``, created only
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

import errno
import json
import os
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from ...errors import RemoteError
from ...keys import group_of
from ...process import HOST
from ..base import TierBase
from ..codec import REMOTE_FORMAT
from ..contact import Abandoned, LookupSpent
from ..leases import no_release
from ..tier import Busy, Claim
from ..url import redact
from .location import parse_object_url
from .requests import (
    Version,
    declared_lease,
    delete_if,
    first_line,
    lock_holder,
    make_store,
    read_lock,
    read_object,
    runtime_here,
    update_mode,
    version_of,
    written_by,
)

_WRITES = ("put", "lock", "renew", "unlock")
#: the most locks a tier watches for renewals at once
_MAX_WATCHED = 4096


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
            here=self.usable_here,
            bound=self.where.timeout,
            timeout=self.where.timeout,
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
        """The object of an entry in the bucket: ``<path>/v3/<group>/<key>`` (in :attr:`store`,
        whose paths are under :attr:`prefix`, it is :meth:`path`; its build lock is that plus
        ``.lock``)."""
        return f"{self.prefix}/{self.path(key)}"

    @staticmethod
    def path(key: str) -> str:
        """The object of an entry in :attr:`store`: under its key's group (see
        :func:`kernelcache.keys.group_of`), with the companions derived from its key."""
        return f"{group_of(key)}/{key}"

    # -- failure policy -------------------------------------------------------------------
    def usable_here(self) -> bool:
        """Whether this process can make requests: not one forked from a process that made
        some (counted as skipped, warned about once); the policy asks it first."""
        if runtime_here():
            return True
        self.policy.count(skipped=1)
        self.policy.warn(
            "forked",
            "remote cache %s is not used in this process: it was forked from one that used "
            "it, and obstore cannot make requests after a fork (start workers with the "
            "'spawn' or 'forkserver' method)",
            self.url,
        )
        return False

    def _failed(self, what: str, e: BaseException) -> bool:
        """Account for a failed request; whether the store answered it (a refusal)."""
        import obstore.exceptions as errors

        if isinstance(e, Abandoned):  # its breaker opened meanwhile: accounted for there
            self.policy.count(abandoned=1)
            return False
        if not isinstance(e, Exception):
            raise e
        reason = f"{type(e).__name__}: {first_line(e)}"
        if isinstance(e, errors.PermissionDeniedError) and what in _WRITES:
            self.policy.refuse_writes(reason)
            return True
        text = str(e).lower()
        timeout = "timed out" in text or "timeout" in text
        self.policy.trip(what, reason, timeout=timeout)
        return False

    def _call(self, what: str, fn: Callable[[Any], Any]) -> tuple[Any, bool]:
        """``(fn(store), False)``, or ``(None, True)`` when the request was not made (the
        breaker is open, or another process of the node makes the first contact: see
        :meth:`FailurePolicy.admit`), failed (accounted for: counters, breaker, one warning)
        or was abandoned (the breaker opened while it was in flight). A missing object is
        ``(None, False)``. Each request is admitted on its own: the breaker is read before
        each, and it runs in a thread that is not waited for once the breaker opens."""
        policy = self.policy
        ticket = policy.admit()
        if ticket is None:
            return None, True
        answered: bool | None = None
        try:
            store = self.store
            result, error = policy.contact.watch(ticket, lambda: fn(store))
            if error is None or isinstance(error, FileNotFoundError):
                answered = True
                return result, False
            if isinstance(error, LookupSpent):  # (not a failure of the store)
                policy.spent()
                return None, True
            answered = self._failed(what, error)
            return None, True
        finally:
            policy.settle(ticket, answered)

    def probe(self) -> str | None:
        """Whether the store answers (a HEAD of an object that is not there): None, or why
        not (nothing is counted or warned about)."""
        import obstore

        if not runtime_here():
            return "this process was forked from one that used obstore"
        try:
            obstore.head(self.store, "kernelcache-probe")
        except FileNotFoundError:
            return None
        except Exception as e:
            return f"{type(e).__name__}: {first_line(e)}"
        return None

    # -- the RemoteTier interface ---------------------------------------------------------
    def _fetch(self, key: str) -> tuple[bytes | int | None, bool]:
        return self._call(
            "get",
            lambda store: read_object(
                store, self.path(key), self.where.max_size, self.where.timeout
            ),
        )

    def _discard(self, key: str) -> None:
        if not self.read_only:
            import obstore

            self._call("delete", lambda store: obstore.delete(store, self.path(key)))

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

        path = self.path(key)
        if replace:
            _put(store, path, value)
            return True
        try:
            _put(store, path, value, mode="create")
            return True
        except (AlreadyExistsError, PreconditionError):
            return False
        except NotSupportedError:
            pass  # a store without conditional puts: ask first (two writers may race)
        try:
            obstore.head(store, path)
            return False
        except FileNotFoundError:
            _put(store, path, value)
            return True

    # -- build locks ----------------------------------------------------------------------
    def _try_lock(self, key: str) -> Claim:
        """One try at the build lock of ``key`` (see :meth:`TierBase.try_acquire`): the entry
        is read first (there: nothing to build, and the next read of it takes what was read),
        then the lock object is created only
        if absent; a lock whose version this process has seen unchanged for its lease is
        taken over (one warning)."""
        if not self._conditional:
            return no_release
        if not self.policy.writable():
            return None
        found, failed = self._call(
            "lock",
            lambda store: read_object(
                store, self.path(key), self.where.max_size, self.where.timeout
            ),
        )
        if failed:
            return None
        if found is not None:
            self.policy.count(lock_ready=1)
            if isinstance(found, bytes):  # (the entry: what the next read takes)
                self._found(key, found)
            return no_release
        lock = f"{self.path(key)}.lock"
        named = self.name(key) + ".lock"  # (as messages name it: in the bucket)
        token = uuid.uuid4().hex
        made, failed = self._lock_request(lock, token, None)
        if failed:
            return None
        if made == "unsupported":
            self._conditional = False
            self.policy.warn(
                "no-locks",
                "remote cache %s has no conditional puts: no build locks there (machines may "
                "build a key at the same time)",
                self.url,
            )
            return no_release
        if isinstance(made, tuple):
            return self._held(key, lock, token, made)
        seen, failed = self._call("lock", lambda store: read_lock(store, lock))
        if failed or seen is None:
            return Busy(named, "unknown", self.label)  # gone meanwhile: try again
        version, record = seen
        holder = lock_holder(record)
        if not self._stale(lock, version, record):
            return Busy(named, holder, self.label)
        taken, failed = self._lock_request(lock, token, version)
        if failed or not isinstance(taken, tuple):
            return Busy(named, holder, self.label)
        self.policy.count(locks_broken=1)
        self.policy.warn(
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
        lease = min(max(self.lease, declared_lease(record)), self.where.lock_ttl)
        return now - seen[1] > lease

    def _lock_request(self, lock: str, token: str, version: Version | None) -> tuple[Any, bool]:
        """:meth:`_put_lock` as a request (:meth:`_call`). Where this process stopped waiting
        for its answer (the lookup's time in the tier ran out, the breaker opened) and the
        lock was written all the same, it is deleted again: left, it would hold every other
        machine off for its lease."""
        guard = threading.Lock()
        seen: dict[str, Any] = {}  # "made": what the write made; "left": nobody waits for it

        def put(store: Any) -> Any:
            made = self._put_lock(store, lock, token, version)
            with guard:
                seen["made"], left = made, "left" in seen
            if left and isinstance(made, tuple):  # (in the request's own thread)
                delete_if(store, lock, made)
            return made

        made, failed = self._call("lock", put)
        if failed:
            with guard:
                seen["left"], landed = True, seen.get("made")
            if isinstance(landed, tuple):  # (it landed as the wait for it ended)
                self._off_path(lambda: self._call("unlock", lambda s: delete_if(s, lock, landed)))
        return made, failed

    def _held(self, key: str, lock: str, token: str, version: Version) -> Callable[[], None]:
        """The release of a lock this process holds at ``version``, renewed meanwhile."""
        with self._lock:
            self._watched.pop(lock, None)
        current = [version]
        self.policy.count(locks=1)

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
            gone, failed = self._call("unlock", lambda store: delete_if(store, lock, current[0]))
            if not failed and not gone:
                self.policy.count(locks_lost=1)

        return self._holding(token, renew, release)

    def _put_lock(
        self, store: Any, lock: str, token: str, version: Version | None
    ) -> Version | str | None:
        """Write this process's record into ``lock``: only if absent (``version`` None), else
        only if it is still at ``version``. The version written (also when the condition
        failed because this write's own first try had landed); None when the condition
        failed; ``"unsupported"`` for a store without conditional puts."""
        from obstore.exceptions import AlreadyExistsError, NotSupportedError, PreconditionError

        record = {
            "holder": f"{HOST} pid {os.getpid()}",
            "token": token,
            "lease": self.lease,
            "time": time.time(),  # every write differs: a renewal makes a new version
        }
        mode: Any = "create" if version is None else update_mode(version)
        try:
            result = _put(store, lock, json.dumps(record).encode(), mode=mode)
        except (AlreadyExistsError, PreconditionError):
            return written_by(store, lock, token)
        except NotSupportedError:
            return "unsupported"
        return version_of(result)


def _put(store: Any, path: str, data: bytes, **options: Any) -> Any:
    """``obstore.put``, where a write answered "not found" (S3's NoSuchBucket: a bucket that
    does not exist, or an endpoint that says so) is a failure of the store, not a missing
    object: a lock written there is never taken for one held elsewhere.

    Raises:
        RemoteError: the store answered the write with "not found".
    """
    import obstore

    try:
        return obstore.put(store, path, data, **options)
    except FileNotFoundError as e:
        raise RemoteError(
            errno.ENOENT, f"a write was answered 'not found': {first_line(e)}"
        ) from None
