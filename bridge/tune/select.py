"""Which variants of an autotuned call a lowering emits.

With a decision in the cache for the call on this device (or one pinned for its target), only
the chosen variant is lowered: a plain kernel call, the same in every process. Without one, by
the call's autotune mode (``autotune=``, else ``$KERNELCACHE_AUTOTUNE``):

- ``decided`` (default): every variant, for jaxlib to autotune at the first run;
- ``runtime``: every variant, even where a decision exists;
- ``require``: an :class:`~bridge.exceptions.AutotuneError` naming ``kernelcache tune``;
- ``job``: every rank that needs the decision screens a share of the configs on its own GPU
  (each config once per job, as a sample entry built with the cache's work stealing:
  :mod:`bridge.entries.samples`; ranks that share a GPU take turns on it, :func:`gpu`), then
  one rank runs the final rounds among the fastest on its GPU and stores the decision (single
  flight through the cache's build lock: the others wait for it, and take over if it dies);
  every rank lowers the chosen variant. A decision under the device's key that cannot be used
  (malformed, or choosing a variant left out here) is measured again by one rank, and
  replaced.

A variant left out of the call (it cannot compile or launch: see :mod:`bridge.compile.variants`) is
never emitted, measured or chosen; a decision that chose one is ignored, with a warning, as is
a document that is not a decision for the call (see :mod:`bridge.entries.decisions`).

Measuring launches each variant on synthetic inputs (:mod:`.measure`), as :mod:`.rounds` says.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from kernelcache.plugin import KernelCacheError, warn_once

from ..entries import decisions
from ..entries.decisions import DECISION, Decision
from ..entries.kinds import derived_key
from ..entries.samples import Sample
from ..entries.samples import gather as gathered
from ..exceptions import AutotuneError
from . import measure, rounds
from .rounds import Bench

if TYPE_CHECKING:
    from kernelcache import Cache

    from ..call.tracing import CallSpec
    from ..compile.variants import Variants
    from ..identity.specialize import Specialization
    from ..vendors.targets import Target

logger = logging.getLogger(__name__)


def select(
    call: CallSpec,
    variants: Variants,
    target: Target,
    platform: str,
    cache: Cache,
    mode: str,
    opaque: measure.Opaque | None = None,
) -> list[int]:
    """The indices of the variants a lowering of ``call`` emits (see the module docstring);
    never one left out of the call (see :mod:`bridge.compile.variants`). ``opaque(i)``: the
    custom-call opaque of variant i alone, to measure it (job mode).

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
    if device is None or opaque is None:
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
    start = time.monotonic()
    order = measured(specs, left)
    # made on first use: a rank that finds every sample made needs no bench
    bench = functools.cache(lambda: measure.current().bench(call, opaque, order, platform))

    def screen(index: int) -> Sample:
        with gpu(cache, bench().lanes[0]):
            return rounds.screen(bench(), index)

    # every rank screens its share (each config once per job), then one of them decides
    shift = os.getpid() % max(1, len(order))
    samples = gathered(cache, keys[0], names, device, order[shift:] + order[:shift], screen)

    def tune() -> tuple[bytes, dict[str, Any]]:
        made = decide(call, specs, target, device, bench(), cache, left, samples, start)
        logger.info(
            "kernelcache: tuned %s: %s (margin %s)", where, made.config, _percent(made.margin)
        )
        return made.to_bytes(), made.metadata()

    art = DECISION.get_or_create(cache, keys[0], tune)
    for again in (True, False):  # one that cannot be used is measured again, once
        made = decisions.parse(art.data, names)
        if isinstance(made, str):
            decisions.ignored(keys[0], art.meta.get("digest"), made)
        elif _usable(keys[0], made, variants, where):
            return [made.chosen]
        if again:
            art = DECISION.rebuild(cache, keys[0], tune, stale=art)
    return kept


def measured(specs: Sequence[Specialization], left: Mapping[int, str]) -> list[int]:
    """The indices of the variants to measure: those not left out."""
    return [i for i in range(len(specs)) if i not in left]


@contextmanager
def gpu(cache: Cache, lane: str) -> Iterator[None]:
    """Hold the GPU ``lane`` (host and bus id) against every process measuring through the
    cache's root, so that ranks sharing one GPU never measure at once. Where the lock cannot
    be had (a read-only root, a holder past the lock timeout) the measurement goes ahead,
    said once."""
    held = None
    try:
        held = cache.store.locker.acquire(
            derived_key("gpu", lane) + ".build", shared=False, timeout=cache.lock_timeout
        )
    except (KernelCacheError, OSError) as e:
        warn_once(
            logger,
            ("gpu-lock", lane),
            "kernelcache: measuring on %s without its lock (%s): another process may measure "
            "on it at the same time",
            lane,
            e,
        )
    try:
        yield
    finally:
        if held is not None:
            held.release()


def spread(bench: Bench, indices: Sequence[int], cache: Cache) -> list[Sample]:
    """Screen configs ``indices`` on every lane of ``bench`` at once: each lane takes the next
    config not taken yet (one thread per lane), holding its GPU (:func:`gpu`)."""
    queue = list(reversed(indices))
    lock = threading.Lock()
    found: list[Sample] = []
    failed: list[BaseException] = []

    def work(lane: int) -> None:
        try:
            while True:
                with lock:
                    if not queue or failed:
                        return
                    index = queue.pop()
                with gpu(cache, bench.lanes[lane]):
                    made = rounds.screen(bench, index, lane)
                with lock:
                    found.append(made)
        except BaseException as e:  # re-raised in the caller's thread
            with lock:
                failed.append(e)

    if len(bench.lanes) == 1:
        work(0)
    else:
        threads = [threading.Thread(target=work, args=(i,)) for i in range(len(bench.lanes))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    if failed:
        raise failed[0]
    return found


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
    bench: Bench,
    cache: Cache,
    left_out: Mapping[int, str] | None = None,
    samples: Sequence[Sample] | None = None,
    start: float | None = None,
) -> Decision:
    """Measure the variants of ``call`` on ``bench`` and choose (see :mod:`.rounds` and
    :func:`bridge.entries.decisions.choose`): the ``samples`` screened already (by several
    ranks), else a screening spread over the bench's lanes; then the final rounds on its first
    lane. Those in ``left_out`` (index: why it cannot compile or launch) are not measured,
    never chosen, and listed with their reasons. ``start``: when deciding began (monotonic).

    Raises:
        AutotuneError: no variant could run.
    """
    start = time.monotonic() if start is None else start
    left = dict(left_out or {})
    if samples is None:
        samples = spread(bench, measured(specs, left), cache)
    with gpu(cache, bench.lanes[0]):
        outcome = rounds.final(bench, samples)
    n = len(specs)
    times = [None if i in left else t for i, t in enumerate(_fit(outcome.times, n, None))]
    reasons = {**outcome.reasons, **left}
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
        noise=outcome.noise,
        reasons=dict(sorted(reasons.items())),
        launches=tuple(_fit(outcome.launches, n, 0)),
        spent=outcome.spent,
        wall=time.monotonic() - start,
        by=tuple(_fit(outcome.by, n, "")),
        final_by=outcome.final_by,
    )


def _fit(values: Sequence[Any], n: int, pad: Any) -> list[Any]:
    """``values`` cut or padded with ``pad`` to ``n`` (a variant measured by no one)."""
    return [*values[:n], *[pad] * (n - len(values))]


def _percent(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}%"
