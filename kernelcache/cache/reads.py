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
from . import writes
from .layers import Layers

logger = logging.getLogger(__name__)

#: how many validated (key, ext) pairs a cache remembers
_VALID_MEMO = 1 << 16


def get(layers: Layers, key: str, ext: str, *, counted: bool | str = True) -> Artifact | None:
    """The work of :meth:`Cache.get <kernelcache.cache.Cache.get>`."""
    if (key, ext) not in layers.valid:
        check_key(key)
        check_ext(ext)
        if len(layers.valid) >= _VALID_MEMO:
            layers.valid.clear()
        layers.valid.add((key, ext))
    names = stats.lookup_counters(counted)
    art = lookup(layers, key, ext, WaitBudget(layers.lock_timeout), names)
    if not isinstance(art, Artifact):
        art = None
        if names is not None:
            stats.count(layers.root, **{names[1]: 1})
    return art


def quarantine(layers: Layers, art: Artifact, reason: str) -> bool:
    """The work of :meth:`Cache.quarantine <kernelcache.cache.Cache.quarantine>`."""
    stats.count(layers.root, corrupt=1)
    digest = art.meta.get("digest")
    if layers.disabled or art.path is None or os.path.dirname(art.path) != layers.root:
        return False

    def same(now: Artifact) -> str | None:
        return reason if now.meta.get("digest") == digest else None

    found = layers.store.repair(art.key, art.ext, refuse=same)
    return isinstance(found, Problem) and not os.path.lexists(layers.store.meta_path(art.key))


def lookup(
    layers: Layers,
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
    if layers.disabled:
        return None
    for store in (layers.store, *layers.readonly):
        try:
            result = store.get_checked(key, ext, wait=budget)
        except OSError as e:
            stats.count(layers.root, errors=1)
            warn_once(
                logger, (store.root, "read"), "kernelcache: cannot read %s: %s", store.root, e
            )
            continue
        if isinstance(result, Artifact):
            if names is not None:
                stats.count_hit(layers.root, names[0], len(result.data))
            return result
        if isinstance(result, Problem):
            if result.corrupt:
                stats.count(layers.root, corrupt=1)
            elif result.untrusted:
                stats.count(layers.root, untrusted=1)
            elif store is layers.store and result.ext not in (None, ext):
                return WrongExt(f"key {key} already holds a .{result.ext} artifact")
    if layers.remote is not None and remote:
        return remote_lookup(layers, key, ext, budget, names)
    return None


def remote_lookup(
    layers: Layers,
    key: str,
    ext: str,
    budget: WaitBudget,
    names: tuple[str, str] | None = ("hits", "misses"),
) -> Artifact | None:
    """Read ``key`` from the remote tier, check it like a local entry (schema, entry digest,
    artifact digest) and publish it locally. Never raises: whatever the tier returns or
    raises is a hit or a miss."""
    assert layers.remote is not None
    try:
        found = layers.remote.get(key, ext)
    except Exception as e:  # a tier must not raise; if one does, it is a miss
        stats.count(layers.root, remote_errors=1)
        warn_once(
            logger, (layers.root, "remote-raised"), "kernelcache: the remote tier failed: %r", e
        )
        return None
    if found is None:
        stats.count(layers.root, remote_misses=1)
        return None
    checked = check_entry(found, key, ext)
    if isinstance(checked, str):
        stats.count(layers.root, remote_errors=1, corrupt=1)
        warn_once(
            logger,
            (layers.root, "remote-corrupt"),
            "kernelcache: rejected a corrupt remote entry (%s): %s",
            key,
            checked,
        )
        return None
    data, meta = checked
    hit = {names[0]: 1, "bytes_read": len(data)} if names is not None else {}
    stats.count(layers.root, remote_hits=1, **hit)
    try:  # the document as its writer wrote it: what it covers is never widened here
        art = writes.publish(layers, key, ext, data, meta, budget.remaining(), as_written=True)
    except (CacheError, WrongExt, ValueError) as e:  # ValueError: larger once re-encoded
        warn_once(
            logger, (layers.root, "write"), "kernelcache: cannot store under %s: %s", layers.root, e
        )
        return Artifact(key, ext, data, None, meta, "remote")
    return Artifact(art.key, art.ext, art.data, art.path, art.meta, "remote")


def local_lookup(layers: Layers, key: str, ext: str) -> Artifact | None:
    """A verified artifact of ``key`` in a local layer (the remote tier is not asked:
    this runs in the waiting loop); counts a hit."""
    for store in layers.layers:
        try:
            result = store.get_checked(key, ext)
        except OSError:
            continue  # _lookup reports it when the key is looked up for real
        if isinstance(result, Artifact):
            stats.count(layers.root, hits=1, bytes_read=len(result.data))
            return result
    return None
