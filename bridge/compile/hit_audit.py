"""Auditing hits in a running job (``KERNELCACHE_AUDIT``): for a share of the hits the cache
serves, make what was served again and compare. Every kind of hit is sampled alike:

- a kernel hit (:func:`audited`): the kernel is compiled again in memory
  (:func:`bridge.compile.compiler.compile_source`); the IR it started from is compared with the
  IR its entry says it was compiled from (the ``ir`` field), its machine code, PTX and launch
  metadata (name, warps, shared memory, ...) with those served;
- a lowering hit, from a stored lowering or a program entry's item (:func:`replayed`): the call
  is lowered again without it, every kernel it fetches audited (whatever the share: see
  :func:`every_hit`), and the opaque it gives, and whether the call is autotuned, are compared
  with the stored ones.

A difference is a stale entry its key and the witness (:mod:`bridge.readsets.witness`) did not
see: said loudly (``AUDIT FAILED``), once per entry and process, and what was made again is used
for this process (the entry stays, for ``kernelcache audit`` and an operator to look at).

Invariants: with the share 0 (the default) nothing is sampled, made again or compared. An audit
never fails the job: where making again fails, the hit is used as it is (a debug line). A
compile is deterministic for the same inputs (:mod:`bridge.compile.compiler`: the machine code
depends on no path, time or working directory), so an honest hit passes. A lowering hit is
audited at most once per process for the same stored bytes: its outcome is remembered.
"""

from __future__ import annotations

import contextlib
import logging
import random
import threading
from collections.abc import Callable, Iterator, Mapping
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from kernelcache.plugin import warn_once

from ..entries.kernels import launch_fields
from ..entries.lowerings import Item, Lowered
from ..identity.specialize import Specialization
from .compiler import Compiled, compile_source

if TYPE_CHECKING:
    from ..vendors.targets import Target

logger = logging.getLogger(__name__)

#: whether every kernel hit is audited here, whatever the share (a lowering being audited)
_every: ContextVar[bool] = ContextVar("kernelcache_audit_every_hit", default=False)

#: the lowering hits audited in this process: (cache root, lowering key, state, the stored
#: opaque) -> the lowering used instead (None: the stored one passed)
_lowerings: dict[tuple[str, str, str, bytes], Lowered | None] = {}
_lock = threading.Lock()


def share() -> float:
    """The share of hits audited here: 1 inside :func:`every_hit`, else ``KERNELCACHE_AUDIT``."""
    from ..settings import job_settings

    return 1.0 if _every.get() else job_settings().audit


def sampled(fraction: float) -> bool:
    """Whether a hit is audited, ``fraction`` of them being (0: none, with no draw)."""
    return fraction > 0 and (fraction >= 1 or random.random() < fraction)


@contextlib.contextmanager
def every_hit() -> Iterator[None]:
    """Audit every kernel hit in this block (in this thread or task), whatever the share."""
    token = _every.set(True)
    try:
        yield
    finally:
        _every.reset(token)


# -- kernel hits --------------------------------------------------------------------------------


def audited(
    spec: Specialization, meta: Mapping[str, Any], binary: bytes, ptx: str | None
) -> Compiled | None:
    """The kernel of ``spec`` compiled again, where an audit of this hit (sampled at
    :func:`share`) finds that the cached kernel (its entry's full metadata ``meta``, the
    machine code ``binary`` and the PTX ``ptx`` served) is not what a compile gives now; None
    where it is, where the hit is not audited, or where the compile fails (then the hit is
    used as it is)."""
    if not sampled(share()):
        return None
    try:
        fresh = compile_source(spec.source, spec.target, spec.backend, spec.bound.options)
    except Exception as e:  # (the kernel's own error, or a compiler's: its miss says it)
        logger.debug("kernelcache: the audit of %s could not compile it: %s", spec.key, e)
        return None
    why = difference(meta, binary, ptx, fresh, spec.target)
    if why is None:
        return None
    warn_once(
        logger,
        ("audit", spec.key),
        "kernelcache: AUDIT FAILED: the cached kernel %s of %s for %s is not what a compile "
        "gives now: %s (a change its key and reads did not see); it is compiled again for this "
        "process. Run `kernelcache audit` on a manifest of this job and report it",
        spec.key,
        spec.parts.qualname,
        spec.target,
        why,
    )
    return fresh


def difference(
    meta: Mapping[str, Any], binary: bytes, ptx: str | None, fresh: Compiled, target: Target
) -> str | None:
    """How a cached kernel (``meta``, ``binary``, ``ptx``: see :func:`audited`) differs from
    ``fresh``, its compile now for ``target``; None where it does not."""
    recorded = meta.get("ir")
    if isinstance(recorded, str) and fresh.ir is not None and recorded != fresh.ir:
        return "it was compiled from other IR than its frontend gives now"
    if binary != fresh.binary:
        return "its machine code differs"
    if ptx is not None and ptx != fresh.ptx:
        return "its PTX differs"
    for name, value in launch_fields(fresh.metadata, target).items():
        if name in meta and meta[name] != value:
            return f"its launch metadata differs ({name} {meta[name]!r:.40}, a compile gives {value!r:.40})"
    return None


# -- lowering hits ------------------------------------------------------------------------------


def replayed(
    item: Item,
    about: tuple[str, str, str],
    fraction: float,
    relower: Callable[[], tuple[Lowered, str]],
) -> Lowered | None:
    """What this process uses instead of ``item``, a stored lowering or a program entry's item
    of a call (``about``: the cache root, the kernel's qualified name, the target) served from
    the cache: the call lowered again without it (``relower``: the lowering and its state, with
    every kernel hit audited), where an audit of this hit (sampled at ``fraction``, now or
    before in this process) found that it gives another opaque; None where the stored lowering
    is used (also where lowering again fails or ends in another state: a decision that changed
    meanwhile, not this lowering)."""
    if fraction <= 0:
        return None
    which = (about[0], item.key, item.state, item.lowered.opaque)
    with _lock:
        if which in _lowerings:
            return _lowerings[which]
    if not sampled(fraction):
        return None
    try:
        with every_hit():
            fresh, state = relower()
    except Exception as e:  # (a kernel that cannot compile now, ...: its miss says it)
        logger.debug("kernelcache: the audit of lowering %s could not lower it: %s", item.key, e)
        return None
    if state != item.state:
        logger.debug("kernelcache: the audit of lowering %s lowered state %s", item.key, state)
        return None
    same = (fresh.opaque, fresh.autotuned) == (item.lowered.opaque, item.lowered.autotuned)
    instead = None if same else fresh
    with _lock:
        _lowerings[which] = instead
    if instead is not None:
        warn_once(
            logger,
            ("audit", item.key, item.state),
            "kernelcache: AUDIT FAILED: the stored lowering %s (state %s) of %s for %s is not "
            "what lowering the call again gives now: its opaque differs (a change its key and "
            "reads did not see); the call is lowered again for this process. Run `kernelcache "
            "audit` on a manifest of this job and report it",
            item.key,
            item.state,
            about[1],
            about[2],
        )
    return instead
