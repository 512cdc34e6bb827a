"""No wrong launch, by construction: whatever changes what Triton's frontend compiles changes
the kernel's key (and the stored lowering's), or what its read set finds (or, a partial read
set, the IR it ends with).

The three-way test: process 1 lowers version A of some code into root R; process 2 lowers
version B from R; process 3 lowers version B into a fresh root. Process 2 must embed what
process 3 compiled (a compile of B), and process 1 something else (the change matters). Each
case is a family of change an analysis of the kernel's Python code can miss: a module read by
a kernel and its helper, values the frontend gets by running code (properties, a module's
``__getattr__``, ``getattr`` with a constexpr name, ``globals()``), constexpr objects (a frozen
dataclass whose method reads a module, an enum whose method changes, a plain function,
``functools.partial``), the compiler's environment (a knob's variable read by a backend, a knob
set from Python, ``PTXAS_OPTIONS``). The cases of all families run in the same three
processes (one lowering each).
"""

from __future__ import annotations

import hashlib
import json
import textwrap
from dataclasses import dataclass, field

import pytest
import triton.language as tl
from bridge_helpers import kernel_module, kernel_source, machine_code, run_child
from identity_targets import TARGETS, each_target, machine_ext
from support import HELPERS


@dataclass(frozen=True)
class Case:
    """Files of version A, those version B replaces, the keywords of the call (Python text
    evaluated in the kernel module), and what version B sets besides: environment variables,
    Python run before lowering (``setup``)."""

    a: dict[str, str]
    b: dict[str, str]
    params: str = ""
    env: dict[str, str] = field(default_factory=dict)
    setup: str = ""


CASES: dict[str, Case] = {}


def case(name: str, a: dict[str, str], b: dict[str, str], params: str = "", **more) -> None:
    CASES[name] = Case(a, b, params, **more)


def kernel(head: str, body: str, params: str = "") -> str:
    return kernel_source(head, body, params)


# 1. a module read by the kernel and by its helper, each for another attribute
SHARED = """
import triton.language as tl
SCALE = tl.constexpr(2.0)
OFFSET = tl.constexpr({offset})
"""
HELPER = """
import triton
import {p}cfg as cfg

@triton.jit
def shift(x):
    return x + cfg.OFFSET
"""
for p in ["m1_"]:
    case(
        "module-read-by-kernel-and-helper",
        {
            f"{p}cfg": SHARED.format(offset="1.0"),
            f"{p}ops": HELPER.format(p=p),
            f"{p}k": kernel(
                f"import {p}cfg as cfg\nfrom {p}ops import shift", "shift(x * cfg.SCALE)"
            ),
        },
        {f"{p}cfg": SHARED.format(offset="9.0")},
    )

# 2. values the frontend obtains by running code
case(
    "property",
    {
        "p2_cfg": """
class Cfg:
    def __init__(self, k):
        self._k = k

    @property
    def scale(self):
        return self._k

CFG = Cfg(2.0)
""",
        "p2_k": kernel("import p2_cfg as cfg", "x * cfg.CFG.scale"),
    },
    {
        "p2_cfg": "class Cfg:\n    def __init__(self, k):\n        self._k = k\n\n    @property\n    def scale(self):\n        return self._k\n\nCFG = Cfg(9.0)\n"
    },
)
case(
    "module-getattr",
    {
        "g2_cfg": "import triton.language as tl\n\ndef __getattr__(name):\n    if name == 'SCALE':\n        return tl.constexpr(2.0)\n    raise AttributeError(name)\n",
        "g2_k": kernel("import g2_cfg as cfg", "x * cfg.SCALE"),
    },
    {
        "g2_cfg": "import triton.language as tl\n\ndef __getattr__(name):\n    if name == 'SCALE':\n        return tl.constexpr(9.0)\n    raise AttributeError(name)\n"
    },
)
OPS = """
import triton

@triton.jit
def relu(x):
    return x * {k}
"""
case(
    "getattr-with-a-constexpr-name",
    {
        "a2_ops": OPS.format(k="2.0"),
        "a2_k": kernel("import a2_ops as ops", "getattr(ops, ACT)(x)", "ACT: tl.constexpr, "),
    },
    {"a2_ops": OPS.format(k="9.0")},
    "ACT='relu'",
)
case(
    "globals-in-a-constexpr-function",
    {
        "c2_k": kernel(
            """
            COEF_1 = 2.0

            @triton.constexpr_function
            def coef(n):
                return globals()[f"COEF_{n}"]
            """,
            "x * coef(1)",
        )
    },
    {
        "c2_k": kernel(
            """
            COEF_1 = 9.0

            @triton.constexpr_function
            def coef(n):
                return globals()[f"COEF_{n}"]
            """,
            "x * coef(1)",
        )
    },
)

