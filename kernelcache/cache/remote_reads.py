"""Reading an entry of the remote tier into a cache: checked as a local entry is (schema, entry
digest, artifact digest), judged by the caller's own check, then published into the writable
root as its writer wrote it, or returned without a copy for a caller that can judge it only
once it has used it (and then keeps it).

Nothing here raises for what the tier returns or raises, or for the cache's own failures: an
entry that cannot be used is a miss (counted, said once), one that cannot be stored is served
from memory. An entry the caller refuses is never written anywhere under the local root.
"""

from __future__ import annotations

import logging

from .. import stats
from ..errors import CacheError, LockTimeout, WrongExt
from ..process import warn_once
from ..store.entry import Artifact
from . import writes
from .layers import Accept, Layers, refusal

logger = logging.getLogger(__name__)


def remote_lookup(
    cache: Layers,
    key: str,
    ext: str,
    wait: float | None,
    names: tuple[str, str] | None,
    accept: Accept | None,
    copy: bool,
) -> Artifact | None:
    """:meth:`kernelcache.Cache.remote_lookup`, waiting at most ``wait`` seconds to publish;
    the read is one lookup of the tier (:func:`~kernelcache.remote.tier.lookup`), or part of
    the one this thread makes (a key of ``get_or_create``)."""
    from ..remote.tier import Lookup, current_lookup, lookup

    assert cache.remote is not None
    try:
        with lookup(current_lookup() or Lookup()):
            found = cache.remote.get(key, ext)
    except Exception as e:  # a tier must not raise; if one does, it is a miss
        stats.count(cache.root, remote_errors=1)
        warn_once(
            logger, (cache.root, "remote-raised"), "kernelcache: the remote tier failed: %r", e
        )
        return None
    if found is None:
        stats.count(cache.root, remote_misses=1)
        return None
    from ..remote import check_entry

    checked = check_entry(found, key, ext)
    if isinstance(checked, str):
        stats.count(cache.root, remote_errors=1, corrupt=1)
        said = "kernelcache: rejected a corrupt remote entry (%s): %s"
        warn_once(logger, (cache.root, "remote-corrupt"), said, key, checked)
        return None
    data, meta = checked
    entry = Artifact(key, ext, data, None, meta, "remote")
    refused = refusal(accept, entry)
    if refused is not None:
        stats.count(cache.root, untrusted=1)
        said = "kernelcache: refused the remote entry %s: %s"
        warn_once(logger, (cache.root, "remote-refused", key), said, key, refused)
        return None
    hit = {names[0]: 1, "bytes_read": len(data)} if names is not None else {}
    stats.count(cache.root, remote_hits=1, **hit)
    return keep(cache, entry, wait) if copy else entry


def keep(cache: Layers, art: Artifact, wait: float | None) -> Artifact:
    """:meth:`kernelcache.Cache.keep`."""
    if cache.disabled:
        return art
    try:
        kept = writes.publish(cache, art.key, art.ext, art.data, art.meta, wait, as_written=True)
    except (CacheError, WrongExt, ValueError) as e:  # ValueError: larger once re-encoded
        if not (wait == 0 and isinstance(e, LockTimeout)):
            said = "kernelcache: cannot store under %s: %s"
            warn_once(logger, (cache.root, "write"), said, cache.root, e)
        return art
    return Artifact(kept.key, kept.ext, kept.data, kept.path, kept.meta, art.source)
