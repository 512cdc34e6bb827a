"""Which variants of an autotuned call a lowering emits.

With a decision in the cache for the call on this device (or one pinned for its target), only
the chosen variant is lowered: a plain kernel call, the same in every process. Without one, by
the call's autotune mode (``autotune=``, else ``$KERNELCACHE_AUTOTUNE``):

- ``decided`` (default): every variant, for jaxlib to autotune at the first run;
- ``runtime``: every variant, even where a decision exists;
- ``require``: an :class:`~bridge.errors.AutotuneError` naming ``kernelcache tune``;
- ``job``: one process measures (single flight through the cache's build lock: the others wait
  for its decision, and take over if it dies) and every process lowers the chosen variant. A
  decision under the device's key that cannot be used (malformed, or choosing a variant left
  out here) is measured again the same way, and replaced.

A variant left out of the call (it cannot compile or launch: see :mod:`bridge.compile.variants`) is
never emitted, measured or chosen; a decision that chose one is ignored, with a warning, as is
a document that is not a decision for the call (see :mod:`bridge.entries.decisions`).

Measuring runs each variant on the local GPU on synthetic inputs (:mod:`.measure`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from kernelcache.process import warn_once

from ..entries import decisions
from ..entries.decisions import Decision
from ..errors import AutotuneError
from . import measure

if TYPE_CHECKING:
    from kernelcache import Cache

    from ..call.tracing import CallSpec
    from ..compile.variants import Variants
    from ..identity.specialize import Specialization
    from ..targets import Target

logger = logging.getLogger(__name__)


def select(
    call: CallSpec,
    variants: Variants,
    target: Target,
    platform: str,
    cache: Cache,
    mode: str,
) -> list[int]:
    """The indices of the variants a lowering of ``call`` emits (see the module docstring);
    never one left out of the call (see :mod:`bridge.compile.variants`).

    Raises:
        AutotuneError: ``mode`` is "require" and there is no decision, or "job" and no
            variant could run.
        NoConfigError: every variant is left out.
    """
    specs = variants.specs
    if call.choice is not None:
        return variants.viable([call.choice])
    if len(specs) < 2 or mode == "runtime":
        return variants.viable()
    device = measure.current().device(target, platform)
    keys = decisions.keys_of(call.parts, call.named, specs, [device] if device else [])
    names = [spec.key for spec in specs]
    where = f"{call.parts.qualname} on {device or target}"
    found = decisions.lookup(cache, keys, names)
    if found is not None and _usable(*found, variants, where):
        return [found[1].chosen]
    if mode == "decided":
        return variants.viable()
    if mode == "require":
        raise AutotuneError(
            f"no autotune decision for {where} ({len(specs)} configs), and "
            "KERNELCACHE_AUTOTUNE=require: record the job's calls (KERNELCACHE_RECORD=FILE) and "
            "run `kernelcache tune FILE` on this GPU, or pin a config with `kernelcache tune "
            "FILE --pin KERNEL=INDEX`; or use autotune='decided' to let jaxlib choose"
        )
    if device is None:
        warn_once(
            logger,
            ("tune-no-device", str(target)),
            "kernelcache: KERNELCACHE_AUTOTUNE=job needs the GPU the call runs on to measure "
            "its configs; there is no %s device here, so jaxlib autotunes at the first run",
            target,
        )
        return variants.viable()
    kept = variants.viable()
    left = variants.left_out()

    def tune() -> tuple[bytes, dict[str, Any]]:
        made = decide(call, specs, target, device, left)
        logger.info(
            "kernelcache: tuned %s: %s (margin %s)", where, made.config, _percent(made.margin)
        )
        return made.to_bytes(), made.metadata()

    art = cache.get_or_create(keys[0], decisions.EXT, tune)
    for again in (True, False):  # one that cannot be used is measured again, once
        made = decisions.parse(art.data, names)
        if isinstance(made, str):
            decisions.ignored(keys[0], art.meta.get("digest"), made)
        elif _usable(keys[0], made, variants, where):
            return [made.chosen]
        if again:
            art = cache.rebuild(keys[0], decisions.EXT, tune, stale=art)
    return kept


def _usable(key: str, made: Decision, variants: Variants, where: str) -> bool:
    """Whether the config ``made`` (the decision under ``key``) chooses can run here (a
    decision for a config left out of the call is ignored, with a warning)."""
    why = variants.left_out([made.chosen]).get(made.chosen)
    if why is None:
        return True
    warn_once(
        logger,
        ("decision-left-out", key, made.chosen),
        "kernelcache: ignoring the autotune decision %s for %s: it chooses config %d (%s), "
        "which is left out here: %s",
        key,
        where,
        made.chosen,
        made.config,
        why,
    )
    return False


def decide(
    call: CallSpec,
    specs: Sequence[Specialization],
    target: Target,
    device: str,
    left_out: Mapping[int, str] | None = None,
) -> Decision:
    """Measure the variants of ``call`` and choose (see :func:`bridge.entries.decisions.choose`).
    Those in ``left_out`` (index: why it cannot compile or launch) are not measured, never
    chosen, and listed with their reasons.

    Raises:
        AutotuneError: no variant could run.
    """
    left = dict(left_out or {})
    measured = (
        measure.current().measure(call, len(specs), skip=frozenset(left))
        if left
        else measure.current().measure(call, len(specs))
    )
    times = [None if i in left else t for i, t in enumerate(measured.times)]
    reasons = {**measured.reasons, **left}
    chosen = decisions.choose(times)
    if chosen is None:
        why = "; ".join(f"{specs[i].variant.description}: {r}" for i, r in sorted(reasons.items()))
        raise AutotuneError(f"no config of {call.parts.qualname} could run on {device}: {why}")
    return Decision(
        kernel=call.parts.qualname,
        target=str(target),
        device=device,
        variants=tuple(spec.key for spec in specs),
        configs=tuple(spec.variant.description for spec in specs),
        chosen=chosen,
        times=tuple(times),
        margin=decisions.margin(times, chosen),
        noise=measured.noise,
        reasons=dict(sorted(reasons.items())),
    )


def _percent(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}%"
