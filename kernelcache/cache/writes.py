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
from ..process import warn_once
from ..schema.document import make_metadata, require_whole
from ..store.entry import Artifact, as_bytes
from .layers import Layers

logger = logging.getLogger(__name__)


def put(
    cache: Layers,
    key: str,
    ext: str,
    data: bytes,
    meta: Mapping[str, Any],
    wait: float | None,
    *,
    replace: bool = False,
) -> Artifact:
    """Publish into the writable root (``replace``: in place of an entry there) and the
    remote tier, waiting at most ``wait`` seconds (None: the lock timeout), counted; an entry
    the writable root cannot take still goes to the remote tier (then CacheError)."""
    if cache.disabled:
        return in_memory(key, ext, data, meta)
    try:
        art = publish(cache, key, ext, data, meta, wait, replace=replace)
    except CacheError:
        stats.count(cache.root, errors=1)
        if cache.remote is not None and cache.remote.put(key, ext, as_bytes(data), meta):
            stats.count(cache.root, remote_puts=1)  # other machines still get it
        raise
    stats.count(cache.root, puts=1, bytes_written=len(art.data))
    if cache.remote is not None and cache.remote.put(key, ext, art.data, art.meta):
        stats.count(cache.root, remote_puts=1)
    elif cache.remote is not None and replace:
        _remote_kept(cache, art)
    return art


def _remote_kept(cache: Layers, art: Artifact) -> None:
    """Warn once when the remote tier, which never replaces a value, does not hold the
    value of ``art`` that this process just put in place of another one."""
    assert cache.remote is not None
    try:
        found = cache.remote.get(art.key, art.ext)
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
        (cache.root, "remote-kept", art.key),
        "kernelcache: replaced %s.%s under %s, but the remote tier %s: machines that read it "
        "from the tier get that value, not this one",
        art.key,
        art.ext,
        cache.root,
        what,
    )


def publish(
    cache: Layers,
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
    from ..store.locks.locker import WaitBudget  # (the locks: imported by the first write)

    budget = WaitBudget(cache.lock_timeout, cache.root) if wait is None else WaitBudget(wait)
    try:
        art, published = cache.store.publish(
            key, ext, data, meta, wait=wait, replace=replace, as_written=as_written
        )
    except CacheError:
        budget.remaining()  # (where its whole wait was spent: noted for the next calls)
        raise
    if published and cache.capacity is not None:
        try:
            meta_size = os.stat(cache.store.meta_path(key)).st_size
        except OSError:
            meta_size = 0  # evicted or replaced already: its bytes count as the artifact's
        cache.capacity.added(len(art.data) + meta_size, budget.remaining())
    return art


def in_memory(key: str, ext: str, data: bytes, meta: Mapping[str, Any]) -> Artifact:
    """The entry kept in memory only (a disabled cache, a root that cannot take it):
    checked as a put checks it (:func:`~kernelcache.schema.require_whole`).

    Raises:
        ValueError: as :meth:`put`.
    """
    data = as_bytes(data)
    doc = make_metadata(key, ext, data, meta)
    require_whole(key, ext, data, doc)
    return Artifact(key, ext, data, None, doc, "memory")
