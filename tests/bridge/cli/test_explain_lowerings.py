"""``kernelcache explain --lowerings``: the calls a cache holds lowered apart (one call, several
contexts) and the context steps that tell their lowerings apart; other calls of the same kernel
are not a split (:mod:`bridge.cli.splits`)."""

from __future__ import annotations

import json

import pytest
from bridge_helpers import _lowered_call, kernel_module
from cli_support import kc

from bridge.lowering import lowering_keys


@pytest.fixture
def module(tmp_path):
    return kernel_module(
        tmp_path,
        "split_kernel",
        """
        @triton.jit
        def kernel(x_ptr, n, out_ptr, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) + 1, mask=offs < n)
        """,
    )


def test_one_call_lowered_under_two_embeddings_is_a_split_naming_the_step(tmp_path, module):
    root = tmp_path / "cache"
    _lowered_call(module.kernel, root, "inline", {})
    _lowered_call(module.kernel, root, "ptx", {})
    _lowered_call(module.kernel, root, "inline", {"name": "another_call"})  # another call
    done = kc(root, "explain", "--lowerings", "--json")
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)
    assert report["entries"] == 3 and report["unrecorded"] == 0
    (split,) = report["splits"]
    assert split["kernel"].endswith("split_kernel:kernel") and split["target"] == "cuda:90"
    assert split["lowerings"] == 2
    steps = {s["step"]: s["values"] for s in split["steps"]}
    assert steps["embed"] == ["'inline'", "'ptx'"]
    assert set(steps) <= set(lowering_keys.CONTEXT_STEPS)
    text = kc(root, "explain", "--lowerings").stdout
    assert "2 lowerings of one call differ in" in text
    assert f"{lowering_keys.STEPS['embed']} ('inline', 'ptx')" in text


def test_a_cache_whose_calls_are_each_lowered_once_has_no_split(tmp_path, module):
    root = tmp_path / "cache"
    _lowered_call(module.kernel, root, "inline", {})
    _lowered_call(module.kernel, root, "inline", {"name": "another_call"})
    done = kc(root, "explain", "--lowerings", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["splits"] == [] and report["entries"] == 2


def test_lowerings_takes_no_manifest_and_explain_needs_one_or_the_other(tmp_path):
    both = kc(tmp_path, "explain", "calls.jsonl", "--lowerings")
    assert both.returncode == 2 and "--lowerings takes no MANIFEST" in both.stderr
    neither = kc(tmp_path, "explain")
    assert neither.returncode == 2 and "give a MANIFEST" in neither.stderr


def test_the_context_steps_are_the_steps_every_lowering_of_a_setup_starts_with(tmp_path):
    import kernelcache
    from bridge.vendors.targets import parse_target

    cache = kernelcache.Cache(str(tmp_path / "cache"))
    context = lowering_keys.context(parse_target("cuda:90"), "inline", "0.0", None, cache)
    assert context is not None and tuple(context) == lowering_keys.CONTEXT_STEPS
