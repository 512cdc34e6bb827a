"""Three-way attacks (:mod:`three_way`), round five: what Triton takes of the program by
identity or as a ``def`` bound it, where a read by value sees no change.

- ``is``: the code generator compares the objects themselves (``cfg.A is cfg.B``, a constexpr
  parameter ``is`` a global, a global ``is tl.float32``); reads are recorded by value, and two
  equal values may be one object or two (``int('1000')``, ``tl.dtype('fp32')``).
- A JIT helper's module and qualified name: Triton names (and shares) the function it generates
  by them, so a helper reached as a module's attribute whose class is renamed is another
  function, and two helpers whose names come to collide are generated once.
- Defaults and annotations as the ``def`` bound them: a helper's or the kernel's default taken
  from a name the module rebinds after the ``def``, a runtime default, an annotation; what the
  default's expression finds at compile time is not what Triton binds.

Each case: process 2 (version B, from version A's root) must embed what process 3 compiles.
"""

from __future__ import annotations

import hashlib

import pytest
from bridge_helpers import CHOOSE, kernel_module
from bridge_helpers import kernel_statements as kernel
from identity_targets import TARGETS, each_target
from three_way import Case, assert_second_gets_a_compile, assert_warm_change
from three_way import three_way as three_way_code

#: a helper of class ``{cls}``, reached as the module's attribute ``helper``
RENAMED = """
import triton

class {cls}:
    @triton.jit(noinline=True)
    def helper(v):
        return v * 2 + 1

helper = {cls}.helper
"""
#: two helpers named ``A.f`` and ``{second}.f``: one function when ``second`` is ``A``
COLLIDING = """
import triton

class A:
    @triton.jit
    def f(x):
        return x * 2.0

f = A.f

class {second}:
    @triton.jit
    def f(x):
        return x * 3.0

g = {second}.f
"""
#: a helper whose default is what ``SCALE`` was when it was defined (rebound after)
HELPER_DEFAULT = """
import triton
import triton.language as tl
import {cfg} as cfg

SCALE = cfg.BASE

@triton.jit
def helper(x, S: tl.constexpr = SCALE):
    return x * S

SCALE = 5.0
"""
#: a kernel whose parameter ``{param}`` defaults to (or is annotated with) what ``{name}`` was
#: when it was defined; the module then rebinds it
KERNEL_BOUND = """
import triton
import triton.language as tl
import {cfg} as cfg

{name} = cfg.{field}

@triton.jit
def kernel(x_ptr, n{annotated}, out_ptr, BLOCK: tl.constexpr{param}):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, x * {scale}, mask=mask)

{name} = {after}
"""

