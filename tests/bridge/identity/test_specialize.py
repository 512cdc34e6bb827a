"""One specialization function: lowering a call, warm's planning and ``compile_record`` key the
same call for the same target identically (an autotuned kernel with a heuristic under it, and a
heuristics-only kernel), and refuse a block with too many threads with the same error."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import pytest
import triton
import triton.language as tl
from bridge_helpers import lowered_module

import bridge
import kernelcache
from bridge import warm
from bridge.compile import compiler as bridge_compile
from examples import kernels as K

TARGETS = ("cuda:90", "hip:gfx942")
X = jax.ShapeDtypeStruct((4096,), jnp.float32)


@triton.autotune(
    configs=[
        triton.Config({"BLOCK": 256}, num_warps=2),
        triton.Config({"BLOCK": 1024}, num_warps=4),
    ],
    key=["n"],
)
@triton.heuristics({"EVEN": lambda args: args["n"] % args["BLOCK"] == 0})
@triton.jit
def tuned_copy(x_ptr, n, out_ptr, BLOCK: tl.constexpr, EVEN: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    if EVEN:
        tl.store(out_ptr + offs, tl.load(x_ptr + offs))
    else:
        tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask), mask=mask)


def _lower(kernel: Any, target: str, cache: kernelcache.Cache, n: int, **kw: Any) -> None:
    platform = "cuda" if target.startswith("cuda") else "rocm"

    def fn(x: Any) -> Any:
        return bridge.triton_call(
            x, n, kernel=kernel, out_shape=x, grid=(4,), target=target, cache=cache, **kw
        )

    lowered_module(fn, X, platform=platform)


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> dict[str, Any]:
    """Both kernels lowered for both targets with ``KERNELCACHE_RECORD`` set: the manifest, the
    keys each lowering computed, and the cache that holds what it compiled."""
    tmp = tmp_path_factory.mktemp("specialize")
    manifest = tmp / "manifest.jsonl"
    cache = kernelcache.Cache(root=tmp / "cache")
    lowered: dict[str, set[str]] = {t: set() for t in TARGETS}
    with pytest.MonkeyPatch.context() as mp:
        for name in [n for n in os.environ if n.startswith("KERNELCACHE_")]:
            mp.delenv(name)
        mp.setenv("KERNELCACHE_DIR", str(tmp / "default"))
        mp.setenv("KERNELCACHE_RECORD", str(manifest))
        remove = bridge.on_lowered(lambda r: lowered[r["target"]].add(r["key"]))
        try:
            for target in TARGETS:
                _lower(tuned_copy, target, cache, 4096)  # 2 configs, EVEN decided per config
                _lower(K.heuristic_copy_kernel, target, cache, 1000, BLOCK=256)
        finally:
            remove()
    return {"manifest": manifest, "cache": cache, "keys": lowered}


def test_lowering_and_warming_the_recorded_manifest_give_the_same_keys(recorded):
    records = _records(recorded["manifest"])
    kernels = {r["kernel"] for r in records}
    assert kernels == {f"{__name__}:tuned_copy", "examples.kernels:heuristic_copy_kernel"}
    for target in TARGETS:
        assert len(recorded["keys"][target]) == 3  # two autotune configs and one heuristic
        assert {r["key"] for r in records if r["target"] == target} == recorded["keys"][target]
    before = bridge_compile.compile_count()
    report = warm.warm(recorded["manifest"], TARGETS, cache=recorded["cache"], jobs=1)
    assert report.ok, report.summary()
    for target in TARGETS:
        planned = {r.key for r in report.results if r.target == target}
        assert planned == recorded["keys"][target]
    # every key was already in the cache, so warm had nothing to compile
    assert {r.status for r in report.results} == {"present"} and report.workers == 0
    assert bridge_compile.compile_count() == before


def test_compile_record_gives_each_record_its_lowered_key(recorded):
    before = bridge_compile.compile_count()
    for rec in warm.read_manifest(recorded["manifest"]):
        assert warm.compile_record(rec, rec["target"], cache=recorded["cache"]) == rec["key"]
    assert bridge_compile.compile_count() == before  # each key found: nothing compiled


def test_the_thread_limit_error_is_the_same_for_lowering_and_warming(tmp_path, monkeypatch):
    """32 warps are 1024 threads on cuda:90 but 2048 on gfx942: lowering refuses the call for
    gfx942, and warming its cuda:90 record for gfx942 refuses it with the same message."""
    manifest = tmp_path / "manifest.jsonl"
    cache = kernelcache.Cache(root=tmp_path / "cache")
    monkeypatch.setenv("KERNELCACHE_RECORD", str(manifest))
    _lower(K.heuristic_copy_kernel, "cuda:90", cache, 1000, BLOCK=256, num_warps=32)
    monkeypatch.delenv("KERNELCACHE_RECORD")
    with pytest.raises(bridge.OptionError) as lowering:
        _lower(K.heuristic_copy_kernel, "hip:gfx942", cache, 1000, BLOCK=256, num_warps=32)
    message = str(lowering.value)
    assert "2048 threads per block" in message and "num_warps <= 16" in message

    (rec,) = _records(manifest)
    with pytest.raises(bridge.OptionError) as compiling:
        warm.compile_record(rec, "hip:gfx942", cache=cache)
    assert str(compiling.value) == message

    report = warm.warm(manifest, ["hip:gfx942"], cache=cache, jobs=1)
    (problem,) = report.failures
    assert (problem.kind, problem.target) == ("invalid", "hip:gfx942")
    assert problem.detail.endswith(f"OptionError: {message}")
    assert report.results == ()
