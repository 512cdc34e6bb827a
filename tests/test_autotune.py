"""Autotune decisions: entries of the cache that say which config of an autotuned call runs.

Lowered for cuda:90 on this CPU machine. Measuring needs the GPU; here a stand-in measurer
(``bridge.tune.measure.use``) plays the GPU where a test needs one.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from bridge_helpers import decoded
from conftest import REPO, checked, child_env
from redis_server import REDIS_SERVER, SKIP_REASON, RedisServer
from stand_in_gpu import TableMeasurer, read_log
from test_cli_support import kc, kc_json

import bridge
import kernelcache
from bridge.call import binding
from bridge.cli import tune
from bridge.entries import decisions
from bridge.entries.decisions import Decision
from bridge.entries.kinds import DECISION
from bridge.tune import measure
from examples import ops

A = jax.ShapeDtypeStruct((512, 256), jnp.bfloat16)
B = jax.ShapeDtypeStruct((256, 384), jnp.bfloat16)
MATMUL = "examples.kernels:matmul_kernel"


def lower(cache, **kw):
    (call,) = decoded(lambda x, y: ops.matmul(x, y, target="cuda:90", cache=cache, **kw), A, B)
    return call


def record_manifest(tmp_path: Path, cache, monkeypatch) -> Path:
    manifest = tmp_path / "manifest.jsonl"
    monkeypatch.setenv("KERNELCACHE_RECORD", str(manifest))
    lower(cache, autotune="runtime")
    monkeypatch.delenv("KERNELCACHE_RECORD")
    return manifest


@pytest.fixture
def cache(tmp_path):
    return kernelcache.Cache(tmp_path / "root", readonly_roots=(), remote="")


# -- the decision document ---------------------------------------------------------------------
def _decision(**kw) -> Decision:
    base = dict(
        kernel=MATMUL,
        target="cuda:90",
        device="NVIDIA H200",
        variants=("a" * 32, "b" * 32, "c" * 32),
        configs=("BM: 128", "BM: 64", "BM: 32"),
        chosen=1,
        times=(2.0e-3, 1.0e-3, None),
        margin=1.0,
        noise=0.01,
        reasons={2: "out of resources"},
    )
    return Decision(**{**base, **kw})


def test_a_decision_reads_back_as_written():
    made = _decision()
    assert decisions.parse(made.to_bytes(), made.variants) == made
    assert made.config == "BM: 64" and made.metadata()["kind"] == "decision"


@pytest.mark.parametrize(
    "edit, why",
    [
        ({"variants": ["a" * 32]}, "other variants"),
        ({"chosen": 3}, "out of range"),
        ({"chosen": True}, "out of range"),
        ({"times": [1.0, float("nan"), None]}, "not durations"),
        ({"times": [1.0, -1.0, None]}, "not durations"),
        ({"configs": ["x"]}, "configs"),
        ({"reasons": {"7": "x"}}, "reasons"),
        ({"margin": "big"}, "margin"),
        ({"device": ""}, "device"),
        ({"format": 2}, "format"),
        ({"reasons": {"\u00b2": "x"}}, "reasons"),  # a digit, but not one int() reads
        ({"reasons": {"1": "out of resources"}}, "says cannot run"),
        ({"pinned": True}, "pinned but names a device"),
        ({"device": decisions.ANY_DEVICE}, "names no device"),
        ({"times": []}, "has no time"),
        ({"times": [1.0, None, None]}, "has no time"),
    ],
)
def test_an_odd_decision_is_refused_with_a_reason(edit, why):
    made = _decision()
    doc = {**made.to_json(), **edit}
    found = decisions.parse(json.dumps(doc).encode(), made.variants)
    assert isinstance(found, str) and why in found


@pytest.mark.parametrize("raw", [b"", b"[", b"[]", b"\xff", b"1e999", b"{" * 5000])
def test_garbage_is_refused_never_raised(raw):
    assert isinstance(decisions.parse(raw, ["a" * 32]), str)


def test_ties_within_the_tolerance_go_to_the_earliest_config():
    assert decisions.choose([1.0, 0.5, 0.505]) == 1
    assert decisions.choose([0.51, 0.5]) == 0  # within 2 %: the kernel's own order decides
    assert decisions.choose([None, 2.0, 1.0]) == 2
    assert decisions.choose([None, None]) is None
    assert decisions.margin([1.0, 0.5, 0.75], 1) == pytest.approx(0.5)
    assert decisions.margin([None, 0.5], 1) is None


def test_the_key_depends_on_variants_inputs_and_device():
    v, inputs = ["a" * 32, "b" * 32], {"arrays": {"x": [[4], "float32"]}, "key": {"n": 4}}
    key = decisions.decision_key(v, inputs, "NVIDIA H200")
    assert len(key) == 64 and key == decisions.decision_key(v, inputs, "NVIDIA H200")
    assert key != decisions.decision_key(v[::-1], inputs, "NVIDIA H200")
    assert key != decisions.decision_key(v, {**inputs, "key": {"n": 8}}, "NVIDIA H200")
    assert key != decisions.decision_key(v, inputs, "NVIDIA H100")


# -- lowering -----------------------------------------------------------------------------------
def test_without_a_decision_every_config_is_lowered(cache):
    call = lower(cache)
    assert len(call.autotuned_kernel_call.configs) == 4


def test_require_without_a_decision_names_kernelcache_tune(cache):
    with pytest.raises(bridge.AutotuneError, match="kernelcache tune"):
        lower(cache, autotune="require")
    with pytest.raises(bridge.KernelArgumentError, match="not one of"):
        lower(cache, autotune="sometimes")


def test_a_pinned_decision_lowers_the_one_chosen_kernel(tmp_path, cache, monkeypatch):
    every = lower(cache, autotune="runtime").autotuned_kernel_call.configs
    manifest = record_manifest(tmp_path, cache, monkeypatch)
    (result,) = tune.tune(str(manifest), cache, pins={"matmul_kernel": 2})
    assert result.status == "pinned" and result.decision.chosen == 2
    assert result.decision.device == decisions.ANY_DEVICE and result.decision.pinned
    for mode in ("decided", "require", "job"):
        call = lower(cache, autotune=mode)
        assert call.HasField("kernel_call"), mode  # one plain kernel call: nothing to autotune
        assert call.kernel_call.kernel == every[2].kernel_call.kernel
        assert call.kernel_call.grid_0 == every[2].kernel_call.grid_0
    assert len(lower(cache, autotune="runtime").autotuned_kernel_call.configs) == 4
    # another shape is another decision
    (other,) = decoded(
        lambda x, y: ops.matmul(x, y, target="cuda:90", cache=cache),
        A,
        jax.ShapeDtypeStruct((256, 512), jnp.bfloat16),
    )
    assert len(other.autotuned_kernel_call.configs) == 4


def test_a_pin_outside_the_kernels_configs_is_refused(tmp_path, cache, monkeypatch):
    manifest = record_manifest(tmp_path, cache, monkeypatch)
    from bridge.errors import PinError

    with pytest.raises(PinError, match="4 configs"):  # a usage error: nothing is stored
        tune.tune(str(manifest), cache, pins={MATMUL: 4})


def test_a_decision_for_pruned_variants_is_not_used(tmp_path, cache, monkeypatch):
    """Pinning BM=64 drops two configs: the pinned decision was for the four."""
    manifest = record_manifest(tmp_path, cache, monkeypatch)
    tune.tune(str(manifest), cache, pins={MATMUL: 0})
    call = lower(cache, BM=64)
    assert len(call.autotuned_kernel_call.configs) == 2


# -- the command --------------------------------------------------------------------------------
LOWER_MATMUL = """
import json, sys, jax, jax.numpy as jnp
sys.path.insert(0, {tests!r})
from bridge_helpers import decoded, kernels_of
from examples import ops
a = jax.ShapeDtypeStruct((512, 256), jnp.bfloat16)
b = jax.ShapeDtypeStruct((256, 384), jnp.bfloat16)
(call,) = decoded(lambda x, y: ops.matmul(x, y, target="cuda:90"), a, b)
print(json.dumps({{"kernels": [k.num_warps for k in kernels_of(call)],
                  "plain": call.HasField("kernel_call")}}))
