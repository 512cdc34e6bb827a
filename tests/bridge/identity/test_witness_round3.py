"""Three-way attacks (:mod:`three_way`) on values an installed package reaches by ways the
code's names do not show: a ``constexpr_function`` that imports when it runs, finds a module
through ``__import__`` or ``sys.modules``, reads a file, a submodule's attribute, a property, a
cached function or a variable through an ``environ`` it imported; a module's ``__getattr__``
(PEP 562) supplying a constant or a helper; a property, ``__class_getitem__`` or a metaclass
computing a value; a Gluon layout and a frozen dataclass built from a sibling module. Each
``constexpr_function`` is given what the frontend cannot hand it again as such (a type, a
tensor, a layout). The warm tests change values in place between two lowerings of one
process.
"""

from __future__ import annotations

import hashlib

import pytest
from bridge_helpers import kernel_module, kernel_source
from identity_targets import TARGETS, each_target
from three_way import Case, assert_second_gets_a_compile, assert_warm_change
from three_way import three_way as three_way_code

FACTOR = "FACTOR = {}\n"


def _lazy(pkg: str, module: str, arg: str, body: str, extra: dict[str, str] | None = None) -> Case:
    """An installed package whose module ``tune`` holds ``module`` (a ``constexpr_function``
    ``scale``), called by the kernel with ``arg``; version B changes the sibling ``_f``."""
    return Case(
        {
            f"site/{pkg}/__init__.py": "",
            f"site/{pkg}/_f.py": FACTOR.format(2.0),
            f"site/{pkg}/tune.py": module.replace("PKG", pkg),
            f"site/{pkg}/k.py": kernel_source(f"from {pkg}.tune import scale", body),
            **(extra or {}),
        },
        {f"site/{pkg}/_f.py": FACTOR.format(9.0)},
        f"{pkg}.k",
    )


IMPORTS = """
import triton

@triton.constexpr_function
def scale(t):
    from ._f import FACTOR
    return FACTOR
"""
IMPORT_CALL = """
import triton

@triton.constexpr_function
def scale(t):
    return __import__("PKG._f", fromlist=["FACTOR"]).FACTOR
"""
SYS_MODULES = """
import sys
import triton
from . import _f  # (imported, so that sys.modules holds it)

@triton.constexpr_function
def scale(t):
    return sys.modules["PKG._f"].FACTOR
"""
FILE = """
import triton

@triton.constexpr_function
def scale(t):
    with open(__file__[: -len("tune.py")] + "s.txt") as f:
        return float(f.read())
"""
SUBMODULE = """
import triton
import PKG._f

@triton.constexpr_function
def scale(t):
    return PKG._f.FACTOR
"""
PROPERTY = """
import triton
from . import _f

class Cfg:
    @property
    def factor(self):
        return _f.FACTOR

CFG = Cfg()

@triton.constexpr_function
def scale(t):
    return CFG.factor
"""
ENVIRON = """
from os import environ
import triton

@triton.constexpr_function
def scale(t):
    return float(environ["R9_SCALE"]) if "R9_SCALE" in environ else 2.0
"""
GETATTR_CONSTANT = """
import triton.language as tl

def __getattr__(name):
    if name == "SCALE":
        from ._f import FACTOR
        return tl.constexpr(FACTOR)
    raise AttributeError(name)
"""
GETATTR_HELPER = """
import triton
import triton.language as tl

@triton.jit
def _exp(x):
    return tl.exp(x)

@triton.jit
def _sin(x):
    return tl.sin(x)

def __getattr__(name):
    if name == "act":
        from ._f import FAST
        return _exp if FAST else _sin
    raise AttributeError(name)
"""
OBJECT_PROPERTY = """
import triton.language as tl
from . import _f

class Cfg:
    @property
    def scale(self):
        return _f.FACTOR

CFG = Cfg()
"""
CLASS_GETITEM = """
from . import _f

class Table:
    def __class_getitem__(cls, n):
        return _f.FACTOR * n
"""
METACLASS = """
from . import _f

class Meta(type):
    def __getattr__(cls, name):
        if name == "SCALE":
            return _f.FACTOR
        raise AttributeError(name)

class Cfg(metaclass=Meta):
    pass
"""
FROZEN = """
import dataclasses
import triton.language as tl
from ._f import FACTOR

@dataclasses.dataclass(frozen=True)
class Cfg:
    scale: float = FACTOR

CFG = Cfg()
"""
GLUON_LAYOUT = """
from triton.experimental.gluon import language as gl
from ._f import FACTOR

LAYOUT_32 = gl.constexpr(gl.BlockedLayout([int(FACTOR) // 2 * 2], [32], [4], [0]))
LAYOUT_64 = gl.constexpr(gl.BlockedLayout([int(FACTOR) // 2 * 2], [64], [4], [0]))
"""
GLUON = """
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
{head}


@gluon.jit
def kernel(x_ptr, n, out_ptr, BLOCK: gl.constexpr, TPW: gl.constexpr):
    layout: gl.constexpr = {layout}
    offs = gl.program_id(0) * BLOCK + gl.arange(0, BLOCK, layout=layout)
    x = gl.load(x_ptr + offs, mask=offs < n)
    gl.store(out_ptr + offs, {body}, mask=offs < n)
"""
BLOCKED = "gl.BlockedLayout([4], [TPW], [4], [0])"


