"""Writing to a cache: ``put`` and ``replace`` publish into the writable root and the remote tier.

The first writer of a key wins, except where ``replace`` puts an entry in place of the writable
root's (never of the remote tier's value). An entry the writable root cannot take (a full disk)
still goes to the remote tier; a put over the size cap starts an eviction pass.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

from .. import stats
from ..errors import CacheError
from ..keys import check_ext, check_key
from ..process import warn_once
from ..schema.contract import require_whole
from ..schema.document import make_metadata
from ..store.entry import Artifact, as_bytes
from ..store.locks.budget import WaitBudget
from .layers import Layers

logger = logging.getLogger(__name__)


class Writes(Layers):
    """What a :class:`~kernelcache.cache.Cache` writes."""

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
                :mod:`kernelcache.schema.contract`): nothing is written anywhere.
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

    @staticmethod
    def _in_memory(key: str, ext: str, data: bytes, meta: Mapping[str, Any]) -> Artifact:
        """The entry kept in memory only (a disabled cache, a root that cannot take it):
        checked as a put checks it (:func:`~kernelcache.schema.require_whole`).

        Raises:
            ValueError: as :meth:`put`.
        """
        data = as_bytes(data)
        doc = make_metadata(key, ext, data, meta)
        require_whole(key, ext, data, doc)
        return Artifact(key, ext, data, None, doc, "memory")
