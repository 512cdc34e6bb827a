"""How the configs of an autotuned call are measured: a screening of each, then rounds among the
finalists, with measurements spent where they decide something.

Screening a config (:func:`screen`): one launch to load and warm it, one to estimate its time,
then enough launches for :data:`TARGET_SECONDS` (at most :data:`MAX_LAUNCHES`), timed once, as
jaxlib's autotuner times every config. Screenings are independent, so any GPU of the device
kind may screen any config (:mod:`.select` spreads them over the waiting ranks or ``--gpus``).

The final (:func:`final`), on one GPU: the configs screened within :data:`FINALISTS` of the
fastest are timed again, round after round (up to :data:`REPEATS`); after each round from the
second on, a finalist slower than the leader by more than the margin (``max(MARGIN,
3 x noise)``, the noise being the median relative spread of the finalists' rounds so far) is
clearly slower and stops. The time of a finalist is its fastest round; the others keep their
screening time. At least two rounds run, so the noise is always measured.

Invariant: the algorithm sees the GPU only through :class:`Bench`; a test plays the GPU with a
table of times.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from ..entries.samples import Sample
from ..exceptions import Unlaunchable

#: how long the timed launches of one config take (jaxlib aims for the same)
TARGET_SECONDS = 0.01
#: the most launches one timing makes (jaxlib's cap)
MAX_LAUNCHES = 100
#: the most rounds of the final
REPEATS = 5
#: configs screened within this fraction of the fastest go to the final
FINALISTS = 0.10
#: the smallest margin by which a finalist is clearly slower than the leader
MARGIN = 0.02


class Bench(Protocol):
    """A call's configs, ready to launch on one or more GPUs (lanes) of one device kind."""

    @property
    def lanes(self) -> Sequence[str]:
        """Who measures: one name per GPU (host and bus id); two equal names are one GPU."""
        ...

    def run(self, index: int, launches: int, lane: int) -> float:
        """Seconds that ``launches`` back-to-back launches of config ``index`` take on lane
        ``lane``.

        Raises:
            Unlaunchable: the config cannot run here (the message says why).
        """
        ...


@dataclass(frozen=True)
class Outcome:
    """What measuring a call found: seconds per launch of each config (None: not measured or
    could not run), the noise, the launches made per config, the seconds the lanes spent in
    all, who measured each config (its screening) and who ran the final."""

    times: tuple[float | None, ...]
    noise: float | None
    launches: tuple[int, ...]
    spent: float
    by: tuple[str, ...]
    final_by: str
    reasons: Mapping[int, str] = field(default_factory=dict)


def launches_for(seconds: float) -> int:
    """How many launches of a config that takes ``seconds`` fill :data:`TARGET_SECONDS`."""
    return max(1, min(MAX_LAUNCHES, int(TARGET_SECONDS / max(seconds, 1e-9))))


def screen(bench: Bench, index: int, lane: int = 0) -> Sample:
    """Screen config ``index`` on ``lane`` (see the module docstring)."""
    start = time.perf_counter()
    by = bench.lanes[lane]
    try:
        bench.run(index, 1, lane)  # loads the module, warms up
        runs = launches_for(bench.run(index, 1, lane))
        per_launch = bench.run(index, runs, lane) / runs
    except Unlaunchable as e:
        spent = time.perf_counter() - start
        return Sample(index, None, 0, 0, spent, by, str(e) or type(e).__name__)
    return Sample(index, per_launch, runs, 2 + runs, time.perf_counter() - start, by)


def final(bench: Bench, samples: Iterable[Sample], lane: int = 0) -> Outcome:
    """Choose among the screened ``samples`` by the final rounds on ``lane`` (see the module
    docstring); the returned times are what :func:`bridge.entries.decisions.choose` chooses
    from."""
    found = sorted(samples, key=lambda s: s.index)
    n = 1 + max((s.index for s in found), default=-1)
    times: list[float | None] = [None] * n
    launches, by = [0] * n, [""] * n
    reasons: dict[int, str] = {}
    spent = 0.0
    for s in found:
        times[s.index], launches[s.index], by[s.index] = s.time, s.launches, s.by
        spent += s.spent
        if s.reason is not None:
            reasons[s.index] = s.reason
    ran = {s.index: s for s in found if s.time is not None}
    if not ran:
        return Outcome(tuple(times), None, tuple(launches), spent, tuple(by), "", reasons)
    fastest = min(s.time for s in ran.values() if s.time is not None)
    alive = [
        i for i, s in ran.items() if s.time is not None and s.time <= fastest * (1 + FINALISTS)
    ]
    rounds: dict[int, list[float]] = {i: [] for i in alive}
    start = time.perf_counter()
    noise = None
    for r in range(REPEATS):
        for i in list(alive):
            try:
                rounds[i].append(bench.run(i, ran[i].runs, lane) / ran[i].runs)
            except Unlaunchable as e:  # it ran in its screening: a GPU of its own failed it
                alive.remove(i)
                rounds.pop(i)
                times[i] = None
                reasons[i] = str(e) or type(e).__name__
            launches[i] += ran[i].runs
        if r == 0 or not alive:
            continue
        noise = statistics.median(max(ts) / min(ts) - 1 for ts in rounds.values())
        leader = min(min(rounds[i]) for i in alive)
        cut = leader * (1 + max(MARGIN, 3 * noise))
        alive = [i for i in alive if min(rounds[i]) <= cut]
        if len(alive) == 1:
            break
    for i, ts in rounds.items():
        times[i] = min(ts)
    spent += time.perf_counter() - start
    final_by = bench.lanes[lane]
    return Outcome(tuple(times), noise, tuple(launches), spent, tuple(by), final_by, reasons)