def _installed(pkg: str, init: str, head: str, body: str, b: str = "9.0") -> Case:
    """An installed package whose ``__init__`` holds ``init``, whose sibling ``_f`` version B
    changes, and whose module ``k`` holds the kernel (``head``, ``body``)."""
    return Case(
        {
            f"site/{pkg}/__init__.py": init,
            f"site/{pkg}/_f.py": FACTOR.format(2.0),
            f"site/{pkg}/k.py": kernel_source(head.replace("PKG", pkg), body.replace("PKG", pkg)),
        },
        {f"site/{pkg}/_f.py": FACTOR.format(b)},
        f"{pkg}.k",
    )


CASES: dict[str, Case] = {
    # 1. a constexpr_function given a type or a tensor, reaching a value by no name it spells
    "constexpr-function-given-a-type-imports-when-called": _lazy(
        "r1pkg", IMPORTS, "", "x * scale(x.type)"
    ),
    "constexpr-function-given-a-tensor-imports-when-called": _lazy(
        "r2pkg", IMPORTS, "", "x * scale(x)"
    ),
    "constexpr-function-given-a-type-imports-by-a-call": _lazy(
        "r3pkg", IMPORT_CALL, "", "x * scale(x.type)"
    ),
    "constexpr-function-given-a-type-reads-sys-modules": _lazy(
        "r4pkg", SYS_MODULES, "", "x * scale(x.type)"
    ),
    "constexpr-function-given-a-pointer-type-reads-a-file": Case(
        {
            "site/r5pkg/__init__.py": "",
            "site/r5pkg/s.txt": "2.0",
            "site/r5pkg/tune.py": FILE,
            "site/r5pkg/k.py": kernel_source(
                "from r5pkg.tune import scale", "x * scale(x_ptr.dtype)"
            ),
        },
        {"site/r5pkg/s.txt": "9.0"},
        "r5pkg.k",
    ),
    "constexpr-function-given-a-tensor-reads-a-submodule-attribute": _lazy(
        "r6pkg", SUBMODULE, "", "x * scale(x)"
    ),
    "constexpr-function-given-a-tensor-reads-a-property": _lazy(
        "r7pkg", PROPERTY, "", "x * scale(x)"
    ),
    "constexpr-function-given-a-tensor-reads-an-imported-environ": Case(
        {
            "site/r9pkg/__init__.py": ENVIRON,
            "site/r9pkg/k.py": kernel_source("from r9pkg import scale", "x * scale(x)"),
        },
        {},
        "r9pkg.k",
        env={"R9_SCALE": "9.0"},
    ),
    # 2. a module's __getattr__, a property, __class_getitem__, a metaclass
    "module-getattr-supplies-a-constant": _installed(
        "r10pkg", GETATTR_CONSTANT, "import PKG", "x * PKG.SCALE"
    ),
    "module-getattr-supplies-a-helper": Case(
        {
            "site/r11pkg/__init__.py": GETATTR_HELPER,
            "site/r11pkg/_f.py": "FAST = True\n",
            "site/r11pkg/k.py": kernel_source("import r11pkg", "r11pkg.act(x)"),
        },
        {"site/r11pkg/_f.py": "FAST = False\n"},
        "r11pkg.k",
    ),
    "property-of-a-module-level-object": _installed(
        "r12pkg", OBJECT_PROPERTY, "import PKG", "x * PKG.CFG.scale"
    ),
    "class-getitem-computes-a-constant": _installed(
        "r13pkg", CLASS_GETITEM, "import PKG", "x * PKG.Table[4]"
    ),
    "metaclass-computes-a-class-attribute": _installed(
        "r14pkg", METACLASS, "import PKG", "x * PKG.Cfg.SCALE"
    ),
    "frozen-dataclass-default-from-a-sibling": _installed(
        "r17pkg", FROZEN, "import PKG", "x * PKG.CFG.scale"
    ),
    # 3. Gluon: a layout built from a sibling, a constexpr_function given a layout
    "gluon-layout-from-a-sibling": Case(
        {
            "site/r15pkg/__init__.py": GLUON_LAYOUT,
            "site/r15pkg/_f.py": FACTOR.format(4.0),
            "r15_k": GLUON.format(
                head="from r15pkg import LAYOUT_32, LAYOUT_64",
                layout="LAYOUT_32 if TPW == 32 else LAYOUT_64",
                body="x",
            ),
        },
        {"site/r15pkg/_f.py": FACTOR.format(8.0)},
        "r15_k",
    ),
    "gluon-constexpr-function-given-a-layout-imports-when-called": Case(
        {
            "site/r16pkg/__init__.py": "",
            "site/r16pkg/_f.py": FACTOR.format(2.0),
            "site/r16pkg/tune.py": IMPORTS,
            "r16_k": GLUON.format(
                head="from r16pkg.tune import scale", layout=BLOCKED, body="x * scale(layout)"
            ),
        },
        {"site/r16pkg/_f.py": FACTOR.format(9.0)},
        "r16_k",
    ),
}