# 3. constexpr objects described by content, not by name
DATACLASS = """
import dataclasses
import d3_cfg as cfg

@dataclasses.dataclass(frozen=True)
class Tile:
    m: int

    def scale(self):
        return cfg.SCALE * self.m
"""
case(
    "frozen-dataclass-method-reads-a-module",
    {
        "d3_cfg": "SCALE = 2.0\n",
        "d3_obj": DATACLASS,
        "d3_k": kernel("import d3_obj", "x * C.scale()", "C: tl.constexpr, "),
    },
    {"d3_cfg": "SCALE = 9.0\n"},
    "C=__import__('d3_obj').Tile(1)",
)
ENUM = """
import enum

class Mode(enum.Enum):
    A = 1

    def scale(self):
        return {k}
"""
case(
    "enum-method-body",
    {"e3_obj": ENUM.format(k="2.0"), "e3_k": kernel("", "x * M.scale()", "M: tl.constexpr, ")},
    {"e3_obj": ENUM.format(k="9.0")},
    "M=__import__('e3_obj').Mode.A",
)
case(
    "plain-function-constexpr",
    {
        "f3_obj": "def scale():\n    return 2.0\n",
        "f3_k": kernel("", "x * F()", "F: tl.constexpr, "),
    },
    {"f3_obj": "def scale():\n    return 9.0\n"},
    "F=__import__('f3_obj').scale",
)
case(
    "functools-partial",
    {
        "q3_obj": "import functools, operator\nF = functools.partial(operator.mul, 3.0)\n",
        "q3_k": kernel("", "x * F(1.0)", "F: tl.constexpr, "),
    },
    {"q3_obj": "import functools, operator\nF = functools.partial(operator.mul, 5.0)\n"},
    "F=__import__('q3_obj').F",
)

# 5. a jitted helper reached as a module attribute from another helper
ACT2 = """
import triton

@triton.jit
def act2(x):
    return x * {k}
"""
case(
    "helper-of-a-helper-through-a-module",
    {
        "h5_ops": ACT2.format(k="2.0"),
        "h5_mid": "import triton\nimport h5_ops as ops\n\n@triton.jit\ndef act(x):\n    return ops.act2(x) + 1.0\n",
        "h5_k": kernel("from h5_mid import act", "act(x)"),
    },
    {"h5_ops": ACT2.format(k="9.0")},
)

# 6. the compiler's environment: a variable a backend reads, a knob set from Python, ptxas's
DOT = """
@triton.jit
def kernel(x_ptr, n, out_ptr, BLOCK: tl.constexpr):
    r = tl.arange(0, 32)
    a = tl.load(x_ptr + r[:, None] * 32 + r[None, :])
    tl.store(out_ptr + r[:, None] * 32 + r[None, :], tl.dot(a, a))
"""
MATH = "tl.exp(x) * x + tl.sin(x)"
ENV = {"AMDGCN_ANALYZE_SMALL_TENSOR_RANGE": "1", "PTXAS_OPTIONS": "--def-load-cache=cg"}
case(
    "environment-amd-small-tensor-range",
    {"v6_amd": kernel("", MATH)},
    {},
    env=ENV,
)
case(
    "environment-knob-set-from-python",
    {"v6_knob": "import triton\nimport triton.language as tl\n" + DOT},
    {},
    setup="import triton; triton.knobs.language.fp32_default = 'ieee'",
)
case(
    "environment-ptxas-options",
    {"v6_ptxas": kernel("", MATH)},
    {},
    env={"PTXAS_OPTIONS": "--def-load-cache=cg"},
)

