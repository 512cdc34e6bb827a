"""A JIT function's identity (bridge.identity.jit): its own code as Triton's ``cache_key`` covers
it (source, first line, the JIT helpers it names) and the decorator's settings; the same in
every process. What the frontend reads beyond that (constexpr globals, helpers reached through
a module or a closure's value) is the read set's to check, not the identity's."""

from __future__ import annotations

import pytest
from bridge_helpers import kernel_module, run_child
from support import HELPERS

from bridge.identity import jit

DEPS = """
@triton.jit
def helper(x):
    return x {helper}
"""

KERNEL = """
import {deps} as deps

@triton.jit
def local(x):
    return x {local}


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
    tl.store(y_ptr + offs, local(shift(x)) {kernel})
"""
BASE = {
    "kernel": "",
    "helper": "+ 1.0",
    "scale": "1.0",
    "padding": "",
    "offset": "1.0",
    "decorator": "",
    "local": "+ 0.0",
}
#: edits of the code itself, which Triton's cache_key sees
CODE_EDITS = {
    "source": {"kernel": "* 2.0"},
    "first-line": {"padding": "\n\n"},
    "helper-named-in-the-module": {"local": "+ 1.0"},
}
#: edits of values the frontend reads: the read set's to check (Triton checks the first at
#: launch, by its ``used_global_vals``)
READ_EDITS = {
    "constexpr-global": {"scale": "2.0"},
    "helper-through-a-module": {"helper": "+ 2.0"},
    "closure-value": {"offset": "2.0"},
}
#: edits Triton's cache_key does not see, which change what is compiled
SETTING_EDITS = {
    "noinline": {"decorator": "(noinline=True)"},
    "debug": {"decorator": "(debug=True)"},
    "do-not-specialize": {"decorator": "(do_not_specialize=['y_ptr'])"},
}


def load(tmp_path, tag: str, **edit: str):
    """The kernel module with ``edit`` applied (and its own dependency module), under the same
    module names as every other version (from a directory of its own)."""
    values = {**BASE, **edit}
    where = tmp_path / tag / "src"  # (the same directory name: the file's path is in the key)
    where.mkdir(parents=True, exist_ok=True)
    kernel_module(where, "jit_identity_deps", DEPS.format(**values))
    return kernel_module(where, "jit_identity", KERNEL.format(deps="jit_identity_deps", **values))


@pytest.mark.parametrize("edit", CODE_EDITS.values(), ids=CODE_EDITS.keys())
def test_what_changes_the_code_changes_the_identity(tmp_path, edit):
    base = load(tmp_path, "base").kernel
    changed = load(tmp_path, "changed", **edit).kernel
    assert changed.cache_key != base.cache_key  # the edit is one Triton's key sees
    assert jit.identity(changed) != jit.identity(base)


@pytest.mark.parametrize("edit", READ_EDITS.values(), ids=READ_EDITS.keys())
def test_what_the_frontend_reads_is_left_to_the_read_set(tmp_path, edit):
    """Keys route, read sets decide: an edit of a value the code reads keeps the identity (and
    so the key under which the kernel's read sets are found)."""
    base = load(tmp_path, "base").kernel
    changed = load(tmp_path, "changed", **edit).kernel
    assert jit.identity(changed) == jit.identity(base)


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
from pathlib import Path
sys.path.insert(0, {str(HELPERS)!r})
from bridge_helpers import kernel_module
from bridge.identity import jit
where = Path({str(tmp_path / "other" / "src")!r})
where.mkdir(parents=True)
for name in ("jit_identity_deps", "jit_identity"):
    text = (Path({str(tmp_path / "shared" / "src")!r}) / (name + ".py")).read_text()
    module = kernel_module(where, name, text.split(chr(10), 2)[2])
print(json.dumps(jit.identity(module.kernel)))
"""
    assert run_child(code) == here


def test_a_jit_function_is_told_from_other_values(tmp_path):
    module = load(tmp_path, "kinds")
    assert jit.is_jit(module.kernel) and jit.is_jit(module.shift)
    assert not jit.is_jit(module.make) and not jit.is_jit(module.SCALE)


def test_a_replaced_source_is_identified_anew(tmp_path):
    kernel = load(tmp_path, "replaced").kernel
    before = jit.identity(kernel)
    assert jit.identity(kernel) == before
    kernel._unsafe_update_src(kernel.src.replace("* SCALE", "* SCALE * 2.0"))
    assert jit.identity(kernel) != before


def test_a_setting_changed_on_the_function_is_identified_anew(tmp_path):
    """A setting set again, or a list of them edited in place, identifies the function anew."""
    kernel = load(tmp_path, "resettled", decorator="(do_not_specialize=['y_ptr'])").kernel
    before = jit.identity(kernel)
    kernel.debug = not kernel.debug
    flipped = jit.identity(kernel)
    assert flipped != before
    kernel.do_not_specialize.append("x_ptr")  # (the list the decorator was given, edited)
    assert jit.identity(kernel) not in (before, flipped)


def test_a_value_is_described_without_its_repr(tmp_path):
    """A constexpr object is described by what it is: its ``repr`` is never called (one that
    fails, or that prints two different objects alike, changes nothing)."""
    source = """
        class Odd:
            def __init__(self, k):
                self.k = k

            def __repr__(self):
                raise RuntimeError("no")

        ODD = Odd({k})
        """
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    one = kernel_module(tmp_path / "one", "jit_identity_odd", source.format(k=1))
    other = kernel_module(tmp_path / "two", "jit_identity_odd", source.format(k=2))
    again = kernel_module(tmp_path / "two", "jit_identity_odd", source.format(k=1))
    assert jit.constant(one.ODD) != jit.constant(other.ODD)
    assert jit.constant(one.ODD) == jit.constant(again.ODD)
