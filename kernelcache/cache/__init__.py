"""The cache: ordered layers over the storage format, and the policy of what to do on failure.

:class:`Cache` opens its layers once, from its arguments and the settings: one writable root,
read-only roots searched after it (e.g. baked into a container image) and the remote tiers.
Reads go to the writable root, then each read-only root in order, then the remote tier; a
remote hit is verified and published into the writable root. Writes (:mod:`.writes`) go to the
writable root and the remote tier; the first writer of a key wins, except where ``replace``
(or ``rebuild``) puts an entry in place of the writable root's (never of the remote tier's
value). Builds (:mod:`.builds`) run at most one ``build`` per key at a time across every
process sharing the writable root (single flight), and across machines with a remote tier.

Invariants: failures of the cache never fail the caller's job: ``get`` turns them into misses
(a corrupt entry is quarantined and counted, never raised) and ``get_or_create`` into an
artifact built in memory, with one warning per kind of failure; an entry the writable root
cannot take (a full disk) still goes to the remote tier. Every call waits at most the lock
timeout in all, over all its keys and waits (locks, readers of a corrupt entry, the remote
tier's lock): one :class:`~kernelcache.store.locks.WaitBudget` per call, made where it first
waits, which stands still while the call builds; once spent, each lock is tried once and never
waited for. Opening the layers is where a job first reads its settings: a variable that cannot
be used, a ``KERNELCACHE_*`` name nothing declares, a read-only root that cannot serve anything,
or a remote tier that cannot be used as configured (its URL, its signing key: the tier is off)
is said there, once per process. The hot path checks each (key, ext) pair once per cache and
adds no work to a verified hit; a cache imports the remote tiers and the size cap where it has
them, :mod:`.builds` at its first build and the locks at its first wait: none to only read.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .. import stats, units
from ..config import Settings, job_settings, warn_unknown_in_a_job
from ..errors import ConfigError, InvalidValue, WrongExt
from ..keys import check_ext, check_key
from ..problem import Problem
from ..process import warn_once
from ..store.entry import Artifact
from ..store.layout import path_problem, resolve_root, settings_of_root
from ..store.root import Store
from . import writes

if TYPE_CHECKING:
    from ..capacity.size_cap import SizeCap
    from ..remote import RemoteTier
    from ..store.locks.locker import WaitBudget
    from .builds import BuildFn, BuildItem
    from .layers import Accept

logger = logging.getLogger(__name__)

#: how many validated (key, ext) pairs a cache remembers
_VALID_MEMO = 1 << 16


def readonly_problem(root: str | os.PathLike[str]) -> str | None:
    """Why the read-only root ``root`` cannot serve anything as given, with the remedy; None
    when it is an absolute path to a directory."""
    path = os.fspath(root)
    if (named := path_problem(path)) is not None:
        return named
    if not os.path.isdir(path):
        what = "is not a directory" if os.path.lexists(path) else "does not exist"
        return f"{path} {what}: nothing is read from it (fix the path, or remove it)"
    return None


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
            least recently used entries are evicted past it (see :mod:`kernelcache.capacity.size_cap`);
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
        cfg = job_settings()  # a variable that cannot be used costs only itself, said once
        warn_unknown_in_a_job()  # (a misspelt one too)
        where = resolve_root(root, cfg)
        cfg = job_settings(file=settings_of_root(where, cfg.trust))  # + the root's own file
        #: seconds a call waits in all for locks
        self.lock_timeout: float = cfg.lock_timeout if lock_timeout is None else float(lock_timeout)
        mode = cfg.lock_mode if lock_mode is None else lock_mode
        #: the writable root's store
        self.store: Store = Store.from_settings(
            where,
            cfg,
            lock_mode=mode,
            lock_timeout=self.lock_timeout,
            resolved=True,
        )
        #: the writable root (absolute)
        self.root: str = self.store.root
        if root is None and cfg.root is not None and (named := path_problem(cfg.root)):
            # used as given, as a read-only root is: the job's cache still works where it leads
            warn_once(
                logger, ("root", os.fspath(cfg.root)), "kernelcache: KERNELCACHE_DIR: %s", named
            )
        ro = cfg.readonly_roots if readonly_roots is None else readonly_roots
        named = "KERNELCACHE_READONLY_DIRS" if readonly_roots is None else "readonly_roots"
        for r in ro:
            if (problem := readonly_problem(r)) is not None:
                warn_once(logger, ("readonly", os.fspath(r)), "kernelcache: %s: %s", named, problem)
        #: the read-only roots' stores, in search order
        self.readonly: list[Store] = [Store.from_settings(r, cfg, readonly=True) for r in ro]
        from_env = remote is None
        remote = (cfg.remote or "") if remote is None else remote
        #: the remote tier (None: none)
        self.remote: RemoteTier | None
        if isinstance(remote, (str, list, tuple)):  # before the protocol's check, which is slow
            self.remote = self._open_remote(remote, cfg, from_env)
        else:
            from ..remote import RemoteTier

            if isinstance(remote, RemoteTier):
                self.remote = remote
            else:
                self.remote = self._open_remote(remote, cfg, from_env)
        #: whether the cache is off (``$KERNELCACHE_DISABLE``, or a variable that cannot be
        #: used): reads miss, builds run in memory
        self.disabled: bool = cfg.disable
        #: (key, ext) pairs :meth:`get` has validated (its hot path checks each pair once)
        self.valid: set[tuple[str, str]] = set()
        if cfg.stats_log and not self.disabled:
            stats.enable_log(self.root)
        cap = cfg.max_size if max_size is None else max_size
        if isinstance(cap, str):
            cap = units.parse_size(cap)
        if isinstance(cap, bool) or not isinstance(cap, int) or cap < 0:
            raise InvalidValue(f"max_size must be a size such as '50G' or bytes >= 0, not {cap!r}")
        #: the size cap of the writable root (None: none)
        self.capacity: SizeCap | None = None
        if cap and not self.disabled:
            from ..capacity.size_cap import SizeCap

            self.capacity = SizeCap(self.store, cap)

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
        from ..remote import open_remote

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

    # -- reads ----------------------------------------------------------------------------
    def get(
        self,
        key: str,
        ext: str,
        *,
        counted: bool | str = True,
        accept: Accept | None = None,
        copy: bool = True,
    ) -> Artifact | None:
        """Return the verified artifact for ``key``, or None.

        A corrupt entry is a miss: it is quarantined (in the writable root) and counted.
        ``counted``: True, a lookup of one of the entries the hit rate is about (one per
        kernel); False, none of them (hits and misses are not counted; corruption and errors
        are); or a class of lookups counted apart (``"companion"``, ``"memo"``: see
        :data:`kernelcache.stats.LOOKUP_CLASSES`). ``accept`` and ``copy``: what is done
        with an entry of the remote tier (:meth:`remote_lookup`).

        Raises:
            ValueError: ``key``, ``ext`` or ``counted`` is malformed (before any file is read).
        """
        if (key, ext) not in self.valid:
            check_key(key)
            check_ext(ext)
            if len(self.valid) >= _VALID_MEMO:
                self.valid.clear()
            self.valid.add((key, ext))
        names = stats.lookup_counters(counted)
        art = self.lookup(key, ext, None, names, accept=accept, copy=copy)
        if not isinstance(art, Artifact):
            art = None
            if names is not None:
                stats.count(self.root, **{names[1]: 1})
        return art

    def quarantine(self, art: Artifact, reason: str) -> bool:
        """Report ``art`` (what a read returned) unusable for ``reason``: a corrupt entry,
        counted, and quarantined where it lies in the writable root and still holds the same
        artifact (re-checked under its lock: :func:`~kernelcache.store.removal.repair`). A
        caller that checks more than a read does (e.g. which machine a kernel's code is for)
        calls it, then builds the entry again. Returns whether the entry is gone (not for an
        entry of a read-only root, one replaced meanwhile, or one whose readers held it for
        the lock timeout)."""
        from ..store.removal import repair

        stats.count(self.root, corrupt=1)
        digest = art.meta.get("digest")
        if self.disabled or art.path is None or os.path.dirname(art.path) != self.root:
            return False

        def same(now: Artifact) -> str | None:
            return reason if now.meta.get("digest") == digest else None

        found = repair(self.store, art.key, art.ext, refuse=same)
        return isinstance(found, Problem) and not os.path.lexists(self.store.meta_path(art.key))

    def lookup(
        self,
        key: str,
        ext: str,
        budget: WaitBudget | None,
        names: tuple[str, str] | None = ("hits", "misses"),
        *,
        remote: bool = True,
        accept: Accept | None = None,
        copy: bool = True,
    ) -> Artifact | WrongExt | None:
        """Search every layer (the remote tier too, unless ``remote`` is false) for ``key``
        and ``ext`` (validated), waiting at most what is left of ``budget`` (None: made where
        it first waits); count hits (in the counters ``names``: :func:`kernelcache.stats.
        lookup_counters`; None: not counted), corruption and errors, but not misses. WrongExt
        (returned, not raised) when the writable root holds the key with another extension;
        ``accept`` and ``copy``: see :meth:`remote_lookup`."""
        if self.disabled:
            return None
        for store in (self.store, *self.readonly):
            try:
                result = store.read(key, ext)
                if isinstance(result, Problem) and result.corrupt:  # re-checked, quarantined
                    from ..store.locks.locker import WaitBudget  # (the call's first wait)

                    budget = budget or WaitBudget(self.lock_timeout, self.root)
                    result = store.get(key, ext, wait=budget, checked=True)
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
            return self.remote_lookup(key, ext, budget, names, accept, copy)
        return None

    def remote_lookup(
        self,
        key: str,
        ext: str,
        budget: WaitBudget | None,
        names: tuple[str, str] | None = ("hits", "misses"),
        accept: Accept | None = None,
        copy: bool = True,
    ) -> Artifact | None:
        """Read ``key`` from the remote tier, check it like a local entry (schema, entry
        digest, artifact digest) and publish it locally (waiting what is left of ``budget``,
        None: the lock timeout). Never raises: what the tier returns or raises is a miss or hit.
        ``accept``: the caller's own check, before anything is written: an entry it refuses (a
        reason) is a miss, counted untrusted, said once, never copied into a local root.
        ``copy=False``: the entry is returned without a copy (its ``path`` None), for a caller
        that can judge it only later and then :meth:`keep` it."""
        from .remote_reads import remote_lookup  # (a cache with a remote tier: its first read)

        wait = self.lock_timeout if budget is None else budget.remaining()
        return remote_lookup(self, key, ext, wait, names, accept, copy)

    def keep(self, art: Artifact, wait: float | None = None) -> Artifact:
        """Copy ``art``, an entry of the remote tier that a lookup returned without a copy
        (``copy=False``), into the writable root as its writer wrote it (its document is not
        widened), waiting at most ``wait`` (None: the lock timeout) for the key's lock; the
        entry with its path, or ``art`` itself where it cannot be stored (said once; with
        ``wait`` 0, a key whose lock another process holds is left to it unsaid). Never raises
        for the cache's own failures."""
        from .remote_reads import keep

        return keep(self, art, wait)

    # -- writes (:mod:`.writes`) -----------------------------------------------------------
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
            ValueError: malformed key, ext or metadata; or an entry that is not whole (an
                artifact not whole for its extension: a cut-short file, code for another
                machine; or launch metadata its extension requires missing; see
                :mod:`kernelcache.schema.document`): nothing is written anywhere.
            CacheError: the writable root cannot take the entry (message says why); nothing
                partial is left behind there. The remote tier still gets it.
        """
        check_key(key)
        check_ext(ext)
        return writes.put(self, key, ext, data, meta, wait)

    def replace(
        self,
        key: str,
        ext: str,
        data: bytes,
        meta: Mapping[str, Any],
        *,
        wait: float | None = None,
    ) -> Artifact:
        """:meth:`put` in place of the entry the writable root holds under ``key``, if any
        (``put`` keeps the first writer's): a reader gets the earlier entry or this one, never
        a mix. An entry of ``key`` in a read-only root stays, unread. The remote tier never
        replaces a value (its first writer wins): where it holds another value for ``key``, or
        did not take this one, one warning says so.

        Raises:
            as :meth:`put`.
        """
        check_key(key)
        check_ext(ext)
        return writes.put(self, key, ext, data, meta, wait, replace=True)

    # -- builds (:mod:`.builds`) -----------------------------------------------------------
    def get_or_create(self, key: str, ext: str, build: BuildFn) -> Artifact:
        """Return the cached artifact, or run ``build()`` (which returns ``(data, meta)``) once
        across processes and store it: :meth:`get_or_create_each` of one key.

        Raises:
            ValueError: malformed key or ext.
            WrongExt: the key holds an artifact of another extension (before any build).
            TypeError: ``build`` returned data that is not bytes.
            Exception: whatever ``build`` raises.
        """
        from .builds import BuildItem  # (imported by the first build)

        return self.get_or_create_many([BuildItem(key, ext, build)])[0]

    def get_or_create_many(self, items: Sequence[BuildItem]) -> list[Artifact]:
        """The artifacts of ``items``, in order: :meth:`get_or_create_each`, raising the first
        exception an item's ``build`` raised (its lock released; items not reached yet are
        left to other processes or a later call)."""
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

        Across processes sharing the writable root, and with a remote tier across machines
        (its lock of the key), at most one builds a key at a time (:mod:`.builds`): a key is
        built once unless its builder dies, fails or holds it past the lock timeout.

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
            built once (by the first one's ``build``, its ``accept`` checking a remote entry)
            and yielded each. No lock is held while the caller runs between two results.

        Raises:
            ValueError: a malformed key or ext (at the call, before any file is touched).
        """
        slots: dict[tuple[str, str], list[int]] = {}
        first: dict[tuple[str, str], BuildItem] = {}
        for index, item in enumerate(items):
            check_key(item.key)
            check_ext(item.ext)
            slots.setdefault((item.key, item.ext), []).append(index)
            first.setdefault((item.key, item.ext), item)
        from . import builds

        return builds.each(self, slots, first, wait)

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
        from . import builds

        return builds.rebuild(self, key, ext, build, stale)


__all__ = ["Cache", "readonly_problem"]