CHILD = """
import hashlib, json, os, sys
sys.path[:0] = [os.environ["EXACT_SRC"], {tests!r}]
import jax, jax.numpy as jnp
import bridge, kernelcache
from bridge.lowering import proto
from bridge_helpers import custom_calls, kernels_of, lowered_module
from identity_targets import platform_of

cases = json.loads(os.environ.pop("EXACT_CASES"))
x = jax.ShapeDtypeStruct((4096,), jnp.float32)
out = {{}}
targets = json.loads(os.environ["KC_TARGETS"])
out = {{target: {{}} for target in targets}}
for name, (module, params, setup) in cases.items():
    try:
        exec(setup, {{}})
        mod = __import__(module)
        kw = eval("dict(" + params + ")", vars(mod))
        for target in targets:
            fn = lambda x: bridge.triton_call(
                x, x.size, kernel=mod.kernel, out_shape=x, grid=(4,), BLOCK=1024, target=target,
                embed="inline", **kw)
            (call,) = custom_calls(lowered_module(fn, x, platform=platform_of(target)))
            code = [k.module_image.object_file if k.HasField("module_image") else k.ptx.encode() for k in kernels_of(proto.decode_opaque(call["opaque"]))]
            out[target][name] = [hashlib.sha256(call["opaque"]).hexdigest(), hashlib.sha256(b"".join(code)).hexdigest()]
    finally:
        import triton
        triton.knobs.language.fp32_default = None
print(json.dumps(out))
"""


def _write(directory, files: dict[str, str]) -> None:
    for module, text in files.items():
        (directory / f"{module}.py").write_text(textwrap.dedent(text))


@pytest.fixture(scope="module")
def three_way(tmp_path_factory):
    """The opaque and machine code of every case on every target: process 1 (A into R), 2 (B
    from R), 3 (B into a fresh root), each lowering every case for every target. Cases that set
    environment variables run in processes of their own, started with them (Triton reads some
    only when it is imported)."""
    base = tmp_path_factory.mktemp("three-way")
    src = base / "src"
    src.mkdir()
    for c in CASES.values():
        _write(src, c.a)
    child = CHILD.format(tests=str(HELPERS))
    groups: dict[str, list[str]] = {}
    for name, c in CASES.items():
        groups.setdefault(json.dumps(sorted(c.env.items())), []).append(name)

    def run(root, names: list[str], with_b: bool):
        cases = {
            n: [
                next(m for m in CASES[n].a if m.endswith("_k") or m.startswith("v6_")),
                CASES[n].params,
                CASES[n].setup if with_b else "",
            ]
            for n in names
        }
        env = dict(CASES[names[0]].env) if with_b else {}
        return run_child(
            child,
            KERNELCACHE_DIR=str(root),
            PYTHONDONTWRITEBYTECODE="1",
            EXACT_SRC=str(src),
            EXACT_CASES=json.dumps(cases),
            KC_TARGETS=json.dumps(TARGETS),
            **env,
        )

    first: dict = {t: {} for t in TARGETS}
    for i, names in enumerate(groups.values()):
        for t, found in run(base / f"R{i}", names, False).items():
            first[t].update(found)
    for c in CASES.values():
        _write(src, c.b)
    second: dict = {t: {} for t in TARGETS}
    fresh: dict = {t: {} for t in TARGETS}
    for i, names in enumerate(groups.values()):
        for into, root in ((second, f"R{i}"), (fresh, f"fresh{i}")):
            for t, found in run(base / root, names, True).items():
                into[t].update(found)
    return first, second, fresh


#: cases that are none on a target (the variable is another vendor's), and why (the AMD
#: case sets PTXAS_OPTIONS too, so it is one on cuda:90 as well)
NO_CASE = {
    ("hip:gfx942", "environment-ptxas-options"): (
        "PTXAS_OPTIONS is given to ptxas, NVIDIA's assembler: Triton's AMD backend runs no "
        "ptxas, so it changes nothing on gfx942"
    ),
}


@pytest.mark.parametrize("target,name", each_target(CASES, NO_CASE))
def test_a_second_process_embeds_what_a_compile_of_the_new_code_gives(three_way, target, name):
    first, second, fresh = (found[target] for found in three_way)
    assert first[name][1] != fresh[name][1], "the change does not change the machine code"
    # (the machine code: the opaque also names the key of the entry it came from, and process
    # 2 keeps its kernel under a key chained from process 1's)
    assert second[name][1] == fresh[name][1]


