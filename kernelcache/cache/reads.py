"""Reading from a cache: ``get`` tries the writable root, then each read-only root in order, then
the remote tier; a remote hit is verified and published into the writable root.

Failures are misses: a corrupt entry is quarantined (in a writable root) and counted, never
raised. The hot path checks each (key, ext) pair once per cache (:data:`_VALID_MEMO` pairs
remembered) and adds no work to a verified hit.
"""

from __future__ import annotations

import logging
import os

from .. import stats
from ..errors import CacheError, WrongExt
from ..keys import check_ext, check_key
from ..problem import Problem
from ..process import warn_once
from ..remote import check_entry
from ..store.entry import Artifact
from ..store.locks.budget import WaitBudget
from .writes import Writes

logger = logging.getLogger(__name__)

#: how many validated (key, ext) pairs a cache remembers
_VALID_MEMO = 1 << 16


class Reads(Writes):
    """What a :class:`~kernelcache.cache.Cache` reads."""

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
