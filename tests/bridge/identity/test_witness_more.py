"""More three-way attacks (:mod:`three_way`): a hit must be what a compile of the code as it is
now gives, whatever the key trusted and whichever way the frontend reached a value.

Values the frontend computes through an object's operators (``S * 1.0``, ``S > 1.0``, ``-S``,
``S and ...``: Triton's ``constexpr`` calls the object's own methods); calls whose arguments the
witness cannot make again (Triton's own types); code that claims a module of the standard
library; Triton's code generator patched in the process; a decorator's settings; an extern
library replaced by another of the same size and modification time; the compiler's environment.
The warm tests change values in place between two lowerings of one process.
"""

from __future__ import annotations

import hashlib

import pytest
from bridge_helpers import kernel_module, kernel_source
from identity_targets import TARGETS, each_target
from three_way import Case, assert_second_gets_a_compile, assert_warm_change
from three_way import three_way as three_way_code

OBJECT = """
import triton.language as tl
from ._f import FACTOR

class Scale:
    def __mul__(self, other):
        return FACTOR * other

    def __gt__(self, other):
        return FACTOR > other

    def __neg__(self):
        return -FACTOR

    def __bool__(self):
        return FACTOR > 5.0

S = tl.constexpr(Scale())
"""
FACTOR = "FACTOR = {}\n"
CFN = """
import triton
from ._f import FACTOR

@triton.constexpr_function
def scale(t):
    return FACTOR
"""
LYING = """
__name__ = "math"  # (what the functions defined below say of their module)
import triton

@triton.constexpr_function
def scale(t):
    return {k}
"""
LIAR_CLASS = """
class Scale:
    __module__ = "math"

    def __mul__(self, other):
        return {k} * other
"""
DOT = """
import triton
import triton.language as tl

@triton.jit
def kernel(x_ptr, n, out_ptr, BLOCK: tl.constexpr):
    r = tl.arange(0, 32)
    a = tl.load(x_ptr + r[:, None] * 32 + r[None, :])
    tl.store(out_ptr + r[:, None] * 32 + r[None, :], tl.dot(a, a))
"""
HELPER = """
import triton
import triton.language as tl

@triton.jit{settings}
def helper(n):
    return n * 3 + 1
"""
LIBRARY = """define float @o12_scale(float %x) {{
  %r = fmul float %x, {k}
  ret float %r
}}
"""
EXTERN = kernel_source(
    """
    import os
    LIB = os.path.join(os.path.dirname(__file__), "o12_lib.ll")

    @tl.core.extern
    def o12_scale(arg0, _semantic=None):
        f32 = tl.core.dtype("fp32")
        symbols = {(f32,): ("o12_scale", f32)}
        return tl.core.extern_elementwise("", "", [arg0], symbols, True, _semantic=_semantic)
    """,
    "o12_scale(x)",
)
LIBDEVICE = """define float @__nv_expf(float %x) {{
  %r = fmul float %x, {k}
  ret float %r
}}
"""
REPR = """
def _repr(self):
    return f"Scale{FACTOR}"

Scale.__repr__ = _repr
"""
NAMED = """
@triton.jit(noinline=True)
def named(n, s: tl.constexpr):
    return n + 1
"""
HIDDEN = """
class Scale(float):
    def __float__(self):
        return 1.0

    def __repr__(self):
        return "Scale()"

S = Scale({k})
"""
BUILTIN = """
import triton.language as tl
from ._f import FACTOR


@tl.core.builtin
def scaled(x, _semantic=None):
    return x.__mul__(FACTOR, _semantic=_semantic)
"""
AGGREGATE = """
import triton
import triton.language as tl
from triton.language.core import _aggregate as aggregate
from ._f import FACTOR


@aggregate
class Cfg:
    k: tl.constexpr

    @triton.constexpr_function
    def __init__(self, k):
        self.k = tl.constexpr(k)

    @triton.constexpr_function
    def scale(self):
        return self.k * FACTOR
"""
GLUON = """
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from {pkg} import S, scale


@gluon.jit
def kernel(x_ptr, n, out_ptr, BLOCK: gl.constexpr, TPW: gl.constexpr):
    layout: gl.constexpr = gl.BlockedLayout([4], [TPW], [gl.num_warps()], [0])
    offs = gl.program_id(0) * BLOCK + gl.arange(0, BLOCK, layout=layout)
    x = gl.load(x_ptr + offs, mask=offs < n)
    gl.store(out_ptr + offs, {body}, mask=offs < n)
"""
ENV = {
    "TRITON_DEFAULT_FP_FUSION": "0",
    "TRITON_F32_DEFAULT": "ieee",
    "TRITON_DISABLE_LINE_INFO": "1",
}


