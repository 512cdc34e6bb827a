"""How configs are measured: screening, final rounds, and the sample entries that let the ranks
of a job share the screening (GPUs played by tables: tests/helpers/stand_in_gpu.py)."""

from __future__ import annotations

import itertools
import json

import pytest
from stand_in_gpu import TableMeasurer

import kernelcache
from bridge.entries import samples
from bridge.entries.samples import Sample
from bridge.tune import rounds, select


def bench(times, lanes=("node/gpu0",), **kw):
    measurer = TableMeasurer(times, lanes, **kw)
    return measurer, measurer.bench(None, None, range(len(times)), "cuda", gpus=len(lanes))


@pytest.fixture
def cache(tmp_path):
    return kernelcache.Cache(tmp_path / "root", readonly_roots=(), remote="")


def test_a_screening_fills_the_target_time_after_two_single_launches():
    measurer, b = bench([1e-3])
    made = rounds.screen(b, 0)
    assert made.time == pytest.approx(1e-3) and made.runs == 10 and made.launches == 12
    assert measurer.runs == [(0, 1, 0), (0, 1, 0), (0, 10, 0)] and made.by == "node/gpu0"
    assert rounds.launches_for(1e-7) == rounds.MAX_LAUNCHES and rounds.launches_for(1.0) == 1


def test_a_config_that_cannot_launch_is_screened_with_its_reason():
    _, b = bench([None])
    made = rounds.screen(b, 0)
    assert made.time is None and made.reason == "the stand-in cannot launch config 0"


def test_the_final_times_only_the_configs_near_the_fastest_and_stops_the_clearly_slower():
    # config 1 fastest; 2 within the finalists' 10 % but 5 % slower; 0 and 3 far behind
    measurer, b = bench([3e-3, 1e-3, 1.05e-3, 2e-3])
    screened = [rounds.screen(b, i) for i in range(4)]
    measurer.runs.clear()
    outcome = rounds.final(b, screened)
    timed = {i for i, _, _ in measurer.runs}
    assert timed == {1, 2}, "only the finalists are timed again"
    per = {i: sum(1 for j, _, _ in measurer.runs if j == i) for i in timed}
    assert per[2] == 2 and per[1] == 2, "2 is clearly slower after two rounds: both stop"
    assert outcome.noise == 0.0 and outcome.times[0] == pytest.approx(3e-3)
    assert outcome.final_by == "node/gpu0" and outcome.launches[1] > screened[1].launches


def test_finalists_within_the_noise_are_timed_every_round():
    measurer, b = bench([1e-3, 1.01e-3])
    screened = [rounds.screen(b, i) for i in range(2)]
    measurer.runs.clear()
    rounds.final(b, screened)
    assert len(measurer.runs) == 2 * rounds.REPEATS


def test_nothing_that_ran_means_no_final():
    _, b = bench([None, None])
    outcome = rounds.final(b, [rounds.screen(b, i) for i in range(2)])
    assert outcome.times == (None, None) and outcome.noise is None and len(outcome.reasons) == 2


def test_spread_screens_on_every_lane_at_once(cache, tmp_path):
    log = tmp_path / "log"
    _, b = bench([1e-3, 2e-3, 3e-3, 4e-3], ("node/gpu0", "node/gpu1"), sleep=0.1, log=str(log))
    found = select.spread(b, [0, 1, 2, 3], cache)
    assert sorted(s.index for s in found) == [0, 1, 2, 3]
    assert {s.by for s in found} == {"node/gpu0", "node/gpu1"}
    spans: dict[str, list[tuple[float, float]]] = {}
    begun: dict[str, float] = {}
    for line in log.read_text().splitlines():
        _, lane, _, what, at = line.split()
        if what == "begin":
            begun[lane] = float(at)
        else:
            spans.setdefault(lane, []).append((begun.pop(lane), float(at)))
    overlap = any(
        a[0] < b[1] and b[0] < a[1]
        for a, b in itertools.product(spans["node/gpu0"], spans["node/gpu1"])
    )
    assert overlap, "the two GPUs measured at the same time"


# -- sample entries ------------------------------------------------------------------------------
SAMPLE = Sample(2, 1e-3, 10, 12, 0.02, "node/gpu0")


def test_a_sample_reads_back_as_written():
    data, meta = samples.encode(SAMPLE, "k" * 64, "NVIDIA H200")
    assert samples.parse(data, 2, "k" * 64, "NVIDIA H200") == SAMPLE and meta["kind"] == "sample"
    refused = Sample(3, None, 0, 0, 0.01, "node/gpu1", "out of resources")
    data, _ = samples.encode(refused, "v", "d")
    assert samples.parse(data, 3, "v", "d") == refused


HOSTILE = {
    "another config": (lambda d: {**d, "index": 5}, "another config"),
    "another device": (lambda d: {**d, "device": "NVIDIA A100"}, "another config or device"),
    "negative time": (lambda d: {**d, "time": -1.0}, "time or reason"),
    "infinite spent": (lambda d: {**d, "spent": float("inf")}, "counts, seconds"),
    "spent past a float": (lambda d: {**d, "spent": 10**400}, "counts, seconds"),
    "time past a float": (lambda d: {**d, "time": 10**400}, "time or reason"),
    "time and reason": (lambda d: {**d, "reason": "x"}, "both a time and a reason"),
    "neither": (lambda d: {**d, "time": None}, "both a time and a reason, or neither"),
    "runs over launches": (lambda d: {**d, "runs": 50}, "do not add up"),
    "runs a string": (lambda d: {**d, "runs": "10"}, "counts, seconds"),
    "unknown format": (lambda d: {**d, "format": 9}, "unknown format"),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_a_document_that_is_not_this_sample_is_refused(name):
    doc = json.loads(samples.encode(SAMPLE, "v", "d")[0])
    change, why = HOSTILE[name]
    said = samples.parse(json.dumps(change(doc)).encode(), 2, "v", "d")
    assert isinstance(said, str) and why in said
    assert isinstance(samples.parse(b"[" * 100000, 2, "v", "d"), str)
    assert isinstance(samples.parse(b"\xff", 2, "v", "d"), str)


def test_gather_screens_what_is_missing_or_unusable_and_keeps_the_rest(cache):
    decision = "d" * 64
    variants = ["a" * 64, "b" * 64, "c" * 64]
    good = Sample(0, 2e-3, 5, 7, 0.01, "node/gpu9")
    samples.SAMPLE.put(cache, decision, *samples.encode(good, variants[0], "G"), part=0)
    samples.SAMPLE.put(cache, decision, b'{"format": 1, "index": 1}', {}, part=1)
    screened = []

    def screen(i):
        screened.append(i)
        return Sample(i, 1e-3, 10, 12, 0.01, "node/gpu0")

    found = samples.gather(cache, decision, variants, "G", [0, 1, 2], screen)
    assert sorted(screened) == [1, 2]
    assert [s.index for s in found] == [0, 1, 2] and found[0] == good
    stored = samples.SAMPLE.get(cache, decision, part=1)
    assert samples.parse(stored.data, 1, variants[1], "G") == found[1]