"""


def test_kernelcache_tune_pin_and_a_job_that_requires_decisions(tmp_path, cache, monkeypatch):
    manifest = record_manifest(tmp_path, cache, monkeypatch)
    root = Path(cache.root)
    bad = kc(root, "tune", str(manifest), "--pin", "nosuchkernel=1")
    assert bad.returncode == 2 and "nosuchkernel" in bad.stderr
    for index in ("9", "-1"):  # a config the kernel does not have: nothing is stored
        bad = kc(root, "tune", str(manifest), "--pin", f"matmul_kernel={index}")
        assert bad.returncode == 2, bad.stdout + bad.stderr
        assert "the kernel has 4 configs (0 to 3)" in bad.stderr or "INDEX" in bad.stderr
    assert not list(root.glob("*.decision")), "a bad pin stores no decision"
    for gpus in ("0", "-1", "two"):
        bad = kc(root, "tune", str(manifest), "--gpus", gpus)
        assert bad.returncode == 2 and "--gpus" in bad.stderr and "1 or more" in bad.stderr
    doc = kc_json(root, "tune", str(manifest), "--pin", "matmul_kernel=1")
    (result,) = doc["results"]
    assert result["status"] == "pinned" and result["decision"]["chosen"] == 1
    assert len(list(root.glob("*.decision"))) == 1
    assert result["decision"]["configs"][1].startswith("BM: 128, BN: 64")
    human = kc(root, "tune", str(manifest), "--pin", "matmul_kernel=1").stdout
    assert "pinned config 1" in human
    # a pattern selects among the recorded targets; one that selects none is a usage error
    picked = kc_json(root, "tune", str(manifest), "--pin", "matmul_kernel=1", "--target", "cu*")
    assert [r["target"] for r in picked["results"]] == ["cuda:90"]
    none = kc(root, "tune", str(manifest), "--pin", "matmul_kernel=1", "--target", "hip:*")
    assert none.returncode == 2
    assert "hip:* matches no target" in none.stderr and "recorded: cuda:90" in none.stderr
    code = LOWER_MATMUL.format(tests=str(REPO / "tests"))
    env = child_env(KERNELCACHE_DIR=str(root), KERNELCACHE_AUTOTUNE="require")
    proc = checked(
        subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=240
        )
    )
    out = json.loads(proc.stdout.splitlines()[-1])
    assert out == {"kernels": [4], "plain": True}
    listed = kc_json(root, "ls")
    kinds = [e.get("kind") for e in listed["entries"]]
    assert kinds.count("decision") == 1
    assert kc(root, "verify").returncode == 0


def test_decisions_travel_like_entries(tmp_path, cache, monkeypatch):
    """A read-only layer and a bundle carry decisions as they carry kernels."""
    manifest = record_manifest(tmp_path, cache, monkeypatch)
    tune.tune(str(manifest), cache, pins={"matmul_kernel": 3})
    bundle = tmp_path / "decisions.tar"
    assert kc(Path(cache.root), "export", str(bundle)).returncode == 0
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    assert kc(fresh, "import", str(bundle)).returncode == 0
    for layered in (
        kernelcache.Cache(fresh, readonly_roots=(), remote=""),
        kernelcache.Cache(tmp_path / "empty", readonly_roots=(cache.root,), remote=""),
    ):
        call = lower(layered)
        assert call.HasField("kernel_call") and call.kernel_call.kernel.num_warps == 4


# -- the ranks of a job decide together -----------------------------------------------------------
JOB = """
import json, os, sys
sys.path.insert(0, {tests!r})
from bridge.tune import measure
from stand_in_gpu import TableMeasurer, read_log

