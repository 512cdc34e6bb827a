"""The cache: ordered layers over the storage format, and the policy of what to do on failure.

Reads go to the writable root, then each read-only root in order, then the remote tier (if
any); a remote hit is verified and published into the writable root. Writes go to the writable
root (and the remote tier); the first writer of a key wins, except where ``replace`` (or
``rebuild``, single flight) puts an entry in place of the writable root's (never of the remote
tier's value). ``get_or_create`` runs at most one ``build`` per key at a time across every
process sharing the writable root (single flight): the others wait for the builder's lock and
then read its result. ``get_or_create_many`` does the same for many keys
with work stealing: a process builds every missing key whose lock is free before it waits for
the keys that other processes are building, and takes over those whose builder died. With a
remote tier the same holds across machines: a key whose job-wide lock another machine holds is
set aside while the process builds the others, and asked again with back-off.

Failures of the cache never fail the caller's job: ``get`` turns them into misses and
``get_or_create`` into an artifact built in memory, with one warning per kind of failure. An
entry the writable root cannot take (a full disk) still goes to the remote tier.

Every call waits at most the lock timeout in all, over all its keys and all its waits (locks,
readers of a corrupt entry, the remote tier's lock): one :class:`~kernelcache.locks.WaitBudget`
per call, which stands still while the call builds. A call whose budget is spent tries each
lock once and never waits again.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .. import stats, units
from ..config import Settings, settings
from ..errors import CacheError, ConfigError, InvalidValue, LockTimeout, WrongExt
from ..keys import check_ext, check_key
from ..maintenance.capacity import SizeCap
from ..problem import Problem
from ..process import warn_once
from ..remote import RemoteTier, check_entry, open_remote
from ..remote.tier import POLL_FIRST as REMOTE_POLL_FIRST
from ..remote.tier import Busy, Claim, next_poll, try_lock
from ..schema.document import make_metadata
from ..store.entry import Artifact, as_bytes
from ..store.layout import resolve_root
from ..store.locks.budget import WaitBudget
from ..store.locks.locker import Held
from ..store.root import Store

logger = logging.getLogger(__name__)

BuildFn = Callable[[], "tuple[bytes, Mapping[str, Any]]"]
#: the first and the longest pause between two rounds of tries while other processes build
POLL_FIRST = 0.0005
POLL_MAX = 0.01


class _Busy:
    """A build lock another process holds."""


_BUSY = _Busy()


@dataclass(frozen=True)
class BuildItem:
    """One entry asked of :meth:`Cache.get_or_create_many`: ``build()`` makes it on a miss,
    returning ``(data, meta)``."""

    key: str
    ext: str
    build: BuildFn


def readonly_problem(root: str | os.PathLike[str]) -> str | None:
    """Why the read-only root ``root`` cannot serve anything as given, with the remedy; None
    when it is an absolute path to a directory."""
    path = os.fspath(root)
    if not os.path.isabs(path):
        return (
            f"{path!r} is a relative path, read from the current directory "
            f"({os.getcwd()}): give an absolute path"
        )
    if not os.path.isdir(path):
        what = "is not a directory" if os.path.lexists(path) else "does not exist"
        return f"{path} {what}: nothing is read from it (fix the path, or remove it)"
    return None


#: how many validated (key, ext) pairs a cache remembers
_VALID_MEMO = 1 << 16


class Cache:
    """A kernel cache over one writable root, read-only roots and an optional remote tier.

    Args:
        root: the writable root; None for ``$KERNELCACHE_DIR`` or the user cache directory.
        readonly_roots: roots searched after ``root`` and never written (e.g. a layer baked
            into a container image); None for ``$KERNELCACHE_READONLY_DIRS``.
        remote: None for ``$KERNELCACHE_REMOTE``, "" for none, a URL such as
            ``redis://host:6379/0``, several separated by whitespace (tiers tried in order,
            see docs/remote.md), an object implementing :class:`RemoteTier`, or a sequence of
            URLs and such objects.
        lock_timeout: seconds to wait for a per-key lock before building privately; None for
            ``$KERNELCACHE_LOCK_TIMEOUT``.
        lock_mode: "auto", "flock" or "soft"; None for ``$KERNELCACHE_LOCK_MODE``.
        max_size: a size cap of the writable root in bytes, or a size such as ``"50G"``:
            least recently used entries are evicted past it (see :mod:`kernelcache.capacity`);
            None for ``$KERNELCACHE_MAX_SIZE``; 0 for none.
    """

    def __init__(
        self,
        root: str | os.PathLike[str] | None = None,
        readonly_roots: Sequence[str | os.PathLike[str]] | None = None,
        remote: str | RemoteTier | Sequence[str | RemoteTier] | None = None,
        *,
        lock_timeout: float | None = None,
        lock_mode: str | None = None,
        max_size: int | str | None = None,
    ) -> None:
        cfg = settings()
        self.lock_timeout = cfg.lock_timeout if lock_timeout is None else float(lock_timeout)
        mode = cfg.lock_mode if lock_mode is None else lock_mode
        self.store = Store.from_settings(
            resolve_root(root, cfg),
            cfg,
            lock_mode=mode,
            lock_timeout=self.lock_timeout,
        )
        self.root = self.store.root
        ro = cfg.readonly_roots if readonly_roots is None else readonly_roots
        named = "KERNELCACHE_READONLY_DIRS" if readonly_roots is None else "readonly_roots"
        for r in ro:
            problem = readonly_problem(r)
            if problem is not None:
                warn_once(logger, ("readonly", os.fspath(r)), "kernelcache: %s: %s", named, problem)
        self.readonly = [Store.from_settings(r, cfg, readonly=True) for r in ro]
        from_env = remote is None
        if remote is None:
            remote = cfg.remote or ""
        self.remote: RemoteTier | None
        if isinstance(remote, (str, list, tuple)):  # before the protocol's check, which is slow
            self.remote = self._open_remote(remote, cfg, from_env)
        elif isinstance(remote, RemoteTier):
            self.remote = remote
        else:
            self.remote = self._open_remote(remote, cfg, from_env)
        self.disabled = cfg.disable
        #: (key, ext) pairs :meth:`get` has validated (its hot path checks each pair once)
        self._valid: set[tuple[str, str]] = set()
        if cfg.stats_log and not self.disabled:
            stats.enable_log(self.root)
        cap = cfg.max_size if max_size is None else max_size
        if isinstance(cap, str):
            cap = units.parse_size(cap)
        if isinstance(cap, bool) or not isinstance(cap, int) or cap < 0:
            raise InvalidValue(f"max_size must be a size such as '50G' or bytes >= 0, not {cap!r}")
        #: the size cap of the writable root (None: none)
        self.capacity = SizeCap(self.store, cap) if cap and not self.disabled else None

    def _open_remote(
        self, remote: str | Sequence[str | RemoteTier], cfg: Settings, from_env: bool = False
    ) -> RemoteTier | None:
        """The remote tier of ``remote``; None (off, warned once) when the signing key that
        must authenticate its values cannot be used (never unsigned values instead), or when
        ``$KERNELCACHE_REMOTE`` (``from_env``) holds a URL its tier cannot use: never a failed
        job for a setting of the tier. A URL given as an argument that cannot be used is an
        error (ConfigError)."""
        if not remote:
            return None
        try:
            key = cfg.signing_secret()
        except ConfigError as e:
            warn_once(
                logger,
                ("signing-key", str(e)),
                "kernelcache: %s; the remote tier is off until the key is fixed (local layers "
                "still work; `kernelcache doctor` checks it)",
                e,
            )
            return None
        try:
            return open_remote(
                remote, stats_root=self.root, signing_key=key, overwrite=cfg.remote_overwrite
            )
        except ConfigError as e:
            if not from_env:
                raise
            warn_once(
                logger,
                ("remote-url", str(e)),
                "kernelcache: KERNELCACHE_REMOTE: %s; the remote tier is off until it is fixed "
                "(local layers still work; `kernelcache doctor` checks it)",
                e,
            )
            return None

    def __repr__(self) -> str:
        ro = [s.root for s in self.readonly]
        return f"Cache(root={self.root!r}, readonly_roots={ro!r}, remote={self.remote!r})"

    @property
    def layers(self) -> list[Store]:
        """The local roots in search order: the writable root, then the read-only ones."""
        return [self.store, *self.readonly]

    # -- reading --------------------------------------------------------------------------
    def get(self, key: str, ext: str, *, counted: bool | str = True) -> Artifact | None:
        """Return the verified artifact for ``key``, or None.

        A corrupt entry is a miss: it is quarantined (in the writable root) and counted.
        ``counted``: True, a lookup of one of the entries the hit rate is about (one per
        kernel); False, none of them (hits and misses are not counted; corruption and errors
        are); or a class of lookups counted apart (``"companion"``, ``"memo"``: see
        :data:`kernelcache.stats.LOOKUP_CLASSES`).

        Raises:
            ValueError: ``key``, ``ext`` or ``counted`` is malformed (checked before any file
                is touched).
        """
        if (key, ext) not in self._valid:
            check_key(key)
            check_ext(ext)
            if len(self._valid) >= _VALID_MEMO:
                self._valid.clear()
            self._valid.add((key, ext))
        names = stats.lookup_counters(counted)
        art = self._lookup(key, ext, WaitBudget(self.lock_timeout), names)
        if not isinstance(art, Artifact):
            art = None
            if names is not None:
                stats.count(self.root, **{names[1]: 1})
        return art

    def quarantine(self, art: Artifact, reason: str) -> bool:
        """Report ``art`` (what a read returned) unusable for ``reason``: a corrupt entry,
        counted, and quarantined where it lies in the writable root and still holds the same
        artifact (re-checked under its lock: :meth:`Store.repair`). A caller that checks more
        than a read does (e.g. which machine a kernel's code is for) calls it, then builds the
        entry again. Returns whether the entry is gone (not for an entry of a read-only root,
        one replaced meanwhile, or one whose readers held it for the lock timeout)."""
        stats.count(self.root, corrupt=1)
        digest = art.meta.get("digest")
        if self.disabled or art.path is None or os.path.dirname(art.path) != self.root:
            return False

        def same(now: Artifact) -> str | None:
            return reason if now.meta.get("digest") == digest else None

        found = self.store.repair(art.key, art.ext, refuse=same)
        return isinstance(found, Problem) and not os.path.lexists(self.store.meta_path(art.key))

    def _lookup(
        self,
        key: str,
        ext: str,
        budget: WaitBudget,
        names: tuple[str, str] | None = ("hits", "misses"),
        *,
        remote: bool = True,
    ) -> Artifact | WrongExt | None:
        """Search every layer (the remote tier too, unless ``remote`` is false), waiting at
        most what is left of ``budget``; count hits (in the counters ``names``:
        :func:`kernelcache.stats.lookup_counters`; None: not counted), corruption and errors,
        but not misses. WrongExt (returned, not raised) when the writable root holds the key
        with another extension."""
        if self.disabled:
            return None
        for store in (self.store, *self.readonly):
            try:
                result = store.get_checked(key, ext, wait=budget)
            except OSError as e:
                stats.count(self.root, errors=1)
                warn_once(
                    logger, (store.root, "read"), "kernelcache: cannot read %s: %s", store.root, e
                )
                continue
            if isinstance(result, Artifact):
                if names is not None:
                    stats.count_hit(self.root, names[0], len(result.data))
                return result
            if isinstance(result, Problem):
                if result.corrupt:
                    stats.count(self.root, corrupt=1)
                elif result.untrusted:
                    stats.count(self.root, untrusted=1)
                elif store is self.store and result.ext not in (None, ext):
                    return WrongExt(f"key {key} already holds a .{result.ext} artifact")
        if self.remote is not None and remote:
            return self._remote_lookup(key, ext, budget, names)
        return None

    def _remote_lookup(
        self,
        key: str,
        ext: str,
        budget: WaitBudget,
        names: tuple[str, str] | None = ("hits", "misses"),
    ) -> Artifact | None:
        """Read ``key`` from the remote tier, check it like a local entry (schema, entry digest,
        artifact digest) and publish it locally. Never raises: whatever the tier returns or
        raises is a hit or a miss."""
        assert self.remote is not None
        try:
            found = self.remote.get(key, ext)
        except Exception as e:  # a tier must not raise; if one does, it is a miss
            stats.count(self.root, remote_errors=1)
            warn_once(
                logger, (self.root, "remote-raised"), "kernelcache: the remote tier failed: %r", e
            )
            return None
        if found is None:
            stats.count(self.root, remote_misses=1)
            return None
        checked = check_entry(found, key, ext)
        if isinstance(checked, str):
            stats.count(self.root, remote_errors=1, corrupt=1)
            warn_once(
                logger,
                (self.root, "remote-corrupt"),
                "kernelcache: rejected a corrupt remote entry (%s): %s",
                key,
                checked,
            )
            return None
        data, meta = checked
        hit = {names[0]: 1, "bytes_read": len(data)} if names is not None else {}
        stats.count(self.root, remote_hits=1, **hit)
        try:  # the document as its writer wrote it: what it covers is never widened here
            art = self._publish(key, ext, data, meta, budget.remaining(), as_written=True)
        except (CacheError, WrongExt, ValueError) as e:  # ValueError: larger once re-encoded
            warn_once(
                logger, (self.root, "write"), "kernelcache: cannot store under %s: %s", self.root, e
            )
            return Artifact(key, ext, data, None, meta, "remote")
        return Artifact(art.key, art.ext, art.data, art.path, art.meta, "remote")

    # -- writing --------------------------------------------------------------------------
    def put(
        self,
        key: str,
        ext: str,
        data: bytes,
        meta: Mapping[str, Any],
        *,
        wait: float | None = None,
    ) -> Artifact:
        """Store an artifact atomically; the first complete writer of a key wins.

        Returns the stored artifact (the earlier one if the key was already present). Waits at
        most ``wait`` seconds for the key's lock (None: the lock timeout; 0: try once).

        Raises:
            TypeError: ``data`` is not bytes.
            ValueError: malformed key, ext or metadata.
            CacheError: the writable root cannot take the entry (message says why); nothing
                partial is left behind there. The remote tier still gets it.
        """
        check_key(key)
        check_ext(ext)
        return self._put(key, ext, data, meta, wait)

    def replace(
        self,
        key: str,
        ext: str,
        data: bytes,
        meta: Mapping[str, Any],
        *,
        wait: float | None = None,
    ) -> Artifact:
        """Store an artifact in place of the entry the writable root holds under ``key``, if
        any (:meth:`put` keeps the first writer's). Atomic as a put: a reader gets the earlier
        entry or this one, never a mix. An entry of ``key`` in a read-only root stays, unread
        (the writable root is searched first).

        The remote tier never replaces a value (its first writer wins): the entry is sent to it
        as by :meth:`put`, and where the tier holds another value for ``key``, or did not take
        this one, one warning says so; machines that read ``key`` from the tier still get
        its value there.

        Raises:
            as :meth:`put`.
        """
        check_key(key)
        check_ext(ext)
        return self._put(key, ext, data, meta, wait, replace=True)

    def rebuild(self, key: str, ext: str, build: BuildFn, *, stale: Artifact) -> Artifact:
        """Build ``key`` again in place of ``stale``: what a read of ``key`` returned that the
        caller cannot use (a document it refuses inside a whole entry).

        Single flight across the processes sharing the writable root: under the key's build
        lock (the one :meth:`get_or_create` takes; the remote tier's is not taken), an entry
        other than ``stale`` (another process rebuilt it meanwhile) is returned as it is;
        otherwise ``build()`` runs and what it made replaces ``stale`` (:meth:`replace`). A
        lock not had within the lock timeout is built without, and a result that cannot be
        stored is returned from memory, each with one warning.

        Raises:
            ValueError: malformed key or ext.
            Exception: whatever ``build`` raises.
        """
        check_key(key)
        check_ext(ext)
        budget = WaitBudget(self.lock_timeout)
        if self.disabled:
            return self._build(key, ext, build, None)
        held: Held | None = None
        try:
            held = self.store.locker.acquire(
                key + ".build", shared=False, timeout=self.lock_timeout
            )
        except LockTimeout:
            warn_once(
                logger,
                (self.root, "build-lock"),
                "kernelcache: waited %.0fs for another builder under %s; building privately",
                self.lock_timeout,
                self.root,
            )
        except CacheError as e:
            warn_once(logger, (self.root, "locks"), "kernelcache: building without a lock: %s", e)
        try:
            now = self._local_lookup(key, ext)
            if now is not None and now.meta.get("digest") != stale.meta.get("digest"):
                return now
            return self._build(key, ext, build, budget, replace=True)
        finally:
            if held is not None:
                held.release()

    def _put(
        self,
        key: str,
        ext: str,
        data: bytes,
        meta: Mapping[str, Any],
        wait: float | None,
        *,
        replace: bool = False,
    ) -> Artifact:
        """:meth:`put` (or :meth:`replace`), waiting at most ``wait`` seconds (None: the lock
        timeout)."""
        if self.disabled:
            return self._in_memory(key, ext, data, meta)
        try:
            art = self._publish(key, ext, data, meta, wait, replace=replace)
        except CacheError:
            stats.count(self.root, errors=1)
            if self.remote is not None and self.remote.put(key, ext, as_bytes(data), meta):
                stats.count(self.root, remote_puts=1)  # other machines still get it
            raise
        stats.count(self.root, puts=1, bytes_written=len(art.data))
        if self.remote is not None and self.remote.put(key, ext, art.data, art.meta):
            stats.count(self.root, remote_puts=1)
        elif self.remote is not None and replace:
            self._remote_kept(art)
        return art

    def _remote_kept(self, art: Artifact) -> None:
        """Warn once when the remote tier, which never replaces a value, does not hold the
        value of ``art`` that this process just put in place of another one."""
        assert self.remote is not None
        try:
            found = self.remote.get(art.key, art.ext)
        except Exception:  # a tier must not raise; if one does, it holds nothing we can read
            found = None
        if found is not None and found[0] == art.data:
            return
        what = (
            "did not take it (unavailable, or read-only)"
            if found is None
            else "keeps its earlier value (a remote value is never replaced)"
        )
        warn_once(
            logger,
            (self.root, "remote-kept", art.key),
            "kernelcache: replaced %s.%s under %s, but the remote tier %s: machines that read it "
            "from the tier get that value, not this one",
            art.key,
            art.ext,
            self.root,
            what,
        )

    def _publish(
        self,
        key: str,
        ext: str,
        data: bytes,
        meta: Mapping[str, Any],
        wait: float | None,
        *,
        replace: bool = False,
        as_written: bool = False,
    ) -> Artifact:
        """Publish into the writable root (``replace``: in place of an entry there;
        ``as_written``: ``meta`` is a document another process wrote, see
        :meth:`Store.publish`), and account for what it added under the size cap (waiting
        within the same ``wait`` where the root is past the cap's bound)."""
        budget = WaitBudget(self.lock_timeout if wait is None else wait)
        art, published = self.store.publish(
            key, ext, data, meta, wait=wait, replace=replace, as_written=as_written
        )
        if published and self.capacity is not None:
            try:
                meta_size = os.stat(self.store.meta_path(key)).st_size
            except OSError:
                meta_size = 0  # evicted or replaced already: its bytes count as the artifact's
            self.capacity.added(len(art.data) + meta_size, budget.remaining())
        return art

    def get_or_create(self, key: str, ext: str, build: BuildFn) -> Artifact:
        """Return the cached artifact, or run ``build()`` once across processes and store it.

        ``build()`` returns ``(data, meta)``. Concurrent callers for the same missing key, in
        any process sharing the writable root, wait for the one builder and read its result.
        If the lock cannot be had within the lock timeout, or the entry cannot be stored, the
        artifact is built and returned from memory (``path`` None) with one warning. The
        one-key case of :meth:`get_or_create_many`.

        Raises:
            ValueError: malformed key or ext.
            WrongExt: the key holds an artifact of another extension (before any build).
            TypeError: ``build`` returned data that is not bytes.
            Exception: whatever ``build`` raises.
        """
        return self.get_or_create_many([BuildItem(key, ext, build)])[0]

    def get_or_create_many(self, items: Sequence[BuildItem]) -> list[Artifact]:
        """The artifacts of ``items``, in order, building the missing ones with work stealing.

        See :meth:`get_or_create_each` for what is guaranteed across processes.

        Raises:
            ValueError: a malformed key or ext (before any file is touched).
            Exception: the first exception an item's ``build`` raised (its lock released;
                items not reached yet are left to other processes or a later call).
        """
        results: list[Artifact | None] = [None] * len(items)
        for index, result in self.get_or_create_each(items):
            if isinstance(result, Exception):
                raise result
            results[index] = result
        assert all(r is not None for r in results)
        return results  # type: ignore[return-value]  # every slot was filled above

    def get_or_create_each(
        self, items: Sequence[BuildItem], *, wait: bool = True
    ) -> Iterator[tuple[int, Artifact | Exception | None]]:
        """Yield ``(index, result)`` for every item as its artifact is ready, building the
        missing ones with work stealing.

        Every key is looked up first. Then, for each missing key in order, the key's build lock
        is tried without waiting: a key whose lock is had is re-checked under it and built;
        a key whose lock another process holds (it is building that key) is skipped. Only when
        nothing is left to build does the caller wait, retrying every remaining key without
        blocking in a loop: it reads the result of whichever builder finishes first, and takes
        over a key whose builder died (a ``flock`` is dropped with its process; a soft lock
        of a dead process, or one not refreshed for the stale timeout, is broken).

        Across processes sharing the writable root: at most one process builds a key at a
        time (single flight, as :meth:`get_or_create`), so a key is built once in total unless
        its builder dies or fails, or holds it past the lock timeout; a process never waits on
        a key while it could build another one. With a remote tier, the builder of a key also
        takes the tier's job-wide lock of that key, so one machine builds it; a key whose
        remote lock another machine holds is set aside (its local lock released) and asked
        again with back-off while this process builds the others, and read once built. The
        waits for those locks share one budget per call, the lock timeout (not one per key);
        a key still held elsewhere once it is spent is built without the remote lock, with one
        warning naming the lock, its holder and the tier.

        Never fails on a cache failure: a key whose lock cannot be taken is built without it,
        and the keys still held by other processes once the call has waited the lock timeout
        in all (its builds not counted) are built privately, with one warning naming the
        holder; their ``put`` then tries the key's lock once and never waits again (the
        artifact is published, or returned from memory). A call of N keys waits about one lock
        timeout, not N.

        Yields:
            ``(index, result)`` in completion order, once per item: ``result`` is the
            :class:`Artifact`, the exception the item's ``build`` raised (the key is left
            unbuilt, its lock released), :class:`WrongExt` for a key the writable root holds
            with another extension (never built), or, with ``wait=False``, None for a key
            another process is building (nothing is waited for). Equal ``(key, ext)`` items are
            built once and yielded each. No lock is held while the caller runs between two
            results.

        Raises:
            ValueError: a malformed key or ext (at the call, before any file is touched).
        """
        slots: dict[tuple[str, str], list[int]] = {}
        builds: dict[tuple[str, str], BuildFn] = {}
        for index, item in enumerate(items):
            check_key(item.key)
            check_ext(item.ext)
            slots.setdefault((item.key, item.ext), []).append(index)
            builds.setdefault((item.key, item.ext), item.build)
        return self._each(slots, builds, wait)

    def _each(
        self,
        slots: dict[tuple[str, str], list[int]],
        builds: dict[tuple[str, str], BuildFn],
        wait: bool,
    ) -> Iterator[tuple[int, Artifact | Exception | None]]:
        # every wait of this call together; the caller's time between two results is not ours
        budget = WaitBudget(self.lock_timeout)
        pending: list[tuple[str, str]] = []
        for entry in slots:
            art = self._lookup(*entry, budget)
            if art is None:
                pending.append(entry)
            else:
                with budget.paused():
                    yield from ((i, art) for i in slots[entry])
        if self.disabled:
            for key, ext in pending:
                stats.count(self.root, misses=1)
                built = self._attempt(key, ext, builds[(key, ext)], None, budget)
                assert not isinstance(built, Busy)  # a disabled cache takes no locks
                with budget.paused():
                    yield from ((i, built) for i in slots[(key, ext)])
            return
        waited: set[tuple[str, str]] = set()  # found held by another process
        # keys whose remote lock another machine holds: (when to ask again, the next delay)
        remote_waits: dict[tuple[str, str], tuple[float, float]] = {}
        delay = POLL_FIRST
        while pending:
            left: list[tuple[str, str]] = []
            for entry in pending:
                key, ext = entry
                due = remote_waits.get(entry)
                if due is not None and time.monotonic() < due[0] and budget.remaining() > 0:
                    left.append(entry)  # built on another machine: not yet time to ask again
                    continue
                result: Artifact | Exception | None = None
                held = self._claim(key)
                if not isinstance(held, _Busy):
                    attempt = self._attempt(key, ext, builds[entry], held, budget)
                    if not isinstance(attempt, Busy):
                        result = attempt
                    elif wait:
                        if entry not in waited:
                            waited.add(entry)
                            stats.count(self.root, lock_waits=1)
                        pause, after = next_poll(REMOTE_POLL_FIRST if due is None else due[1])
                        remote_waits[entry] = (time.monotonic() + pause, after)
                        left.append(entry)
                        continue
                elif wait:
                    if entry not in waited:
                        waited.add(entry)
                        stats.count(self.root, lock_waits=1)
                    result = self._local_lookup(key, ext)  # published, lock not yet released
                    if result is None and budget.remaining() <= 0:
                        result = self._private(key, ext, builds[entry], budget)
                    if result is None:
                        left.append(entry)
                        continue
                # no lock is held here: hand the result over while the others wait their turn
                with budget.paused():
                    yield from ((i, result) for i in slots[entry])
            if left and len(left) == len(pending):  # every remaining key is built elsewhere
                time.sleep(delay)
                delay = min(delay * 2, POLL_MAX)
            else:
                delay = POLL_FIRST
            pending = left

    def _claim(self, key: str) -> Held | _Busy | None:
        """Try the build lock of ``key`` without waiting: the lock, None where locks cannot
        be taken here (warned once), or ``_BUSY`` when another process holds it."""
        try:
            return self.store.locker.acquire(key + ".build", shared=False, timeout=0)
        except LockTimeout:
            return _BUSY
        except CacheError as e:
            warn_once(logger, (self.root, "locks"), "kernelcache: building without a lock: %s", e)
            return None

    def _private(
        self, key: str, ext: str, build: BuildFn, budget: WaitBudget
    ) -> Artifact | Exception:
        """Build ``key`` without its lock once the call has waited its lock timeout; say who
        held the lock (and note it in the statistics log, for ``kernelcache doctor``)."""
        stats.count(self.root, lock_timeouts=1)
        holder = self.store.locker.holder(key + ".build")
        stats.note_lock_wait(self.root, key, self.lock_timeout, holder)
        who = ""
        if holder is not None:
            since = holder["since"]
            held_for = time.time() - since if since is not None else self.lock_timeout
            who = f" (held by pid {holder['pid']} on host {holder['host']} for {held_for:.0f}s)"
        warn_once(
            logger,
            (self.root, "build-lock"),
            "kernelcache: waited %.0fs for another builder under %s%s; building privately",
            self.lock_timeout,
            self.root,
            who,
        )
        built = self._attempt(key, ext, build, None, budget)
        assert not isinstance(built, Busy)  # the budget is spent: nothing is waited for
        return built

    def _attempt(
        self, key: str, ext: str, build: BuildFn, held: Held | None, budget: WaitBudget
    ) -> Artifact | Exception | Busy:
        """Look ``key`` up again under its lock ``held`` (if any) and build it if still
        missing; the lock is released before returning. A failing build is returned; so is
        :class:`Busy` while another machine holds the key's remote lock and ``budget`` is not
        spent (nothing was built)."""
        try:
            return self._build_locked(key, ext, build, held, budget)
        except Exception as e:  # the caller decides: raise it, or report it per item
            return e
        finally:
            if isinstance(held, Held):
                held.release()

    def _build_locked(
        self, key: str, ext: str, build: BuildFn, held: Held | None, budget: WaitBudget
    ) -> Artifact | Busy:
        if self.disabled:
            return self._build(key, ext, build, None)
        if held is not None:  # (the remote tier is asked through its lock, below)
            art = self._lookup(key, ext, budget, remote=False)
            if isinstance(art, WrongExt):
                raise art
            if art is not None:
                return art
        release_remote = None
        if self.remote is not None:
            claim = self._remote_claim(key, budget)
            if isinstance(claim, Busy):
                if budget.remaining() > 0:
                    return claim  # built on another machine: the caller asks again later
                self._remote_wait_spent(claim)
            elif claim is not None:
                release_remote = claim
                art = self._remote_lookup(key, ext, budget)
                if art is not None:
                    release_remote()
                    return art
        try:
            stats.count(self.root, misses=1)
            return self._build(key, ext, build, budget)
        finally:
            if release_remote is not None:
                release_remote()

    def _remote_claim(self, key: str, budget: WaitBudget) -> Claim:
        """One try at the remote tier's build lock of ``key`` (a tier that cannot try once
        waits within what is left of ``budget``); None if it is unavailable (the caller builds
        anyway). A tier that raises is a tier without the lock."""
        assert self.remote is not None
        try:
            return try_lock(self.remote, key, budget.remaining())
        except Exception as e:  # a tier must not raise; if one does, build without its lock
            stats.count(self.root, remote_errors=1)
            warn_once(
                logger, (self.root, "remote-raised"), "kernelcache: the remote tier failed: %r", e
            )
            return None

    def _remote_wait_spent(self, busy: Busy) -> None:
        """The call waited its lock timeout and another machine still holds a remote lock:
        build without it, saying which lock, who holds it and where."""
        stats.count(self.root, lock_timeouts=1)
        warn_once(
            logger,
            (self.root, "remote-build-lock"),
            "kernelcache: waited %.0fs for build locks in the remote tier %s; %s is still held "
            "by %s; building without it",
            self.lock_timeout,
            busy.tier,
            busy.lock,
            busy.holder,
        )

    def _local_lookup(self, key: str, ext: str) -> Artifact | None:
        """A verified artifact of ``key`` in a local layer (the remote tier is not asked:
        this runs in the waiting loop); counts a hit."""
        for store in self.layers:
            try:
                result = store.get_checked(key, ext)
            except OSError:
                continue  # _lookup reports it when the key is looked up for real
            if isinstance(result, Artifact):
                stats.count(self.root, hits=1, bytes_read=len(result.data))
                return result
        return None

    def _build(
        self,
        key: str,
        ext: str,
        build: BuildFn,
        budget: WaitBudget | None,
        *,
        replace: bool = False,
    ) -> Artifact:
        """Run ``build`` and store what it made (``budget`` None: keep it in memory;
        ``replace``: in place of an entry), waiting at most what is left of ``budget`` to
        store it."""
        started = time.monotonic()
        if budget is None:
            data, meta = build()
        else:
            with budget.paused():
                data, meta = build()
        stats.count(self.root, builds=1, build_seconds=time.monotonic() - started)
        if budget is None:
            return self._in_memory(key, ext, data, meta)
        try:
            return self._put(key, ext, data, meta, budget.remaining(), replace=replace)
        except CacheError as e:
            warn_once(
                logger, (self.root, "write"), "kernelcache: using an in-memory artifact: %s", e
            )
            return self._in_memory(key, ext, data, meta)
        finally:
            stats.flush()

    @staticmethod
    def _in_memory(key: str, ext: str, data: bytes, meta: Mapping[str, Any]) -> Artifact:
        data = as_bytes(data)
        return Artifact(key, ext, data, None, make_metadata(key, ext, data, meta), "memory")
