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
readers of a corrupt entry, the remote tier's lock): one :class:`~kernelcache.store.locks.WaitBudget`
per call, which stands still while the call builds. A call whose budget is spent tries each
lock once and never waits again.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from ..keys import check_ext, check_key
from ..maintenance.capacity import SizeCap
from ..remote.tier import RemoteTier
from ..store.entry import Artifact
from ..store.root import Store
from . import builds, reads, writes
from .builds import BuildFn, BuildItem
from .layers import Layers, readonly_problem


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
            least recently used entries are evicted past it (see :mod:`kernelcache.maintenance.capacity`);
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
        #: the layers and settings every method works on (reads, writes and builds are
        #: functions of them: :mod:`.reads`, :mod:`.writes`, :mod:`.builds`)
        self._layers = Layers(
            root,
            readonly_roots,
            remote,
            lock_timeout=lock_timeout,
            lock_mode=lock_mode,
            max_size=max_size,
        )
        layers = self._layers
        #: the writable root (absolute)
        self.root: str = layers.root
        #: the writable root's store
        self.store: Store = layers.store
        #: the read-only roots' stores, in search order
        self.readonly: list[Store] = layers.readonly
        #: the remote tier (None: none)
        self.remote: RemoteTier | None = layers.remote
        #: whether the cache is off (``$KERNELCACHE_DISABLE``, or a variable that cannot be
        #: used): reads miss, builds run in memory
        self.disabled: bool = layers.disabled
        #: the size cap of the writable root (None: none)
        self.capacity: SizeCap | None = layers.capacity
        #: seconds a call waits in all for locks
        self.lock_timeout: float = layers.lock_timeout

    def __repr__(self) -> str:
        return repr(self._layers)

    @property
    def layers(self) -> list[Store]:
        """The local roots in search order: the writable root, then the read-only ones."""
        return self._layers.layers

    # -- reads ----------------------------------------------------------------------------
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
        return reads.get(self._layers, key, ext, counted=counted)

    def quarantine(self, art: Artifact, reason: str) -> bool:
        """Report ``art`` (what a read returned) unusable for ``reason``: a corrupt entry,
        counted, and quarantined where it lies in the writable root and still holds the same
        artifact (re-checked under its lock: :meth:`Store.repair`). A caller that checks more
        than a read does (e.g. which machine a kernel's code is for) calls it, then builds the
        entry again. Returns whether the entry is gone (not for an entry of a read-only root,
        one replaced meanwhile, or one whose readers held it for the lock timeout)."""
        return reads.quarantine(self._layers, art, reason)

    # -- writes ---------------------------------------------------------------------------
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
        return writes.put(self._layers, key, ext, data, meta, wait)

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
        return writes.put(self._layers, key, ext, data, meta, wait, replace=True)

    # -- builds ---------------------------------------------------------------------------
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
        return builds.get_or_create_each(self._layers, items, wait=wait)

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
        return builds.rebuild(self._layers, key, ext, build, stale=stale)


__all__ = ["BuildItem", "Cache", "readonly_problem"]