measure.use(TableMeasurer([3e-3, 1e-3, 2e-3, 4e-3], [os.environ["LANE"]],
                          sleep=float(os.environ["MEASURE_SECONDS"]), log={log!r}))
import jax, jax.numpy as jnp
from bridge_helpers import decoded, kernels_of
from examples import ops
a = jax.ShapeDtypeStruct((512, 256), jnp.bfloat16)
b = jax.ShapeDtypeStruct((256, 384), jnp.bfloat16)
(call,) = decoded(lambda x, y: ops.matmul(x, y, target="cuda:90", autotune="job"), a, b)
print(json.dumps({{"kernels": [k.num_warps for k in kernels_of(call)],
                  "grid": call.kernel_call.grid_1 if call.HasField("kernel_call") else None}}))
"""


def _job(
    root: Path, log: Path, seconds: float, lane: str = "node/gpu0", readonly: str = ""
) -> subprocess.Popen:
    code = JOB.format(tests=str(REPO / "tests"), log=str(log))
    env = child_env(KERNELCACHE_DIR=str(root), MEASURE_SECONDS=str(seconds), LANE=lane)
    if readonly:
        env["KERNELCACHE_READONLY_DIRS"] = readonly
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _result(proc: subprocess.Popen) -> dict:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out.splitlines()[-1])


def _screeners(log: Path) -> dict[int, set[int]]:
    """{config: the processes that screened it} (a screening is three timings in a row; the
    final rounds come after every screening)."""
    found: dict[int, list[int]] = {}
    for pid, _, index, what, _ in read_log(log):
        if what == "begin":
            found.setdefault(index, []).append(pid)
    return {index: set(pids[:3]) for index, pids in found.items()}


def _final_runners(log: Path) -> set[int]:
    """The processes that timed a config after its screening (the final rounds)."""
    seen: dict[int, int] = {}
    found = set()
    for pid, _, index, what, _ in read_log(log):
        if what == "begin":
            seen[index] = seen.get(index, 0) + 1
            if seen[index] > 3:
                found.add(pid)
    return found


def _started(log: Path, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 240
    while not (log.exists() and log.read_text().strip()):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
        time.sleep(0.05)


def test_the_ranks_of_a_job_share_the_screening_and_run_one_decision(tmp_path):
    root, log = tmp_path / "root", tmp_path / "measured"
    slow = _job(root, log, 2.0, "node/gpu0")  # its first config keeps it busy for 6 s
    _started(log, slow)
    others = [_job(root, log, 0.05, f"node/gpu{i}") for i in (1, 2, 3)]
    results = [_result(p) for p in (slow, *others)]
    assert results == [{"kernels": [4], "grid": 6}] * 4  # config 1 (BM 128, BN 64): 1 ms
    screened = _screeners(log)
    assert sorted(screened) == [0, 1, 2, 3]
    assert all(len(pids) == 1 for pids in screened.values()), screened  # once per job
    assert len(set().union(*screened.values())) >= 2, "the waiting ranks helped"
    (entry,) = root.glob("*.decision")
    made = json.loads(entry.read_bytes())
    assert made["chosen"] == 1 and {b for b in made["by"]} >= {"node/gpu0"}
    # the final rounds: run by the rank that took the decision's lock, which may have come
    # after every config was screened (and screened none)
    assert len(set(made["by"])) >= 2 and made["final_by"] in {f"node/gpu{i}" for i in range(4)}
    assert sum(made["launches"]) > 4 * 3 and made["spent"] > 0
    assert len(_final_runners(log)) == 1, "one rank ran the final rounds"


def test_ranks_sharing_one_gpu_never_measure_at_once(tmp_path):
    root, log = tmp_path / "root", tmp_path / "measured"
    procs = [_job(root, log, 0.1, "node/shared") for _ in range(3)]
    assert [_result(p) for p in procs] == [{"kernels": [4], "grid": 6}] * 3
    spans = []
    open_at: dict[int, float] = {}
    for pid, _, _, what, at in read_log(log):
        if what == "begin":
            open_at[pid] = at
        else:
            spans.append((open_at.pop(pid), at))
    spans.sort()
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans)), "two ranks measured at once"


def test_a_killed_screener_is_taken_over(tmp_path):
    root, log = tmp_path / "root", tmp_path / "measured"
    first = _job(root, log, 600.0, "node/gpu0")
    _started(log, first)
    (killed_config,) = {index for _, _, index, _, _ in read_log(log)}
    others = [_job(root, log, 0.05, f"node/gpu{i}") for i in (1, 2)]
    time.sleep(2.0)
    os.kill(first.pid, signal.SIGKILL)
    first.wait()
    assert [_result(p) for p in others] == [{"kernels": [4], "grid": 6}] * 2
    screened = _screeners(log)
    assert first.pid in screened[killed_config] and len(screened[killed_config]) == 2


def StandIn() -> TableMeasurer:
    """Plays a GPU: config 1 is fastest (milliseconds per config: 3, 1, 2), config 3 cannot
    be launched."""
    return TableMeasurer((3e-3, 1e-3, 2e-3, None))


@pytest.fixture
def stand_in():
    measurer = StandIn()
    previous = measure.use(measurer)
    yield measurer
    measure.use(previous)


def test_a_forced_tune_replaces_the_measured_decision(tmp_path, cache, monkeypatch, stand_in):
    manifest = record_manifest(tmp_path, cache, monkeypatch)
    assert [r.decision.chosen for r in tune.tune(str(manifest), cache)] == [1]
    stand_in.times = [3e-3, 2e-3, 1e-3, 4e-3]  # the GPU changed its mind: config 2 is fastest
    (kept,) = tune.tune(str(manifest), cache)
    assert kept.status == "present" and kept.decision.chosen == 1
    assert lower(cache, autotune="require").kernel_call.grid_1 == 6  # config 1: BN 64
    (forced,) = tune.tune(str(manifest), cache, force=True)
    assert forced.status == "tuned" and forced.decision.chosen == 2
    call = lower(cache, autotune="require")
    assert call.HasField("kernel_call") and call.kernel_call.grid_1 == 3  # config 2: BN 128


def test_tune_spreads_the_configs_over_gpus_into_one_decision(tmp_path, cache, monkeypatch):
    manifest = record_manifest(tmp_path, cache, monkeypatch)
    lanes = ("node/gpu0", "node/gpu1")
    previous = measure.use(TableMeasurer((3e-3, 1e-3, 2e-3, None), lanes, sleep=0.05))
    try:
        (result,) = tune.tune(str(manifest), cache, gpus=2)
    finally:
        measure.use(previous)
    made = result.decision
    assert result.status == "tuned" and made.chosen == 1
    assert set(made.by[:3]) == set(lanes) and made.by[3] in lanes  # each config screened
    assert made.final_by == "node/gpu0" and made.launches[3] == 0 and made.spent > 0
    assert made.wall is not None and made.wall < made.spent  # two GPUs at once
    assert "on node/gpu0, node/gpu1" in result.line()
    stored = decisions.find(cache, [tune_key(result, cache)], made.variants)
    assert stored == made


def tune_key(result, cache) -> str:
    (entry,) = Path(cache.root).glob(f"*.{DECISION.ext}")
    return entry.name.split(".")[0]


def test_tune_replays_recorded_calls_and_measures_them(tmp_path, cache, monkeypatch, stand_in):
    manifest = record_manifest(tmp_path, cache, monkeypatch)
    (result,) = tune.tune(str(manifest), cache)
    assert result.status == "tuned" and stand_in.benched == [[0, 1, 2, 3]]
    made = result.decision
    assert made.device == "Stand-in GPU" and made.chosen == 1
    assert made.reasons == {3: "the stand-in cannot launch config 3"}
    assert made.margin == pytest.approx(1.0) and not made.pinned
    assert "* " in result.line() and "margin 100.0%" in result.line()
    assert [r.status for r in tune.tune(str(manifest), cache)] == ["present"]
    assert [r.status for r in tune.tune(str(manifest), cache, force=True)] == ["tuned"]
    call = lower(cache, autotune="require")  # this "device" has its decision now
    assert call.HasField("kernel_call") and call.kernel_call.grid_1 == 6


def test_a_replayed_call_keys_like_the_lowering(tmp_path, cache, monkeypatch):
    manifest = record_manifest(tmp_path, cache, monkeypatch)
    (group,) = tune.recorded_calls(str(manifest))
    assert group.targets == ["cuda:90"] and group.outputs == ["c_ptr"]
    target = bridge.parse_target("cuda:90")
    replayed = tune.traced_call(group, target, cache)
    specs = tune.specialize_call(
        replayed.parts, replayed.named, replayed.kwargs, replayed.options, target, cache
    )
    recorded = [json.loads(line)["key"] for line in manifest.read_text().splitlines()]
    assert [s.key for s in specs] == recorded
    assert len(group.grids) == 4


def test_a_call_with_constexpr_keywords_replays_each_configs_grid(tmp_path, cache, monkeypatch):
    sys.path.insert(0, str(REPO / "benchmarks"))
    import triton
    from tuned_models import attention_fwd_kernel

    q = jax.ShapeDtypeStruct((4, 256, 64), jnp.bfloat16)

    def attention(q, k, v, **kw):
        return bridge.triton_call(
            q,
            k,
            v,
            256,
            kernel=attention_fwd_kernel,
            out_shape=q,
            grid=lambda meta: (triton.cdiv(256, meta["BLOCK_M"]), 4),
            HEAD_DIM=64,
            SM_SCALE=0.125,
            target="cuda:90",
            cache=cache,
            **kw,
        )

    manifest = tmp_path / "attention.jsonl"
    monkeypatch.setenv("KERNELCACHE_RECORD", str(manifest))
    (every,) = decoded(attention, q, q, q)
    monkeypatch.delenv("KERNELCACHE_RECORD")
    (group,) = tune.recorded_calls(str(manifest))
    target = bridge.parse_target("cuda:90")
    replayed = tune.traced_call(group, target, cache)
    lowered = tune.specialize_call(
        replayed.parts, replayed.named, replayed.kwargs, replayed.options, target, cache
    )
    grids = [binding.eval_grid(replayed.grid, s.bound.bound_args) for s in lowered]
    want = [
        (c.kernel_call.grid_0, c.kernel_call.grid_1, 1) for c in every.autotuned_kernel_call.configs
    ]
    assert grids == want and len(set(grids)) == 2


def test_warm_compiles_only_decided_configs_unless_told(tmp_path, cache, monkeypatch):
    from bridge.warm import warm

    manifest = record_manifest(tmp_path, cache, monkeypatch)
    fresh = kernelcache.Cache(tmp_path / "image", readonly_roots=(), remote="")
    tune.tune(str(manifest), fresh, pins={"matmul_kernel": 2})
    report = warm(str(manifest), ["cuda:90"], cache=fresh, jobs=1)
    assert [o.status for o in report.results] == ["compiled"]
    assert report.results[0].config.startswith("BM: 64, BN: 128")
    report = warm(str(manifest), ["cuda:90"], cache=fresh, jobs=1, all_configs=True)
    assert sorted(o.status for o in report.results) == ["compiled"] * 3 + ["present"]


@pytest.mark.skipif(REDIS_SERVER is None, reason=SKIP_REASON)
def test_decisions_travel_through_redis_signed(tmp_path, cache, monkeypatch):
    """One machine pins; another, with an empty root and the same signing key, lowers the
    decided kernel from the shared tier; with another key the value is refused."""
    monkeypatch.setenv("KERNELCACHE_SIGNING_KEY", "k" * 32)
    manifest = record_manifest(tmp_path, cache, monkeypatch)
    with RedisServer(tmp_path / "redis") as server:
        first = kernelcache.Cache(tmp_path / "one", readonly_roots=(), remote=server.url)
        (result,) = tune.tune(str(manifest), first, pins={"matmul_kernel": 3})
        assert result.status == "pinned"
        other = kernelcache.Cache(tmp_path / "two", readonly_roots=(), remote=server.url)
        call = lower(other)
        assert call.HasField("kernel_call") and call.kernel_call.grid_0 == 8
        assert list((tmp_path / "two").glob("*.decision")), "published locally"
        monkeypatch.setenv("KERNELCACHE_SIGNING_KEY", "z" * 32)
        third = kernelcache.Cache(tmp_path / "three", readonly_roots=(), remote=server.url)
        assert len(lower(third).autotuned_kernel_call.configs) == 4


# -- replaced and ignored decisions -------------------------------------------------------------
def test_tune_pins_in_place_of_the_decision_a_lowering_runs(tmp_path, cache, monkeypatch):
    every = lower(cache, autotune="runtime").autotuned_kernel_call.configs
    manifest = record_manifest(tmp_path, cache, monkeypatch)
    root = Path(cache.root)
    for args, index in (
        (["--pin", "matmul_kernel=0"], 0),
        (["--pin", "matmul_kernel=3", "--force"], 3),
        (["--pin", "matmul_kernel=2"], 2),
    ):
        done = kc(root, "tune", str(manifest), *args)
        assert done.returncode == 0 and f"pinned config {index}" in done.stdout, done.stderr
        call = lower(cache)  # this process read the decision before: it reads the new one
        assert call.HasField("kernel_call"), args
        assert call.kernel_call.kernel == every[index].kernel_call.kernel
        assert call.kernel_call.grid_0 == every[index].kernel_call.grid_0
    (entry,) = root.glob("*.decision")
    assert json.loads(entry.read_bytes())["chosen"] == 2
    assert not (root / ".quarantine").exists() and kc(root, "verify").returncode == 0


@pytest.fixture(scope="module")
def pinned(tmp_path_factory):
    """A root holding the kernels of the matmul call, the document of a decision pinning its
    config 1, that decision's key, and the key of a decision for the stand-in GPU."""
    base = tmp_path_factory.mktemp("pinned")
    kernels = kernelcache.Cache(base / "kernels", readonly_roots=(), remote="")
    with pytest.MonkeyPatch.context() as patch:
        manifest = record_manifest(base, kernels, patch)
    scratch = kernelcache.Cache(base / "scratch", readonly_roots=(kernels.root,), remote="")
    tune.tune(str(manifest), scratch, pins={"matmul_kernel": 1})
    (entry,) = Path(scratch.root).glob("*.decision")
    (group,) = tune.recorded_calls(str(manifest))
    target = bridge.parse_target("cuda:90")
    specs = tune._specs(group, target, kernels)
    named, _, _ = group.call.revived(target, [0])
    device, anywhere = decisions.keys_of(specs[0].parts, named, specs, ["Stand-in GPU"])
    assert entry.name == f"{anywhere}.decision"
    return kernels.root, json.loads(entry.read_bytes()), anywhere, device