# -- inside one warm process ---------------------------------------------------------------------
WARM = """
import numpy as np
import {cfg} as cfg

TABLE = np.array([1.0, 2.0])
BYTES = bytearray(b"\\x02")


@triton.constexpr_function
def first_of_table():
    return float(TABLE[0])


@triton.constexpr_function
def first_byte():
    return float(BYTES[0]) * cfg.TABLE[0]


@triton.jit
def shift(x):
    return x + cfg.OFFSET


@triton.jit
def kernel(x_ptr, n, out_ptr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask) * cfg.SCALE * cfg.CFG.scale
    tl.store(out_ptr + offs, shift(x) * first_of_table() * first_byte(), mask=mask)
"""
WARM_CFG = """
SCALE = tl.constexpr(2.0)
OFFSET = tl.constexpr(1.0)


class Cfg:
    def __init__(self, k):
        self._k = k

    @property
    def scale(self):
        return self._k


CFG = Cfg(2.0)


class Tripled(Cfg):
    @property
    def scale(self):
        return self._k * 3.0


class Table(list):
    pass


TABLE = Table([1.0])
"""
WARM_CHANGES = {
    "array-edited-in-place": lambda m, cfg: m.TABLE.__setitem__(0, 4.0),
    "bytearray-edited-in-place": lambda m, cfg: m.BYTES.__setitem__(0, 5),
    "attribute-behind-a-property": lambda m, cfg: setattr(cfg.CFG, "_k", 9.0),
    "module-attribute-read-by-a-helper": lambda m, cfg: setattr(cfg, "OFFSET", tl.constexpr(9.0)),
    "class-changed": lambda m, cfg: setattr(cfg.Cfg, "scale", property(lambda self: self._k * 3.0)),
    "object-class-assigned": lambda m, cfg: setattr(cfg.CFG, "__class__", cfg.Tripled),
    "list-subclass-edited-in-place": lambda m, cfg: cfg.TABLE.__setitem__(0, 7.0),
}


@pytest.mark.parametrize("change", WARM_CHANGES.values(), ids=WARM_CHANGES.keys())
@pytest.mark.parametrize("target", TARGETS)
def test_a_warm_process_lowers_the_code_as_it_is_now(tmp_path, change, target):
    """After a value the frontend reads changed in place (a buffer's bytes, an object's field,
    a module attribute read by a helper, a class), the next lowering in the same process embeds
    what a compile of the code as it is now gives."""
    tag = hashlib.sha256(str(tmp_path).encode()).hexdigest()[:8]
    cfg = kernel_module(
        tmp_path,
        f"exact_warm_cfg_{tag}",
        WARM_CFG,
    )
    module = kernel_module(tmp_path, f"exact_warm_{tag}", WARM.format(cfg=cfg.__name__))
    root = tmp_path / "root"
    before = machine_code(module.kernel, root, target=target)
    assert machine_code(module.kernel, root, target=target) == before  # (warm: the same)
    change(module, cfg)
    after = machine_code(module.kernel, root, target=target)
    assert after != before
    assert machine_code(module.kernel, tmp_path / "fresh", target=target) == after


# -- descriptions: by content, or none --------------------------------------------------------
def _ns(**kw):
    import types

    return types.SimpleNamespace(**kw)


def _cached(k):
    import functools

    @functools.lru_cache
    def f():
        return k

    return f


def _mode(k):
    import enum

    class Mode(enum.Enum):
        A = 1

        def scale(self):
            return k

    return Mode.A


def _point(x):
    import collections

    return collections.namedtuple("Point", "x y")(x, 0)


#: pairs of constexprs the frontend can compile differently, described apart
APART = {
    "partial": lambda: (
        __import__("functools").partial(__import__("operator").mul, 3),
        __import__("functools").partial(__import__("operator").mul, 5),
    ),
    "lru-cached-function": lambda: (_cached(1), _cached(2)),
    "namespace": lambda: (_ns(a=1), _ns(a=2)),
    "enum-method-closure": lambda: (_mode(1), _mode(2)),
    "namedtuple": lambda: (_point(1), _point(2)),
    "bytearray": lambda: (bytearray(b"a"), bytearray(b"b")),
    "int-and-int-enum": lambda: (1, __import__("enum").IntEnum("E", "A").A),
    "ordered-dict": lambda: (
        __import__("collections").OrderedDict(a=1),
        __import__("collections").OrderedDict(a=2),
    ),
    "defaultdict-factory": lambda: (
        __import__("collections").defaultdict(int),
        __import__("collections").defaultdict(float),
    ),
}


