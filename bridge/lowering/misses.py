"""Why a call's lowering missed, step by step: what a process says when JAX's
``jax_explain_cache_misses`` is on and a lowering is not found under its key.

A stored lowering records the named steps its key is the digest of
(:data:`bridge.lowering.lowering_keys.STEPS`). On a miss, the lowerings of the same kernel
(by its ``module:name``) that the cache's layers hold are compared with this call's steps; the
nearest (the fewest differing steps, the same target first) is named with the steps that
differ, values shown where they are short ("jaxlib version '0.10.1' here vs '0.11.2'"), digests
said to differ. A lowering found whose kernels' reads find something else now is said to be
stale instead. Nothing here runs unless asked: the layers are scanned (linear in their entries)
and the candidates read without a trace (``Store.inspect``); nothing is counted or changed, and
a failure to explain is said, never raised. The layers are scanned once per process; what the
process stores after that is added as it stores it, so a program's misses cost one scan.
:func:`stored_lowerings` gives what the scan found to ``kernelcache explain --lowerings``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from kernelcache import Artifact, CacheError

from ..entries.lowerings import LOWERING
from .lowering_keys import STEPS, digested

if TYPE_CHECKING:
    from kernelcache import Cache, Store

    from ..call.tracing import CallSpec
    from ..vendors.targets import Target

logger = logging.getLogger("bridge.lowering")


def differing(here: Mapping[str, str], there: Mapping[str, Any]) -> list[str]:
    """The steps of ``here`` that ``there`` (a stored lowering's ``components``) records
    otherwise, in :data:`STEPS` order, worded for a person."""
    out = []
    for name, label in STEPS.items():
        mine, theirs = here.get(name), there.get(name)
        if mine == theirs:
            continue
        if not isinstance(theirs, str):
            out.append(f"{label}: not recorded in the stored lowering")
        elif mine is None or digested(mine) or digested(theirs):
            out.append(f"{label} differs")
        else:
            out.append(f"{label} {mine} here vs {theirs}")
    return out


#: the stored lowerings of each kernel (by ``module:name``) in a cache's layers (by their
#: roots): what one scan of the layers found, then what this process stored
_known: dict[tuple[str, ...], dict[str, list[Candidate]]] = {}
#: a stored lowering: its target, and its steps (or where to read them: a layer and a key)
Candidate = tuple[str, "Mapping[str, Any] | tuple[Store, str, str]"]


def _candidates(cache: Cache) -> dict[str, list[Candidate]]:
    """The stored lowerings of ``cache``'s layers by kernel: its layers scanned once per
    process (what this process stores is added by :func:`stored`)."""
    from kernelcache.cli import scan

    roots = tuple(store.root for store in cache.layers)
    known = _known.get(roots)
    if known is None:
        known = {}
        for store in cache.layers:
            for entry in scan(store.root, trust=store.trust).entries:
                if entry.ext == LOWERING.ext and entry.qualname is not None:
                    where = (store, entry.key, entry.ext)
                    known.setdefault(entry.qualname, []).append((str(entry.target), where))
        _known[roots] = known
    return known


def _steps(found: Mapping[str, Any] | tuple[Store, str, str]) -> Mapping[str, Any] | None:
    """The steps a stored lowering records (read from its layer where not known yet)."""
    if not isinstance(found, tuple):
        return found
    store, key, ext = found
    art = store.inspect(key, ext)
    if not isinstance(art, Artifact):
        return None
    recorded = art.meta.get("components")
    return recorded if isinstance(recorded, dict) else {}


def stored_lowerings(cache: Cache) -> list[tuple[str, str, Mapping[str, Any] | None]]:
    """Every lowering the layers of ``cache`` hold: its kernel (``module:name``), its target,
    and the steps it records (empty where it records none; None where it cannot be read)."""
    return [
        (qualname, target, _steps(found))
        for qualname, candidates in _candidates(cache).items()
        for target, found in candidates
    ]


def nearest(
    cache: Cache, qualname: str, target: str, here: Mapping[str, str]
) -> tuple[str, list[str]] | None:
    """The stored lowering of the kernel ``qualname`` nearest to ``here`` among the cache's
    layers: its target and the steps that differ; None where none is stored."""
    best: tuple[tuple[int, int], str, list[str]] | None = None
    for where, found in _candidates(cache).get(qualname, ()):
        recorded = _steps(found)
        if recorded is None:
            continue
        diffs = differing(here, recorded)
        rank = (where != target, len(diffs))
        if best is None or rank < best[0]:
            best = (rank, where, diffs)
    return None if best is None else (best[1], best[2])


def stored(cache: Cache, call: CallSpec, target: Target, steps: Mapping[str, str]) -> None:
    """Note that this process stored a lowering of ``call`` for ``target`` with ``steps``,
    once the layers were scanned (a later miss compares with it too)."""
    roots = tuple(store.root for store in cache.layers)
    known = _known.get(roots)
    if known is not None:
        known.setdefault(call.parts.qualname, []).append((str(target), dict(steps)))


def explain(
    cache: Cache, call: CallSpec, target: Target, here: Mapping[str, str], *, stale: bool
) -> None:
    """Say (a warning of ``bridge.lowering``) why ``call``'s lowering for ``target`` was not
    found: ``stale``, its stored lowering's reads find something else now; else the steps
    that differ from the nearest stored lowering of its kernel."""
    qualname = call.parts.qualname
    start = f"kernelcache: the lowering of {qualname} for {target} missed"
    if stale:
        logger.warning(
            "%s: a stored lowering was found, but what its kernels' frontend read finds "
            "something else now (a global, a value or a variable it read changed)",
            start,
        )
        return
    try:
        found = nearest(cache, qualname, str(target), here)
    except (CacheError, OSError) as e:
        logger.warning("%s: the stored lowerings cannot be read to say why (%s)", start, e)
        return
    if found is None:
        logger.warning("%s: no lowering of this kernel is stored", start)
        return
    where, diffs = found
    other = "" if where == str(target) else f" (for {where})"
    why = "; ".join(diffs) if diffs else "the same steps (it was stored under another state)"
    logger.warning("%s: against the nearest stored lowering%s: %s", start, other, why)