def _doc(doc: dict, **edit) -> bytes:
    return json.dumps({**doc, **edit}).encode()


#: decision documents a lowering ignores, and why (as the warning says)
MALFORMED = {
    "chosen out of range": (lambda d: _doc(d, chosen=4), "out of range"),
    "chosen negative": (lambda d: _doc(d, chosen=-1), "out of range"),
    "chosen as a string": (lambda d: _doc(d, chosen="1"), "out of range"),
    "variants reordered": (lambda d: _doc(d, variants=d["variants"][::-1]), "other variants"),
    "a variant replaced": (lambda d: _doc(d, variants=[*d["variants"][:3], "f" * 64]), "other"),
    "stale times": (lambda d: _doc(d, times=[1e-3, 2e-3, 3e-3]), "stale times"),
    "2 MB": (lambda d: _doc(d, padding="x" * (2 << 20)), "too large"),
    "deeply nested": (
        lambda d: _doc(d)[:-1] + b', "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        "nested too deeply",
    ),
    "truncated": (lambda d: _doc(d)[:-3], "not JSON"),
    "another format": (lambda d: _doc(d, format=2), "unknown format"),
    "a reason keyed by a digit int() cannot read": (
        lambda d: _doc(d, reasons={"\u00b2": "x"}),
        "reasons are malformed",
    ),
    "chooses a config it says cannot run": (
        lambda d: _doc(d, reasons={"1": "out of resources"}),
        "says cannot run",
    ),
    "launches for other variants": (lambda d: _doc(d, launches=[3, 4]), "launches do not match"),
    "launches negative": (lambda d: _doc(d, launches=[0, -1, 0, 0]), "launches are not counts"),
    "measurers not text": (lambda d: _doc(d, by=[1, 2, 3, 4]), "measurers do not match"),
    "negative GPU time": (lambda d: _doc(d, spent=-1.0), "measuring time"),
    "a final measurer not text": (lambda d: _doc(d, final_by=7), "final measurer"),
}
DECISION_META = {"kind": "decision", "name": "matmul_kernel"}