CASES = {
    "is-of-equal-ints": Case(
        {"w5_c1": "A = 1000\nB = 1000\n", "w5_k1": kernel("import w5_c1 as cfg", CHOOSE.format(cond="cfg.A is cfg.B"))},
        {"w5_c1": "A = 1000\nB = int('1000')\n"},
        "w5_k1",
    ),
    "is-of-a-constexpr-parameter-and-a-global": Case(
        {"w5_c2": "A = 'fast'\nB = 'fast'\n",
         "w5_k2": kernel("import w5_c2 as cfg", CHOOSE.format(cond="S is cfg.B"), "S: tl.constexpr, ")},
        {"w5_c2": "A = 'fast'\nB = ''.join(['fa', 'st'])\n"},
        "w5_k2",
        params="S=cfg.A",
    ),
    "is-of-equal-dtypes": Case(
        {"w5_c3": "import triton.language as tl\nDT = tl.float32\n",
         "w5_k3": kernel("import w5_c3 as cfg", CHOOSE.format(cond="cfg.DT is tl.float32"))},
        {"w5_c3": "import triton.language as tl\nDT = tl.dtype('fp32')\n"},
        "w5_k3",
    ),
    "helper-whose-class-is-renamed": Case(
        {"w5_h4": RENAMED.format(cls="NS"), "w5_k4": kernel("import w5_h4 as h", "out = x * h.helper(n)")},
        {"w5_h4": RENAMED.format(cls="NT")},
        "w5_k4",
    ),
    "helpers-whose-generated-names-come-to-collide": Case(
        {"w5_h5": COLLIDING.format(second="B"), "w5_k5": kernel("import w5_h5 as h", "out = h.f(x) + h.g(x)")},
        {"w5_h5": COLLIDING.format(second="A")},
        "w5_k5",
    ),
    "helper-default-bound-by-its-def": Case(
        {"w5_c6": "BASE = 2.0\n", "w5_h6": HELPER_DEFAULT.format(cfg="w5_c6"),
         "w5_k6": kernel("from w5_h6 import helper", "out = helper(x)")},
        {"w5_c6": "BASE = 3.0\n"},
        "w5_k6",
    ),
    "helper-default-bound-by-its-def-reached-as-an-attribute": Case(
        {"w5_c7": "BASE = 2.0\n", "w5_h7": HELPER_DEFAULT.format(cfg="w5_c7"),
         "w5_k7": kernel("import w5_h7 as h", "out = h.helper(x)")},
        {"w5_c7": "BASE = 3.0\n"},
        "w5_k7",
    ),
    "kernel-constexpr-default-bound-by-its-def": Case(
        {"w5_c8": "BASE = 2.0\n",
         "w5_k8": KERNEL_BOUND.format(cfg="w5_c8", name="SCALE", field="BASE", annotated="",
                                      param=", S: tl.constexpr = SCALE", scale="S", after="5.0")},
        {"w5_c8": "BASE = 3.0\n"},
        "w5_k8",
    ),
    "kernel-runtime-default-bound-by-its-def": Case(
        {"w5_c9": "BASE = 1\n",
         "w5_k9": KERNEL_BOUND.format(cfg="w5_c9", name="S0", field="BASE", annotated="",
                                      param=", s=S0", scale="s", after="5")},
        {"w5_c9": "BASE = 7\n"},
        "w5_k9",
    ),
    "kernel-annotation-bound-by-its-def": Case(
        {"w5_c10": "import triton.language as tl\nNT = tl.int32\n",
         "w5_k10": KERNEL_BOUND.format(cfg="w5_c10", name="NT", field="NT", annotated=": NT",
                                       param="", scale="2.0", after="tl.int32")},
        {"w5_c10": "import triton.language as tl\nNT = tl.int64\n"},
        "w5_k10",
    ),
}  # fmt: skip


@pytest.fixture(scope="module")
def three_way(tmp_path_factory):
    return three_way_code(tmp_path_factory.mktemp("witness_round5"), CASES)


@pytest.mark.parametrize("target,name", each_target(CASES))
def test_a_second_process_gets_what_a_compile_of_its_code_gives(three_way, target, name):
    assert_second_gets_a_compile(three_way, name, target)


@pytest.mark.parametrize("target", TARGETS)
def test_a_warm_process_embeds_what_an_equal_value_of_another_identity_gives(tmp_path, target):
    """``cfg.B`` is rebound to an equal int that is another object between two lowerings of one
    process: ``cfg.A is cfg.B`` flips, and the next lowering embeds what a compile gives now."""
    tag = hashlib.sha256(str(tmp_path).encode()).hexdigest()[:8]
    cfg = kernel_module(tmp_path, f"w5_wc_{tag}", "A = 1000\nB = 1000\n")
    body = kernel(f"import {cfg.__name__} as cfg", CHOOSE.format(cond="cfg.A is cfg.B"))
    module = kernel_module(tmp_path, f"w5_wk_{tag}", body)
    assert cfg.A is cfg.B

    def change() -> None:
        cfg.B = int("1000")
        assert cfg.A == cfg.B and cfg.A is not cfg.B

    assert_warm_change(module.kernel, tmp_path, change, target)
