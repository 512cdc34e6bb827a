"""A JIT function's identity (bridge.identity.jit): whatever changes Triton's ``cache_key``
changes it, so do the decorator's settings, and it is the same in every process."""

from __future__ import annotations

import pytest
from bridge_helpers import kernel_module, run_child

from bridge.identity import jit

DEPS = """
@triton.jit
def helper(x):
    return x {helper}
"""

KERNEL = """
import {deps} as deps

SCALE = tl.constexpr({scale})
{padding}

def make(offset):
    @triton.jit
    def shifted(x):
        return x + offset

    return shifted


shift = make(tl.constexpr({offset}))


@triton.jit{decorator}
def kernel(x_ptr, y_ptr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = deps.helper(tl.load(x_ptr + offs)) * SCALE
    tl.store(y_ptr + offs, shift(x) {kernel})
"""
BASE = {
    "kernel": "",
    "helper": "+ 1.0",
    "scale": "1.0",
    "padding": "",
    "offset": "1.0",
    "decorator": "",
}
#: edits that change Triton's cache_key
TRITON_EDITS = {
    "source": {"kernel": "* 2.0"},
    "dependency-through-a-module": {"helper": "+ 2.0"},
    "constexpr-global": {"scale": "2.0"},
    "first-line": {"padding": "\n\n"},
    "dependency-in-a-closure": {"offset": "2.0"},
}
#: edits Triton's cache_key does not see, which change what is compiled
SETTING_EDITS = {
    "noinline": {"decorator": "(noinline=True)"},
    "debug": {"decorator": "(debug=True)"},
    "do-not-specialize": {"decorator": "(do_not_specialize=['y_ptr'])"},
}


def load(tmp_path, tag: str, **edit: str):
    """The kernel module with ``edit`` applied (and its own dependency module)."""
    values = {**BASE, **edit}
    deps = f"jit_identity_deps_{tag}"
    kernel_module(tmp_path, deps, DEPS.format(**values))
    return kernel_module(tmp_path, f"jit_identity_{tag}", KERNEL.format(deps=deps, **values))


@pytest.mark.parametrize("edit", TRITON_EDITS.values(), ids=TRITON_EDITS.keys())
def test_what_changes_tritons_key_changes_the_identity(tmp_path, edit):
    base = load(tmp_path, "base").kernel
    changed = load(tmp_path, "changed", **edit).kernel
    assert changed.cache_key != base.cache_key  # the edit is one Triton's key sees
    assert jit.identity(changed) != jit.identity(base)


def test_the_same_code_loaded_again_has_the_same_identity(tmp_path):
    first = jit.identity(load(tmp_path, "again").kernel)
    assert jit.identity(load(tmp_path, "again").kernel) == first


@pytest.mark.parametrize("edit", SETTING_EDITS.values(), ids=SETTING_EDITS.keys())
def test_decorator_settings_change_the_identity(tmp_path, edit):
    base = load(tmp_path, "base").kernel
    changed = load(tmp_path, "setting", **edit).kernel
    assert jit.identity(changed) != jit.identity(base)


def test_the_identity_is_the_same_in_another_process(tmp_path):
    here = jit.identity(load(tmp_path, "shared").kernel)
    code = f"""
import json, sys
sys.path.insert(0, {str(tmp_path)!r})
import jit_identity_shared
from bridge.identity import jit
print(json.dumps(jit.identity(jit_identity_shared.kernel)))
"""
    assert run_child(code) == here


def test_a_jit_function_is_told_from_other_values(tmp_path):
    module = load(tmp_path, "kinds")
    assert jit.is_jit(module.kernel) and jit.is_jit(module.shift)
    assert not jit.is_jit(module.make) and not jit.is_jit(module.SCALE)


def test_a_replaced_source_is_identified_anew(tmp_path):
    kernel = load(tmp_path, "replaced").kernel
    before = jit.identity(kernel)
    assert jit.identity(kernel) == before  # (memoized for the process)
    kernel._unsafe_update_src(kernel.src.replace("* SCALE", "* SCALE * 2.0"))
    assert jit.identity(kernel) != before


def test_a_setting_changed_on_the_function_is_identified_anew(tmp_path):
    """The memo holds for the settings it was computed with: one set again, or a list of them
    edited in place, identifies the function anew."""
    kernel = load(tmp_path, "resettled", decorator="(do_not_specialize=['y_ptr'])").kernel
    before = jit.identity(kernel)
    kernel.debug = not kernel.debug
    flipped = jit.identity(kernel)
    assert flipped != before
    kernel.do_not_specialize.append("x_ptr")  # (the list the decorator was given, edited)
    assert jit.identity(kernel) not in (before, flipped)


def test_a_value_is_described_without_its_repr(tmp_path):
    """A value is described by what it is: its ``repr`` is never called (one that fails, or that
    prints two different objects alike, changes nothing)."""
    source = """
        class Odd:
            def __init__(self, k):
                self.k = k

            def __repr__(self):
                raise RuntimeError("no")

        ODD = tl.constexpr(Odd({k}))

        @triton.jit
        def kernel(x_ptr):
            tl.store(x_ptr, 1.0 * ODD.k)
        """
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    one = kernel_module(tmp_path / "one", "jit_identity_odd", source.format(k=1))
    other = kernel_module(tmp_path / "two", "jit_identity_odd", source.format(k=2))
    again = kernel_module(tmp_path / "two", "jit_identity_odd", source.format(k=1))
    assert jit.identity(one.kernel) != jit.identity(other.kernel)
    assert jit.identity(one.kernel) == jit.identity(again.kernel)