def _installed(pkg: str, body: str) -> Case:
    """An installed package whose ``__init__`` holds ``OBJECT`` and whose kernel's body is
    ``body``; version B changes the sibling module ``OBJECT`` reads."""
    return Case(
        {
            f"site/{pkg}/__init__.py": OBJECT,
            f"site/{pkg}/_f.py": FACTOR.format(2.0),
            f"site/{pkg}/k.py": kernel_source(f"from {pkg} import S", body),
        },
        {f"site/{pkg}/_f.py": FACTOR.format(9.0)},
        f"{pkg}.k",
    )


CASES: dict[str, Case] = {
    # 1. operators of an installed object, computed by the frontend
    "installed-object-times": _installed("o1pkg", "x * (S * 1.0)"),
    "installed-object-compared": _installed("o2pkg", "x * 2.0 if S > 5.0 else x * 3.0"),
    "installed-object-negated": _installed("o3pkg", "x * (-S)"),
    "installed-object-truth": _installed("o4pkg", "x * 2.0 if not S else x * 3.0"),
    "installed-float-enum-times": Case(
        {
            "site/o5pkg/__init__.py": """
                import enum, os
                class Mode(float, enum.Enum):
                    A = float(open(os.path.join(os.path.dirname(__file__), "m.txt")).read())
            """,
            "site/o5pkg/m.txt": "2.0",
            "o5_k": kernel_source("", "x * (M * 1.0)", "M: tl.constexpr, "),
        },
        {"site/o5pkg/m.txt": "9.0"},
        "o5_k",
        "M=__import__('o5pkg').Mode.A",
    ),
    "installed-float-enum-times-a-tensor": Case(
        {
            "site/o28pkg/__init__.py": """
                import enum, os
                class Mode(float, enum.Enum):
                    A = float(open(os.path.join(os.path.dirname(__file__), "m.txt")).read())
            """,
            "site/o28pkg/m.txt": "2.0",
            "o28_k": kernel_source("", "x * M", "M: tl.constexpr, "),
        },
        {"site/o28pkg/m.txt": "9.0"},
        "o28_k",
        "M=__import__('o28pkg').Mode.A",
    ),
    "float-subclass-hiding-its-value": Case(
        {
            "o30_obj": HIDDEN.format(k="2.0"),
            "o30_k": kernel_source("", "x * S", "S: tl.constexpr, "),
        },
        {"o30_obj": HIDDEN.format(k="9.0")},
        "o30_k",
        "S=__import__('o30_obj').S",
    ),
    # 2. a call whose argument the witness cannot make again
    "installed-constexpr-function-given-a-type": Case(
        {
            "site/o6pkg/__init__.py": CFN,
            "site/o6pkg/_f.py": FACTOR.format(2.0),
            "site/o6pkg/k.py": kernel_source("from o6pkg import scale", "x * scale(x.type)"),
        },
        {"site/o6pkg/_f.py": FACTOR.format(9.0)},
        "o6pkg.k",
    ),
    # 3. code that claims a module of the standard library
    "constexpr-function-of-a-module-named-math": Case(
        {
            "o7_f": LYING.format(k="2.0"),
            "o7_k": kernel_source("from o7_f import scale", "x * scale(x.type)"),
        },
        {"o7_f": LYING.format(k="9.0")},
        "o7_k",
    ),
    "class-claiming-the-math-module": Case(
        {
            "o8_obj": LIAR_CLASS.format(k="2.0"),
            "o8_k": kernel_source(
                "import o8_obj\nS = tl.constexpr(o8_obj.Scale())", "x * (S * 1.0)"
            ),
        },
        {"o8_obj": LIAR_CLASS.format(k="9.0")},
        "o8_k",
    ),
    # 4. Triton patched in the process
    "triton-semantic-patched": Case(
        {"o9_k": kernel_source("", "x * 3.0")},
        {},
        "o9_k",
        setup="import triton.language.semantic as s; s.TritonSemantic.mul = s.TritonSemantic.add",
    ),
    "libdevice-function-patched": Case(
        {"o10_k": kernel_source("from triton.language.extra import libdevice", "libdevice.exp(x)")},
        {},
        "o10_k",
        setup="import triton.language.extra.cuda.libdevice as d; d.exp = d.exp2\n"
        "import triton.language.extra.hip.libdevice as h; h.exp = h.exp2",
    ),
    "math-function-patched": Case(
        {
            "o11_k": kernel_source(
                """
                import math
                @triton.constexpr_function
                def root():
                    return math.sqrt(4.0)
                """,
                "x * root()",
            )
        },
        {},
        "o11_k",
        setup="import math; math.sqrt = math.exp",
    ),
    # 5. settings, defaults, files whose identity does not change
    "helper-made-noinline": Case(
        {
            "o13_h": HELPER.format(settings=""),
            "o13_k": kernel_source("from o13_h import helper", "x * helper(n)"),
        },
        {"o13_h": HELPER.format(settings="(noinline=True)")},
        "o13_k",
    ),
    "installed-helper-default-from-a-sibling": Case(
        {
            "site/o14pkg/__init__.py": """
                import triton
                import triton.language as tl
                from ._f import FACTOR
                @triton.jit
                def scale(x, k: tl.constexpr = FACTOR):
                    return x * k
            """,
            "site/o14pkg/_f.py": FACTOR.format(2.0),
            "o14_k": kernel_source("from o14pkg import scale", "scale(x)"),
        },
        {"site/o14pkg/_f.py": FACTOR.format(9.0)},
        "o14_k",
    ),
    "extern-library-same-size-and-mtime": Case(
        {"o12_lib.ll": LIBRARY.format(k="2.0"), "o12_k": EXTERN},
        {"o12_lib.ll": LIBRARY.format(k="9.0")},
        "o12_k",
        "extern_libs={'o12': LIB}",
        same_stat=True,
    ),
    "import-root-of-the-kernel-moved": Case(
        {"o31pkg/__init__": "", "o31pkg/k": kernel_source("", "tl.exp(x)")},
        {},
        "o31pkg.k",
        setup="import os, sys; sys.path.append(os.path.join(os.environ['WITNESS_SRC'], 'o31pkg'))",
    ),
    "kernel-edited-same-size-and-mtime": Case(
        {"o15_k": kernel_source("", "x * 2.0")},
        {"o15_k": kernel_source("", "x * 9.0")},
        "o15_k",
        same_stat=True,
    ),
    "installed-module-edited-same-size-and-mtime": Case(
        {
            "site/o16pkg/__init__.py": LYING.replace('__name__ = "math"', "").format(k="2.0"),
            "site/o16pkg/k.py": kernel_source("from o16pkg import scale", "x * scale(x.type)"),
        },
        {"site/o16pkg/__init__.py": LYING.replace('__name__ = "math"', "").format(k="9.0")},
        "o16pkg.k",
        same_stat=True,
    ),
    "libdevice-replaced-same-size-and-mtime": Case(
        {
            "o21_libdevice.ll": LIBDEVICE.format(k="2.0"),
            "o21_k": kernel_source(
                "from triton.language.extra import libdevice", "libdevice.exp(x)"
            ),
        },
        {"o21_libdevice.ll": LIBDEVICE.format(k="9.0")},
        "o21_k",
        same_stat=True,
        shared_env={"TRITON_LIBDEVICE_PATH": "{src}/o21_libdevice.ll"},
    ),
    "installed-object-names-a-helper": Case(
        {
            "site/o22pkg/__init__.py": OBJECT + REPR,
            "site/o22pkg/_f.py": FACTOR.format(2.0),
            "site/o22pkg/k.py": kernel_source(f"from o22pkg import S\n{NAMED}", "x * named(n, S)"),
        },
        {"site/o22pkg/_f.py": FACTOR.format(9.0)},
        "o22pkg.k",
    ),
    "installed-constexpr-function-calls-a-function": Case(
        {
            "site/o26pkg/__init__.py": CFN.replace("return FACTOR", "return _factor()")
            + "\n@triton.constexpr_function\ndef _factor():\n    return FACTOR\n",
            "site/o26pkg/_f.py": FACTOR.format(2.0),
            "site/o26pkg/k.py": kernel_source("from o26pkg import scale", "x * scale(x.type)"),
        },
        {"site/o26pkg/_f.py": FACTOR.format(9.0)},
        "o26pkg.k",
    ),
    "installed-constexpr-function-builds-an-object": Case(
        {
            "site/o29pkg/__init__.py": CFN.replace("return FACTOR", "return Box().k")
            + "\nclass Box:\n    def __init__(self):\n        self.k = FACTOR\n",
            "site/o29pkg/_f.py": FACTOR.format(2.0),
            "site/o29pkg/k.py": kernel_source("from o29pkg import scale", "x * scale(x.type)"),
        },
        {"site/o29pkg/_f.py": FACTOR.format(9.0)},
        "o29pkg.k",
    ),
    "installed-constexpr-function-default-from-a-sibling": Case(
        {
            "site/o32pkg/__init__.py": CFN.replace(
                "def scale(t):", "def scale(t, k=FACTOR):"
            ).replace("return FACTOR", "return k"),
            "site/o32pkg/_f.py": FACTOR.format(2.0),
            "site/o32pkg/k.py": kernel_source("from o32pkg import scale", "x * scale(x.type)"),
        },
        {"site/o32pkg/_f.py": FACTOR.format(9.0)},
        "o32pkg.k",
    ),
    "installed-builtin-reads-a-sibling": Case(
        {
            "site/o33pkg/__init__.py": BUILTIN,
            "site/o33pkg/_f.py": FACTOR.format(2.0),
            "site/o33pkg/k.py": kernel_source("from o33pkg import scaled", "scaled(x)"),
        },
        {"site/o33pkg/_f.py": FACTOR.format(9.0)},
        "o33pkg.k",
    ),
    "installed-aggregate-constexpr-method": Case(
        {
            "site/o27pkg/__init__.py": AGGREGATE,
            "site/o27pkg/_f.py": FACTOR.format(2.0),
            "site/o27pkg/k.py": kernel_source("from o27pkg import Cfg", "x * Cfg(1.0).scale()"),
        },
        {"site/o27pkg/_f.py": FACTOR.format(9.0)},
        "o27pkg.k",
    ),
    # 6. a Gluon kernel: an installed object's operator, a layout given to a constexpr_function
    "gluon-installed-object-times": Case(
        {
            "site/o23pkg/__init__.py": OBJECT + CFN.replace("from ._f import FACTOR", ""),
            "site/o23pkg/_f.py": FACTOR.format(2.0),
            "o23_k": GLUON.format(pkg="o23pkg", body="x * (S * 1.0)"),
        },
        {"site/o23pkg/_f.py": FACTOR.format(9.0)},
        "o23_k",
    ),
    "gluon-installed-constexpr-function-given-a-layout": Case(
        {
            "site/o24pkg/__init__.py": OBJECT + CFN.replace("from ._f import FACTOR", ""),
            "site/o24pkg/_f.py": FACTOR.format(2.0),
            "o24_k": GLUON.format(pkg="o24pkg", body="x * scale(layout)"),
        },
        {"site/o24pkg/_f.py": FACTOR.format(9.0)},
        "o24_k",
    ),
    # 7. the compiler's environment, set in the process or from Python
    "environment-fp-fusion-off": Case(
        {"o17_k": kernel_source("", "x * 3.0 + 1.0")}, {}, "o17_k", env=ENV
    ),
    "environment-f32-default-ieee": Case({"o18_k": DOT}, {}, "o18_k", env=ENV),
    "environment-no-line-info": Case(
        {"o19_k": kernel_source("", "tl.exp(x)")}, {}, "o19_k", env=ENV
    ),
    "knob-fp-fusion-off-from-python": Case(
        {"o20_k": kernel_source("", "x * 3.0 + 1.0")},
        {},
        "o20_k",
        setup="import triton; triton.knobs.language.default_fp_fusion = False",
    ),
}


