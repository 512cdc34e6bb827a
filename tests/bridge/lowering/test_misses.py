"""A lowering miss explained step by step: with JAX's ``jax_explain_cache_misses`` on, a call
whose lowering is not stored names the steps of its key that differ from the nearest stored
lowering of its kernel (:mod:`bridge.lowering.misses`); with it off, nothing is said."""

from __future__ import annotations

import logging

import jax
import pytest
from bridge_helpers import _lowered_call, kernel_module

from bridge.lowering import lowering_keys


@pytest.fixture
def explaining():
    jax.config.update("jax_explain_cache_misses", True)
    yield
    jax.config.update("jax_explain_cache_misses", False)


@pytest.fixture
def module(tmp_path):
    return kernel_module(
        tmp_path,
        "misses_kernel",
        """
        @triton.jit
        def kernel(x_ptr, n, out_ptr, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * 2, mask=offs < n)
        """,
    )


def _said(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "missed" in r.getMessage()]


def test_a_miss_names_the_steps_that_differ(tmp_path, module, explaining, caplog):
    root = tmp_path / "cache"
    caplog.set_level(logging.WARNING, logger="bridge.lowering")
    _lowered_call(module.kernel, root, "inline", {})
    caplog.clear()
    _lowered_call(module.kernel, root, "inline", {})
    assert _said(caplog) == [], "a hit is not explained"
    _lowered_call(module.kernel, root, "ptx", {})
    (said,) = _said(caplog)
    assert "misses_kernel" in said and "cuda:90" in said
    assert f"{lowering_keys.STEPS['embed']} 'ptx' here vs 'inline'" in said
    assert "arguments" not in said  # only what differs


def test_a_first_lowering_says_none_is_stored(tmp_path, module, explaining, caplog):
    caplog.set_level(logging.WARNING, logger="bridge.lowering")
    _lowered_call(module.kernel, tmp_path / "empty", "inline", {})
    (said,) = _said(caplog)
    assert said.endswith("no lowering of this kernel is stored")


def test_nothing_is_said_unless_asked(tmp_path, module, caplog):
    caplog.set_level(logging.WARNING, logger="bridge.lowering")
    _lowered_call(module.kernel, tmp_path / "cache", "inline", {})
    assert _said(caplog) == []


def test_the_key_is_the_digest_of_the_steps_it_records(tmp_path, module):
    from kernelcache import Store
    from kernelcache.plugin import digest_of

    root = tmp_path / "cache"
    _lowered_call(module.kernel, root, "inline", {})
    metas = [m for m in (Store(root).inspect(p.stem) for p in root.glob("*.lowering"))]
    (meta,) = [m.meta for m in metas]
    steps = meta["components"]
    assert sorted(steps) == sorted(lowering_keys.STEPS)
    assert all(len(v) <= lowering_keys.SHORT for v in steps.values())
    from bridge.entries.lowerings import LOWERING

    assert LOWERING.key(digest_of(steps), "every") == metas[0].key


def test_a_programs_misses_cost_one_scan_of_the_layers(
    tmp_path, module, explaining, caplog, monkeypatch
):
    import kernelcache.cli

    scans = []
    real = kernelcache.cli.scan
    monkeypatch.setattr(kernelcache.cli, "scan", lambda *a, **k: scans.append(a) or real(*a, **k))
    caplog.set_level(logging.WARNING, logger="bridge.lowering")
    root = tmp_path / "cache"
    for embed in ("inline", "ptx"):  # two misses; the second compares with the first's steps
        _lowered_call(module.kernel, root, embed, {})
    assert len(scans) == 1
    assert "'ptx' here vs 'inline'" in _said(caplog)[-1]
