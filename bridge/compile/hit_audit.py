"""Auditing hits in a running job (``KERNELCACHE_AUDIT``): for a fraction of the kernels served
from the cache, run Triton's frontend again and compare the IR it gives now with the IR the
entry was compiled from (its ``ir`` field).

A difference is a stale kernel the key and the witness (:mod:`bridge.identity.witness`) did not
see: said loudly, once per kernel and process, and the kernel is compiled again in memory for
this process (the entry stays, for ``kernelcache audit`` and an operator to look at). The audit
costs a frontend run per audited hit; with the fraction 0 (the default) it costs nothing.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Mapping
from typing import Any

from kernelcache.plugin import warn_once

from ..identity import frontend
from ..identity.specialize import Specialization

logger = logging.getLogger(__name__)


def audited(spec: Specialization, meta: Mapping[str, Any]) -> bool:
    """Whether the cached kernel of ``spec`` (its entry's metadata ``meta``), audited now as
    ``KERNELCACHE_AUDIT`` asks, was compiled from other IR than its frontend gives now."""
    from ..settings import job_settings

    share = job_settings().audit
    recorded = meta.get("ir")
    if share <= 0 or spec.ir is not None or not isinstance(recorded, str):
        return False
    if share < 1 and random.random() >= share:
        return False
    try:
        today = frontend.ir_digest(spec.source, spec.target, spec.backend, spec.bound.options)
    except Exception:  # the kernel's own error: its compile says it
        return False
    if today == recorded:
        return False
    warn_once(
        logger,
        ("audit", spec.key),
        "kernelcache: AUDIT FAILED: the cached kernel %s of %s for %s was compiled from other IR "
        "than its frontend gives now (a change its key and reads did not see); it is compiled "
        "again for this process. Run `kernelcache audit` on a manifest of this job and report it",
        spec.key,
        spec.parts.qualname,
        spec.target,
    )
    return True
