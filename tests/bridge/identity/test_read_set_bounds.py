"""A read set the witness records is one the form check admits, and a check of the cache's own
that refuses an entry at its put costs a compile, never the user's lowering.

The recorder and the form check share one definition of a read set's bounds
(``bridge.entries.metadata``: ``MAX_REASONS``, ``MAX_REASON``, ``bounded_reasons``); before,
the recorder wrote up to 12 reasons and the check admitted 9, and TransformerEngine's
permutation kernels failed inside the user's lowering with ``InvalidMetadata``.
"""

from __future__ import annotations

import json
import logging
import textwrap

import jax
import jax.numpy as jnp
import pytest
from bridge_helpers import custom_calls, kernel_module, kernel_source, lowered_module
from hypothesis import given, settings
from hypothesis import strategies as st

import bridge
import kernelcache
from bridge.compile import compiler
from bridge.entries import metadata

TARGETS = {"cuda:90": "cuda", "hip:gfx942": "rocm"}

#: a constexpr whose dunder methods (what Triton's frontend calls on it: ``repr`` and ``==`` on
#: 3.6, ``float`` on 3.9) each run 16 functions of the program: 16 reasons and more, more than a
#: read set keeps
MANY_REASONS = (
    "\n".join(f"def f{i}(v):\n    return v + {i}\n" for i in range(16))
    + "\ndef run_all(v):\n"
    + "".join(f"    v = f{i}(v)\n" for i in range(16))
    + "    return v\n"
    + textwrap.dedent(
        """
        class Knob(int):
            def __repr__(self):
                return f"Knob({run_all(int(self)) - 120})"

            def __str__(self):
                return repr(self)

            def __eq__(self, other):
                return run_all(int(self)) - 120 == other

            __hash__ = int.__hash__

            def __float__(self):
                return float(run_all(int(self)) - 120)
        """
    )
)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(max_size=600), max_size=40))
def test_any_reasons_fit_the_form_check(reasons):
    kept = metadata.bounded_reasons(reasons)
    text = json.dumps({"format": metadata.FORMAT, "rows": [], "partial": kept})
    assert metadata.problem(text) is None
    assert len(kept) <= metadata.MAX_REASONS
    assert len(kept) == min(len(dict.fromkeys(r[: metadata.MAX_REASON] for r in reasons)), 12)


def _lower(kernel, root, target, **params):
    def fn(x):
        return bridge.triton_call(
            x,
            x.size,
            kernel=kernel,
            out_shape=x,
            grid=(4,),
            BLOCK=1024,
            target=target,
            cache=kernelcache.Cache(str(root)),
            **params,
        )

    avals = jax.ShapeDtypeStruct((4096,), jnp.float32)
    return custom_calls(lowered_module(fn, avals, platform=TARGETS[target]))


def _kernel_entries(root):
    docs = [json.loads(p.read_text()) for p in root.glob("*.json")]
    return [d for d in docs if d.get("ext") in ("cubin", "hsaco")]


@pytest.mark.parametrize("target", TARGETS)
def test_a_read_set_with_more_reasons_than_it_keeps_is_stored(tmp_path, target):
    module = kernel_module(
        tmp_path,
        f"many_reasons_{target[:3]}",
        kernel_source(MANY_REASONS, "x * K", "K: tl.constexpr, "),
    )
    root = tmp_path / "root"
    before = compiler.compile_count()
    (call,) = _lower(module.kernel, root, target, K=module.Knob(3))
    (entry,) = _kernel_entries(root)
    reads = json.loads(entry["reads"])
    assert metadata.problem(entry["reads"]) is None
    assert len(reads["partial"]) == metadata.MAX_REASONS
    assert any("f15" in r or "more reasons" in r for r in reads["partial"])
    # stored: a second lowering in this process compiles nothing
    assert _lower(module.kernel, root, target, K=module.Knob(3)) == [call]
    assert compiler.compile_count() - before == 1


@pytest.mark.parametrize("target", TARGETS)
def test_an_entry_the_cache_refuses_at_its_put_costs_a_compile_not_the_lowering(
    tmp_path, monkeypatch, caplog, target
):
    """A form check refusing every read set (as the old bound refused TE's): the lowering
    still gets its module, one warning says the kernel is used from memory, and the root
    holds nothing of the kernel: no entry, and no PTX without its entry."""
    from examples import kernels

    monkeypatch.setattr(metadata, "problem", lambda text: "refused for this test")
    root = tmp_path / "root"
    before = compiler.compile_count()
    with caplog.at_level(logging.WARNING):
        (call,) = _lower(kernels.copy_dns_kernel, root, target)
        assert _lower(kernels.copy_dns_kernel, root, target) == [call]
    assert compiler.compile_count() - before == 2  # nothing stored: compiled again
    assert not [p.name for p in root.glob("*") if p.suffix in (".cubin", ".hsaco", ".ptx")]
    said = [r.getMessage() for r in caplog.records if "used from memory" in r.getMessage()]
    assert len(said) == 1 and "refused for this test" in said[0]
    monkeypatch.undo()  # the same module, stored, once the check admits it
    assert _lower(kernels.copy_dns_kernel, root, target) == [call]


def test_a_read_set_cut_at_its_row_bound_keeps_a_row_for_the_ir():
    """A recording past the bound is cut and partial, so it ends with the IR's row: the cut
    leaves room for it (before, 2,000 rows and the IR's made 2,001, which the form check
    refuses: the kernel was never stored)."""
    from bridge.readsets.witness import Recorder

    recorder = Recorder(object(), {})
    for i in range(metadata.MAX_ROWS + 10):
        recorder.add(-1, "g", f"n{i}", None)  # (short rows: 2,000 fit the text bound)
    recorder.ran(None, "0" * 64)
    text = recorder.text()
    assert metadata.problem(text) is None
    doc = json.loads(text)
    assert len(doc["rows"]) == metadata.MAX_ROWS and doc["rows"][-1][1] == "ir"
    assert f"more than {metadata.MAX_ROWS - 1} reads" in doc["partial"]