@pytest.fixture(scope="module")
def three_way(tmp_path_factory):
    return three_way_code(tmp_path_factory.mktemp("witness_more"), CASES)


#: cases still stale, and why
STALE = {
    "triton-semantic-patched": "Triton's own code patched in the process is not in any key",
}


#: cases that are none on a target, and why
NO_CASE = {
    ("hip:gfx942", "libdevice-replaced-same-size-and-mtime"): (
        "TRITON_LIBDEVICE_PATH is NVIDIA's (knobs.nvidia.libdevice_path, read by the NVIDIA "
        "backend alone): Triton's AMD backend links the ocml and ockl of its own lib folder, so "
        "the file changes nothing on gfx942"
    ),
}


@pytest.mark.parametrize(
    "target,name",
    each_target(CASES, {**{(t, n): why for t in TARGETS for n, why in STALE.items()}, **NO_CASE}),
)
def test_a_second_process_gets_what_a_compile_of_its_code_gives(three_way, target, name):
    assert_second_gets_a_compile(three_way, name, target)


# -- a warm process: values changed in place between two lowerings ------------------------------
CLAIMS = """
__name__ = "math"  # (what the functions defined below say of their module)
import triton

FACTOR = 2.0


@triton.constexpr_function
def scale(t):
    return FACTOR
"""
WARM = """
import collections

import triton
import triton.language as tl

FACTOR = 2.0
QUEUE = collections.deque([2.0])
ORDERED = collections.OrderedDict(a=2.0)


@triton.constexpr_function
def queued(t):
    return QUEUE[0] * ORDERED["a"]


class Scale:
    __module__ = "operator"  # (a class of the standard library, it says)

    def __mul__(self, other):
        return FACTOR * other


S = tl.constexpr(Scale())


@triton.jit
def kernel(x_ptr, n, out_ptr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = x * (S * 1.0) * scale(x.type) * queued(x.type)
    tl.store(out_ptr + offs, y, mask=mask)
"""
WARM_CHANGES = {
    "operator-reads-a-global": lambda m, claims: setattr(m, "FACTOR", 9.0),
    "call-not-made-again-reads-a-global": lambda m, claims: setattr(claims, "FACTOR", 9.0),
    "call-not-made-again-reads-a-deque": lambda m, claims: m.QUEUE.appendleft(9.0),
    "call-not-made-again-reads-an-ordered-dict": lambda m, claims: m.ORDERED.update(a=9.0),
}


@pytest.mark.parametrize("change", WARM_CHANGES.values(), ids=WARM_CHANGES.keys())
@pytest.mark.parametrize("target", TARGETS)
def test_a_warm_process_embeds_what_its_frontend_reads_now(tmp_path, change, target):
    """After a value an object's operator or a call the witness cannot make again reads
    changed in place, the next lowering embeds what a compile gives now; changed back, the
    first kernel again, from the cache (nothing compiled)."""

    tag = hashlib.sha256(str(tmp_path).encode()).hexdigest()[:8]
    claims = kernel_module(tmp_path, f"witness_claims_{tag}", CLAIMS)  # (named "math" now)
    module = kernel_module(
        tmp_path, f"witness_more_{tag}", f"from witness_claims_{tag} import scale\n" + WARM
    )
    assert_warm_change(module.kernel, tmp_path, lambda: change(module, claims), target)