@pytest.mark.parametrize("pair", APART.values(), ids=APART.keys())
def test_values_that_compile_apart_are_never_described_alike(pair):
    """Two values the frontend can compile differently get two descriptions, or one of them
    none (a read set that found it is partial: the IR decides)."""
    from bridge.identity.exact_values import describe
    from bridge.identity.namespaces import exact

    one, other = (exact(v) or describe(v) for v in pair())
    assert one is None or other is None or repr(one) != repr(other)


#: constexprs with no description by content: what a read of them finds is opaque
UNDESCRIBABLE = {
    "a-lock": lambda: __import__("threading").Lock(),
    "a-random-generator": lambda: __import__("random").Random(0),
    "a-partial": lambda: __import__("functools").partial(print, 1),
}


@pytest.mark.parametrize("make", UNDESCRIBABLE.values(), ids=UNDESCRIBABLE.keys())
def test_what_holds_state_no_field_shows_has_no_description(make):
    from bridge.identity import jit
    from bridge.identity.exact_values import describe

    assert describe(make()) is None
    with pytest.raises(ValueError, match="no description by content"):
        jit.constant(make())


@pytest.mark.parametrize("target", TARGETS)
def test_a_global_defined_later_that_hides_a_builtin_is_seen(tmp_path, target):
    """A constexpr_function's name that found a builtin finds a global once one is defined:
    the next lowering in the same process embeds the new code."""
    module = kernel_module(
        tmp_path,
        "exact_hidden_builtin",
        """
        @triton.constexpr_function
        def width():
            return float(len("ab"))

        @triton.jit
        def kernel(x_ptr, n, out_ptr, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            x = tl.load(x_ptr + offs, mask=offs < n)
            tl.store(out_ptr + offs, x * width(), mask=offs < n)
        """,
    )
    root = tmp_path / "root"
    before = machine_code(module.kernel, root, target=target)
    assert machine_code(module.kernel, root, target=target) == before
    module.len = lambda s: 7
    after = machine_code(module.kernel, root, target=target)
    assert after != before
    assert machine_code(module.kernel, tmp_path / "fresh", target=target) == after


# -- ordinary kernels are exact ------------------------------------------------------------------
ORDINARY = """
import types

LAZY = types.ModuleType("lazy")  # a module that makes attributes on demand, as some packages do


def _made_on_demand(name):
    if name == "K":
        return tl.constexpr(1.0)
    raise AttributeError(name)


LAZY.__getattr__ = _made_on_demand
LAZY.SCALE = tl.constexpr(2.0)
PLAIN = types.ModuleType("plain")
PLAIN.SCALE = tl.constexpr(2.0)


def shift(x):
    return LAZY


@triton.jit
def documented(x_ptr, n, out_ptr, BLOCK: tl.constexpr):
    \"\"\"Copies (+ shift, when a shift is bound): the docstring names a helper the kernel never
    reads.\"\"\"
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * PLAIN.SCALE, mask=offs < n)


"""


@pytest.mark.parametrize("target", TARGETS)
def test_ordinary_kernels_are_exact(tmp_path, target):
    """A docstring that names a helper, a module's attribute: the read set is complete (no IR
    read: another process hits without the frontend). A module that makes attributes on
    demand (``__getattr__``) runs code of the program when Triton's frontend probes it for its
    own markers (``__triton_builtin__``): a read set that reaches one is partial."""
    import json

    from bridge_helpers import _lowered_call

    from kernelcache.store import Store

    module = kernel_module(tmp_path, "exact_ordinary", ORDINARY)

    def reads(kernel, root):
        _lowered_call(kernel, root, "inline", {}, target)
        (meta,) = [Store(root).inspect(p.stem).meta for p in root.glob(f"*.{machine_ext(target)}")]
        return json.loads(meta["reads"])

    found = reads(module.documented, tmp_path / "root")
    assert found["partial"] == [] and "ir" not in [r[1] for r in found["rows"]]
    module.documented._unsafe_update_src(module.documented.src.replace("PLAIN.SCALE", "LAZY.K"))
    found = reads(module.documented, tmp_path / "lazy")
    assert found["partial"] and found["rows"][-1][1] == "ir"