def decision_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "bridge.entries.decisions"]


@pytest.mark.parametrize("name", list(MALFORMED))
def test_an_ignored_decision_is_warned_about_once(name, pinned, tmp_path, caplog):
    kernels, doc, key, _ = pinned
    make, why = MALFORMED[name]
    cache = kernelcache.Cache(tmp_path / "root", readonly_roots=(kernels,), remote="")
    cache.put(key, DECISION.ext, make(doc), DECISION_META)
    caplog.set_level(logging.WARNING, logger="bridge")
    for _ in range(2):
        assert len(lower(cache).autotuned_kernel_call.configs) == 4  # as without a decision
    (said,) = decision_warnings(caplog)
    assert key in said and why in said
    with pytest.raises(bridge.AutotuneError, match="no autotune decision"):
        lower(cache, autotune="require")
    assert len(decision_warnings(caplog)) == 1


@pytest.mark.parametrize("name", ["chosen out of range", "deeply nested", "a variant replaced"])
def test_job_mode_measures_in_place_of_a_malformed_decision(
    name, pinned, tmp_path, caplog, stand_in
):
    kernels, doc, _, key = pinned
    cache = kernelcache.Cache(tmp_path / "root", readonly_roots=(kernels,), remote="")
    cache.put(key, DECISION.ext, MALFORMED[name][0](doc), DECISION_META)
    caplog.set_level(logging.WARNING, logger="bridge")
    call = lower(cache, autotune="job")
    assert stand_in.benched == [[0, 1, 2, 3]]  # measured, as for an absent decision
    assert call.HasField("kernel_call") and call.kernel_call.grid_1 == 6  # config 1: 1 ms
    (said,) = decision_warnings(caplog)
    assert key in said and MALFORMED[name][1] in said
    made = decisions.parse(cache.get(key, DECISION.ext).data, doc["variants"])
    assert made.chosen == 1 and made.device == "Stand-in GPU"  # stored in its place
    assert lower(cache, autotune="job").HasField("kernel_call")
    assert stand_in.benched == [[0, 1, 2, 3]]


def test_a_job_measures_once_in_place_of_a_malformed_decision(pinned, tmp_path):
    kernels, doc, _, key = pinned
    root, marker = tmp_path / "root", tmp_path / "measured"
    bad = MALFORMED["chosen out of range"][0](doc)
    kernelcache.Cache(root, readonly_roots=(), remote="").put(key, "decision", bad, DECISION_META)
    procs = [_job(root, marker, 0.2, f"node/gpu{i}", str(kernels)) for i in range(3)]
    results = [_result(p) for p in procs]
    screened = _screeners(marker)
    assert all(len(pids) == 1 for pids in screened.values()), "each config screened once"
    assert len(_final_runners(marker)) == 1, "one process ran the final rounds"
    assert results == [{"kernels": [4], "grid": 6}] * 3
    fixed = kernelcache.Cache(root, readonly_roots=(), remote="").get(key, "decision")
    assert decisions.parse(fixed.data, doc["variants"]).chosen == 1