@pytest.fixture(scope="module")
def three_way(tmp_path_factory):
    return three_way_code(tmp_path_factory.mktemp("witness_round3"), CASES)


@pytest.mark.parametrize("target,name", each_target(CASES))
def test_a_second_process_gets_what_a_compile_of_its_code_gives(three_way, target, name):
    assert_second_gets_a_compile(three_way, name, target)


# -- a warm process: values changed in place between two lowerings ------------------------------
SUB = """
FACTOR = 2.0
"""
HOLDER = """
import {sub} as inner
"""
CLAIMS = """
__name__ = "math"  # (what the code below says of its module)
import triton

import {holder} as holder


def _make():
    k = 2.0

    @triton.constexpr_function
    def closed(t):
        return k

    def set_k(value):
        nonlocal k
        k = value

    return closed, set_k


closed, set_k = _make()


class Cfg:
    factor = 2.0

    @property
    def scale(self):
        return Cfg.factor


CFG = Cfg()


@triton.constexpr_function
def chained(t):
    return holder.inner.FACTOR * CFG.scale
"""
WARM = """
from {claims} import chained, closed


@triton.jit
def kernel(x_ptr, n, out_ptr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, x * closed(x) * chained(x), mask=mask)
"""
WARM_CHANGES = {
    "closure-cell-rebound": lambda claims, sub: claims.set_k(9.0),
    "attribute-of-a-module-of-a-module-changed": lambda claims, sub: setattr(sub, "FACTOR", 9.0),
    "property-backing-value-changed": lambda claims, sub: setattr(claims.Cfg, "factor", 9.0),
}


@pytest.mark.parametrize("change", WARM_CHANGES.values(), ids=WARM_CHANGES.keys())
@pytest.mark.parametrize("target", TARGETS)
def test_a_warm_process_embeds_what_its_frontend_reads_now(tmp_path, change, target):
    """After a value a call given a tensor reaches (a closure cell, an attribute of a module
    reached through another, what a property returns) changed in place, the next lowering
    embeds what a compile gives now, and a lowering after it the same, from the cache."""

    tag = hashlib.sha256(str(tmp_path).encode()).hexdigest()[:8]
    sub = kernel_module(tmp_path, f"witness_r3_sub_{tag}", SUB)
    holder = kernel_module(tmp_path, f"witness_r3_holder_{tag}", HOLDER.format(sub=sub.__name__))
    claims = kernel_module(  # (named "math" now)
        tmp_path, f"witness_r3_claims_{tag}", CLAIMS.format(holder=holder.__name__)
    )
    module = kernel_module(
        tmp_path, f"witness_r3_{tag}", WARM.format(claims=f"witness_r3_claims_{tag}")
    )
    assert_warm_change(module.kernel, tmp_path, lambda: change(claims, sub), target)


# -- the IR as a read: a kernel the frontend vouches for is still found again -------------------
VOUCHED_CHILD = """
import json, os, sys
sys.path[:0] = [os.environ["WITNESS_SRC"], {tests!r}]
from bridge_helpers import machine_code
from bridge.compile import compiler
import r3_vouched
out = {{}}
for target in json.loads(os.environ["KC_TARGETS"]):
    compiles = compiler.compile_count()
    code = machine_code(r3_vouched.kernel, os.environ["KERNELCACHE_DIR"], target=target)
    out[target] = [[code.hex()[:64]], compiler.compile_count() - compiles]
print(json.dumps(out))
"""


@pytest.mark.parametrize("target", TARGETS)
def test_a_kernel_its_frontend_vouches_for_is_found_again_without_a_compile(runs, target):
    """A kernel whose read set is partial (a constexpr_function given a tensor) is checked by the
    IR its frontend gives: another process finds it in the cache and compiles nothing."""
    from support import HELPERS

    src = runs.dir / "src"
    src.mkdir(exist_ok=True)
    (src / "r3_vouched.py").write_text(
        kernel_source("@triton.constexpr_function\ndef scale(t):\n    return 2.0\n", "x * scale(x)")
    )
    child = VOUCHED_CHILD.format(tests=str(HELPERS))
    env = {"KERNELCACHE_DIR": str(runs.dir / "root"), "WITNESS_SRC": str(src)}
    first, compiles = runs.child(child, **env)[target]
    assert compiles == 1
    assert runs.child(child, **env)[target] == [first, 0]
