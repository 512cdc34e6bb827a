"""Three-way attacks (:mod:`three_way`), round four: values the frontend reaches through Python's
own protocols, which run code of the program or of the standard library where the kernel's text
shows a plain built-in or operator: ``len`` of an Enum whose members a sibling module builds
(in a Triton and a Gluon kernel, as a value and as an unroll count), a metaclass's ``__len__``,
``__index__`` (``tl.static_range``, ``range``) and ``__format__`` (an f-string compared in a
static ``if``), ``int`` of an object whose class defines ``__int__`` or ``__index__``, a
Decimal's arithmetic, which the thread's decimal context rounds (``int``, an f-string, a
comparison: code written in C, which no tracer sees), an f-string of a frozenset (its order is
the process's hash seed's), ``isinstance`` against an ABC whose registrations change (the
application's, an installed package's, the standard library's; given a constexpr, the loaded
tensor or a Gluon layout), a namespace package whose other portion is upgraded, and NaNs of
either sign reaching the kernel in ways tests/bridge/identity/test_float_bits.py does not take
(inside a tuple or a ``constexpr`` given as a keyword, a parameter's default, an installed
package's constexpr global). The warm tests change such values in place between two lowerings
of one process (a list appended to, an ABC registering a class, a global rebound, the decimal
context), in this process or, where the change is to the standard library's or installed code,
in a child process of its own.
"""

from __future__ import annotations

import enum
import hashlib

import pytest
from bridge_helpers import CHOOSE, kernel_module, kernel_source
from bridge_helpers import kernel_statements as kernel
from identity_targets import TARGETS, each_target
from support import HELPERS
from three_way import Case, assert_second_gets_a_compile, assert_warm_change, write
from three_way import three_way as three_way_code

#: a loop unrolled as often as ``{count}`` says: each trip adds code
UNROLLED = """
out = x
for i in {range}({count}):
    out = out * x + i
"""
#: the same, between two products (for Gluon)
CHOOSE_VALUES = """
if {cond}:
    out = x * 2.0
else:
    out = x * 3.0
"""

# -- 1-3. len of an installed Enum whose members a sibling module builds ------------------------
ENUM = """
import enum
from ._f import MEMBERS

Act = enum.Enum("Act", MEMBERS)
"""
TWO = 'MEMBERS = {"RELU": 1, "GELU": 2}\n'
FOUR = 'MEMBERS = {"RELU": 1, "GELU": 2, "SILU": 3, "TANH": 4}\n'


def _enum(pkg: str, module: str, source: str) -> Case:
    """The installed package ``pkg`` whose Enum ``Act`` takes its members from ``_f`` (two,
    four in version B), and the application's kernel ``module`` (``source``)."""
    return Case(
        {f"site/{pkg}/__init__.py": ENUM, f"site/{pkg}/_f.py": TWO, module: source},
        {f"site/{pkg}/_f.py": FOUR},
        module,
    )


# -- 4-6, 9, 10. a metaclass's or a class's protocol methods reading a registry -----------------
#: the application's registry (version B changes it)
REGISTRY = 'ITEMS = ["{first}", "b"]\n'
REGISTRY_B = 'ITEMS = ["{first}", "b", "c", "d"]\n'
#: classes whose protocol methods read the registry: ``REG`` (a metaclass's ``__len__``),
#: ``STAGES`` (a class as a constexpr, its metaclass's ``__index__``), ``MODE`` (its
#: metaclass's ``__format__``), ``OBJ`` (``__int__``), ``IDX`` (``__index__`` only), ``N_OBJ``
#: (an object as a constexpr, its class's ``__index__``)
PROTOCOLS = """
import triton.language as tl
import {reg} as reg


class Meta(type):
    def __len__(cls):
        return len(reg.ITEMS)

    def __index__(cls):
        return len(reg.ITEMS)

    def __format__(cls, spec):
        return reg.ITEMS[0]


class REG(metaclass=Meta):
    pass


STAGES = tl.constexpr(REG)
MODE = tl.constexpr(REG)


class Widened:
    def __int__(self):
        return 2 * len(reg.ITEMS)


class Counted:
    def __index__(self):
        return len(reg.ITEMS)


OBJ = Widened()
IDX = Counted()
N_OBJ = tl.constexpr(Counted())
"""
#: what the kernel does with each, by case name. Python's ``range`` calls ``__index__`` where
#: ``tl.static_range`` unrolls and where kernel code calls ``range`` as a value; a plain
#: ``for i in range(cfg.IDX)`` is no case (Triton refuses a bound that is no int or tensor)
USES = {
    "len-of-a-class-whose-metaclass-reads-a-registry": "out = x * len(cfg.REG)",
    "static-range-of-a-class-whose-metaclass-defines-index": UNROLLED.format(
        range="tl.static_range", count="cfg.STAGES"
    ),
    "f-string-of-a-class-whose-metaclass-defines-format": CHOOSE.format(
        cond='f"{cfg.MODE}" == "fast"'
    ),
    "int-of-an-object-whose-class-defines-int": "out = x * int(cfg.OBJ)",
    "int-of-an-object-whose-class-defines-index": "out = x * int(cfg.IDX)",
    "static-range-of-an-object-whose-class-defines-index": UNROLLED.format(
        range="tl.static_range", count="cfg.N_OBJ"
    ),
    "len-of-range-of-an-object-whose-class-defines-index": UNROLLED.format(
        range="tl.static_range", count="len(range(cfg.IDX))"
    ),
}


def _protocols(tag: str, use: str, installed: bool) -> Case:
    """The registry and the classes reading it (:data:`PROTOCOLS`) as the application's own
    modules or an installed package's, and the application's kernel using them as ``use``
    (a key of :data:`USES`) says; version B changes the registry (its first item, and how
    many)."""
    first = "fast"
    if installed:
        pkg = f"w4pp{tag}"
        files = {
            f"site/{pkg}/__init__.py": "",
            f"site/{pkg}/reg.py": REGISTRY.format(first=first),
            f"site/{pkg}/cfg.py": PROTOCOLS.format(reg=f"{pkg}.reg"),
        }
        b = {f"site/{pkg}/reg.py": REGISTRY_B.format(first="slow")}
        cfg = f"{pkg}.cfg"
    else:
        files = {
            f"w4_regp{tag}": REGISTRY.format(first=first),
            f"w4_cfgp{tag}": PROTOCOLS.format(reg=f"w4_regp{tag}"),
        }
        b = {f"w4_regp{tag}": REGISTRY_B.format(first="slow")}
        cfg = f"w4_cfgp{tag}"
    module = f"w4_kp{tag}"
    files[module] = kernel(f"import {cfg} as cfg", USES[use])
    return Case(files, b, module)


#: a Decimal the application's module holds; how Decimal arithmetic rounds (``+A``) is the
#: thread's decimal context, which version B's module sets
DECIMALS = """
import decimal
import triton.language as tl
import {ctx}  # (sets the decimal context)

A = tl.constexpr(decimal.Decimal(12345))
"""
CONTEXT = "import decimal\n"
CONTEXT_B = "import decimal\n\ndecimal.getcontext().prec = 3\n"


def _decimal(tag: str, stmts: str) -> Case:
    """The application's module ``w4_dec{tag}`` holding a Decimal (:data:`DECIMALS`); version
    B sets the decimal context's precision in the module it imports."""
    ctx, cfg, module = f"w4_ctx{tag}", f"w4_dec{tag}", f"w4_kd{tag}"
    files = {ctx: CONTEXT, cfg: DECIMALS.format(ctx=ctx)}
    files[module] = kernel(f"import {cfg} as cfg", stmts)
    return Case(files, {ctx: CONTEXT_B}, module)


# -- 7, 11. isinstance against an ABC whose registrations change -------------------------------
#: an ABC (the application's or an installed package's); its plug-in module registers a class
ABC = """
import abc


class KIND(abc.ABC):
    pass
"""
PLUG = "from {kinds} import KIND\n\nKIND.register({cls})\n"
TENSOR_PLUG = "import triton.language as tl\nfrom {kinds} import KIND\n\nKIND.register({cls})\n"
#: the standard library's ABC, with a class registered by the application's module
STDLIB_PLUG = (
    "import contextlib\nimport triton.language as tl\n"
    "from triton.experimental.gluon import language as gl\n\n"
    "contextlib.AbstractAsyncContextManager.register({cls})\n"
)


def _abc_case(
    tag: str, cond: str, a: str, b: str, *, where: str, params: str = "", gluon: bool = False
) -> Case:
    """The kernel chooses by ``cond`` (an ``isinstance`` against ``cfg.KIND``); the plug-in
    module registers the class ``a`` with the ABC, ``b`` in version B. ``where``: whose ABC
    (``"app"``, ``"site"``: an installed package's, ``"stdlib"``:
    ``contextlib.AbstractAsyncContextManager``); ``gluon``: a Gluon kernel."""
    module = f"w4_k{tag}"
    if where == "site":
        pkg = f"w4p{tag}"
        init = ABC + "\nfrom . import _plug  # (registers its class)\n"
        plug = TENSOR_PLUG if "tl." in a + b else PLUG
        files = {
            f"site/{pkg}/__init__.py": init,
            f"site/{pkg}/_plug.py": plug.format(kinds=pkg, cls=a),
        }
        changed = {f"site/{pkg}/_plug.py": plug.format(kinds=pkg, cls=b)}
        head = f"import {pkg} as cfg"
    elif where == "app":
        plug = TENSOR_PLUG if "tl." in a + b else PLUG
        files = {
            f"w4_kinds{tag}": ABC,
            f"w4_plug{tag}": plug.format(kinds=f"w4_kinds{tag}", cls=a),
            f"w4_cfg{tag}": f"import w4_plug{tag}  # (registers its class)\n"
            f"from w4_kinds{tag} import KIND\n",
        }
        changed = {f"w4_plug{tag}": plug.format(kinds=f"w4_kinds{tag}", cls=b)}
        head = f"import w4_cfg{tag} as cfg"
    else:
        files = {
            f"w4_plug{tag}": STDLIB_PLUG.format(cls=a),
            f"w4_cfg{tag}": f"import contextlib\nimport w4_plug{tag}  # (registers its class)\n\n"
            "KIND = contextlib.AbstractAsyncContextManager\n",
        }
        changed = {f"w4_plug{tag}": STDLIB_PLUG.format(cls=b)}
        head = f"import w4_cfg{tag} as cfg"
    if gluon:
        head = "import triton.language as tl\n" + head
        files[module] = kernel(head, CHOOSE_VALUES.format(cond=cond), gluon=True)
    else:
        files[module] = kernel(head + "\nV = tl.constexpr(3)\n", CHOOSE.format(cond=cond), params)
    return Case(files, changed, module, params="V=3" if params else "")


# -- 12. a namespace package whose other portion (another distribution) is upgraded -------------
#: the kernel, in the portion installed in the user site; it reaches the other portion's module
NAMESPACE_KERNEL = kernel("from w4ns import consts", "out = x * consts.SCALE")


# -- 13. NaNs of either sign -------------------------------------------------------------------
NANS = "import triton.language as tl\n\nNAN = {sign}float('nan')\nKNAN = tl.constexpr(NAN)\n"
#: the kernel keeps its NaN's bits: ``x * 0.0`` is a NaN for an infinite or NaN ``x``, so no
#: compiler folds the sum away
NAN_DEFAULT = """
import triton
import triton.language as tl
from w4_nan_d import NAN


@triton.jit
def kernel(x_ptr, n, out_ptr, BLOCK: tl.constexpr, S: tl.constexpr = NAN):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, x * 0.0 + S, mask=mask)
"""


def _nan(module: str, sign_a: str, sign_b: str, files: dict[str, str], params: str = "") -> Case:
    """``files``, the kernel's module ``module`` among them; the one named ``w4_nan_*`` (or
    ``_f.py``) holds :data:`NANS` with the sign ``sign_a``, ``sign_b`` in version B; the call
    is given ``params``."""
    (nans,) = [n for n in files if n.startswith("w4_nan") or n.endswith("_f.py")]
    a = {**files, nans: NANS.format(sign=sign_a)}
    return Case(a, {nans: NANS.format(sign=sign_b)}, module, params=params)


CASES: dict[str, Case] = {
    # 1-3. len of an installed Enum whose members a sibling module builds
    "len-of-an-installed-enum-whose-sibling-builds-its-members": _enum(
        "w4p1", "w4_k1", kernel("import w4p1", "out = x * len(w4p1.Act)")
    ),
    "static-range-of-len-of-an-installed-enum": _enum(
        "w4p2",
        "w4_k2",
        kernel("import w4p2", UNROLLED.format(range="tl.static_range", count="len(w4p2.Act)")),
    ),
    "gluon-static-range-of-len-of-an-installed-enum": _enum(
        "w4p3",
        "w4_k3",
        kernel(
            "import w4p3",
            UNROLLED.format(range="gl.static_range", count="len(w4p3.Act)"),
            gluon=True,
        ),
    ),
    # 4-6, 9, 10. protocol methods reading a registry: the application's, an installed package's
    **{
        use + ("-installed" if installed else ""): _protocols(
            f"{i}{'i' if installed else 'a'}", use, installed
        )
        for i, use in enumerate(USES, start=4)
        for installed in (False, True)
    },
    # 9, 6. int(), an f-string and a comparison of a Decimal, which the thread's decimal
    # context rounds
    "int-of-a-decimal-the-applications-context-rounds": _decimal("9", "out = x * int(+cfg.A)"),
    "f-string-of-a-decimal-the-applications-context-formats": _decimal(
        "6", CHOOSE.format(cond='f"{+cfg.A}" == "12345"')
    ),
    "comparison-of-a-decimal-the-applications-context-rounds": _decimal(
        "6b", CHOOSE.format(cond="+cfg.A == 12345")
    ),
    # 6. an f-string of a frozenset: the order of its items is the process's hash seed's
    "f-string-of-a-frozenset-whose-order-the-hash-seed-decides": Case(
        {
            "w4_set6": "import triton.language as tl\n\n"
            'MODES = tl.constexpr(frozenset({"fast", "slow"}))\n',
            "w4_k6s": kernel(
                "import w4_set6 as cfg",
                CHOOSE.format(cond='''f"{cfg.MODES}" == "frozenset({'fast', 'slow'})"'''),
            ),
        },
        {},
        "w4_k6s",
        env={"PYTHONHASHSEED": "2"},  # (items in the order fast, slow; seed 0: slow, fast)
        shared_env={"PYTHONHASHSEED": "0"},
    ),
    # 7. isinstance of a constexpr (a keyword, a module constant) against an ABC
    "isinstance-of-a-keyword-against-the-applications-abc": _abc_case(
        "7a", "isinstance(V, cfg.KIND)", "int", "str", where="app", params="V: tl.constexpr, "
    ),
    "isinstance-of-a-module-constant-against-an-installed-abc": _abc_case(
        "7b", "isinstance(V, cfg.KIND)", "int", "str", where="site"
    ),
    "isinstance-of-a-keyword-against-an-installed-abc": _abc_case(
        "7c", "isinstance(V, cfg.KIND)", "int", "str", where="site", params="V: tl.constexpr, "
    ),
    "isinstance-of-a-constant-against-a-standard-abc-the-application-registers-with": _abc_case(
        "7d", 'isinstance("s", cfg.KIND)', "str", "bytes", where="stdlib"
    ),
    # 11. isinstance of the loaded tensor against an ABC that version B registers tl.tensor with
    "isinstance-of-a-tensor-against-the-applications-abc": _abc_case(
        "11a", "isinstance(x, cfg.KIND)", "int", "tl.tensor", where="app"
    ),
    "isinstance-of-a-tensor-against-an-installed-abc": _abc_case(
        "11b", "isinstance(x, cfg.KIND)", "int", "tl.tensor", where="site"
    ),
    "isinstance-of-a-tensor-against-a-standard-abc-the-application-registers-with": _abc_case(
        "11c", "isinstance(x, cfg.KIND)", "str", "tl.tensor", where="stdlib"
    ),
    "gluon-isinstance-of-a-layout-against-a-standard-abc-the-application-registers-with": (
        _abc_case(
            "11d",
            "isinstance(layout, cfg.KIND)",
            "str",
            "gl.BlockedLayout",
            where="stdlib",
            gluon=True,
        )
    ),
    # 13. NaNs of either sign
    "nan-in-a-tuple-given-as-a-keyword": _nan(
        "w4_k13a",
        "",
        "-",
        {
            "w4_nan_a": "",
            "w4_k13a": kernel("import w4_nan_a", "out = x * 0.0 + S[1]", "S: tl.constexpr, "),
        },
        params="S=(1.0, w4_nan_a.NAN)",
    ),
    "nan-in-a-constexpr-given-as-a-keyword": _nan(
        "w4_k13b",
        "-",
        "",
        {
            "w4_nan_b": "",
            "w4_k13b": kernel("import w4_nan_b", "out = x * 0.0 + S", "S: tl.constexpr, "),
        },
        params="S=w4_nan_b.KNAN",
    ),
    "nan-as-a-parameters-default": _nan(
        "w4_k13c", "", "-", {"w4_nan_d": "", "w4_k13c": NAN_DEFAULT}
    ),
    "nan-as-an-installed-packages-constexpr-from-a-sibling": _nan(
        "w4_k13d",
        "-",
        "",
        {
            "site/w4p13/__init__.py": "from ._f import KNAN\n",
            "site/w4p13/_f.py": "",
            "w4_k13d": kernel("import w4p13", "out = x * 0.0 + w4p13.KNAN"),
        },
    ),
}
#: 12. a namespace package: the kernel's portion in the user site, the other portion (another
#: distribution) in a directory of its own on the import path, upgraded in version B
CASES["constant-of-the-other-portion-of-a-namespace-package"] = Case(
    {
        "site/w4ns/kern.py": NAMESPACE_KERNEL,  # (no __init__.py: a namespace)
        "dist2/w4ns/consts.py": "SCALE = 2.0\n",
    },
    {"dist2/w4ns/consts.py": "SCALE = 9.0\n"},
    "w4ns.kern",
    shared_env={"PYTHONPATH": "{src}/dist2"},
)
CASES["constant-of-an-installed-portion-read-by-a-constexpr-function"] = Case(
    {
        "site/w4ns2/tune.py": "import triton\n\n\n@triton.constexpr_function\n"
        "def scale(t):\n    from w4ns2.consts import SCALE\n\n    return SCALE\n",
        "dist3/w4ns2/consts.py": "SCALE = 2.0\n",
        "w4_k12b": kernel_source("from w4ns2.tune import scale", "x * scale(x)"),
    },
    {"dist3/w4ns2/consts.py": "SCALE = 9.0\n"},
    "w4_k12b",
    shared_env={"PYTHONPATH": "{src}/dist3"},
)


@pytest.fixture(scope="module")
def three_way(tmp_path_factory):
    return three_way_code(tmp_path_factory.mktemp("witness_round4"), CASES)


@pytest.mark.parametrize("target,name", each_target(CASES))
def test_a_second_process_gets_what_a_compile_of_its_code_gives(three_way, target, name):
    assert_second_gets_a_compile(three_way, name, target)


# -- a warm process: values changed in place between two lowerings ------------------------------
def _tag(tmp_path) -> str:
    return hashlib.sha256(str(tmp_path).encode()).hexdigest()[:8]


#: each warm test: the kernel's statements (:data:`USES`), and how the registry changes
#: (``"append"``: an item appended; ``"first"``: its first item replaced)
WARM_REGISTRY = {
    "metaclass-len": (USES["len-of-a-class-whose-metaclass-reads-a-registry"], "append"),
    "metaclass-index-as-an-unroll-count": (
        USES["static-range-of-a-class-whose-metaclass-defines-index"],
        "append",
    ),
    "metaclass-format-in-an-f-string": (
        USES["f-string-of-a-class-whose-metaclass-defines-format"],
        "first",
    ),
    "int-of-an-object-defining-int": (USES["int-of-an-object-whose-class-defines-int"], "append"),
    "int-of-an-object-defining-index": (
        USES["int-of-an-object-whose-class-defines-index"],
        "append",
    ),
    "object-index-as-an-unroll-count": (
        USES["static-range-of-an-object-whose-class-defines-index"],
        "append",
    ),
    "range-of-an-object-defining-index": (
        USES["len-of-range-of-an-object-whose-class-defines-index"],
        "append",
    ),
}


@pytest.mark.parametrize("stmts,how", WARM_REGISTRY.values(), ids=WARM_REGISTRY.keys())
@pytest.mark.parametrize("target", TARGETS)
def test_a_warm_process_embeds_what_a_registry_read_by_protocol_methods_gives_now(
    tmp_path, stmts, how, target
):
    """A registry list that a metaclass's ``__len__``, ``__index__`` or ``__format__``, or an
    object's ``__int__`` or ``__index__``, reads is changed in place (appended to, its first
    item replaced): the next lowering embeds what a compile gives now."""
    tag = _tag(tmp_path)
    reg = kernel_module(tmp_path, f"w4_wreg_{tag}", REGISTRY.format(first="fast"))
    kernel_module(tmp_path, f"w4_wcfg_{tag}", PROTOCOLS.format(reg=reg.__name__))
    module = kernel_module(tmp_path, f"w4_wk_{tag}", kernel(f"import w4_wcfg_{tag} as cfg", stmts))

    def change() -> None:
        if how == "append":
            reg.ITEMS.append("c")
        else:
            reg.ITEMS[0] = "slow"

    assert_warm_change(module.kernel, tmp_path, change, target)


@pytest.mark.parametrize("gluon", [False, True], ids=["triton", "gluon"])
@pytest.mark.parametrize("target", TARGETS)
def test_a_warm_process_embeds_what_an_enum_rebound_gives_now(tmp_path, gluon, target):
    """The module attribute holding an Enum is rebound to one with more members: ``len`` of it,
    an unroll count, is what a compile gives now."""
    tag = _tag(tmp_path)
    acts = kernel_module(
        tmp_path, f"w4_wacts_{tag}", "import enum\n\nAct = enum.Enum('Act', 'A B')\n"
    )
    stmts = UNROLLED.format(
        range="gl.static_range" if gluon else "tl.static_range", count="len(acts.Act)"
    )
    source = kernel(f"import {acts.__name__} as acts", stmts, gluon=gluon)
    module = kernel_module(tmp_path, f"w4_wek_{tag}", source)
    assert_warm_change(
        module.kernel, tmp_path, lambda: setattr(acts, "Act", enum.Enum("Act", "A B C D")), target
    )


@pytest.mark.parametrize(
    "cond,cls",
    [("isinstance(V, cfg.KIND)", "int"), ("isinstance(x, cfg.KIND)", "tl.tensor")],
    ids=["a-module-constant", "the-loaded-tensor"],
)
@pytest.mark.parametrize("target", TARGETS)
def test_a_warm_process_embeds_what_an_abc_registering_a_plugin_gives_now(
    tmp_path, cond, cls, target
):
    """A plug-in registers a class with the application's ABC between two lowerings: the
    kernel choosing by ``isinstance`` against it is what a compile gives now."""
    import triton.language as tl

    tag = _tag(tmp_path)
    kinds = kernel_module(tmp_path, f"w4_wkinds_{tag}", ABC)
    head = f"import {kinds.__name__} as cfg\nV = tl.constexpr(3)\n"
    module = kernel_module(tmp_path, f"w4_wak_{tag}", kernel(head, CHOOSE.format(cond=cond)))
    registered = {"int": int, "tl.tensor": tl.tensor}[cls]
    assert_warm_change(module.kernel, tmp_path, lambda: kinds.KIND.register(registered), target)


@pytest.mark.parametrize("target", TARGETS)
def test_a_warm_process_embeds_what_a_nan_rebound_gives_now(tmp_path, target):
    """A module's constexpr NaN the kernel reads is rebound to the NaN of the other sign."""
    import triton.language as tl

    tag = _tag(tmp_path)
    nans = kernel_module(tmp_path, f"w4_wnan_{tag}", NANS.format(sign=""))
    module = kernel_module(
        tmp_path,
        f"w4_wnk_{tag}",
        kernel(f"import {nans.__name__} as nans", "out = x * 0.0 + nans.KNAN"),
    )
    assert_warm_change(
        module.kernel,
        tmp_path,
        lambda: setattr(nans, "KNAN", tl.constexpr(-float("nan"))),
        target,
    )


#: a warm process of its own, for changes to the standard library's or installed code: the
#: kernel's module ``W4_MODULE``, changed by ``W4_CHANGE`` (Python run in a namespace holding
#: ``mod``, the kernel's module)
WARM_CHILD = """
import hashlib, json, os, site, sys
from pathlib import Path
sys.path[:0] = [os.environ["WITNESS_SRC"], site.getusersitepackages(), {tests!r}]
from bridge.compile import compiler
from bridge_helpers import machine_code
mod = __import__(os.environ["W4_MODULE"], fromlist=["kernel"])
tmp = Path(os.environ["W4_TMP"])
targets = json.loads(os.environ["KC_TARGETS"])


def code(root, target):
    return hashlib.sha256(machine_code(mod.kernel, tmp / target / root, target=target)).hexdigest()


# (the lowerings of three_way.assert_warm_change, in its order, for each target)
before = {{t: [code("root", t), code("root", t)] for t in targets}}
exec(os.environ["W4_CHANGE"], {{"mod": mod}})
out = {{}}
for t in targets:
    after, fresh = code("root", t), code("fresh", t)
    compiles = compiler.compile_count()
    again = [code("root", t), compiler.compile_count() - compiles]
    out[t] = dict(before=before[t], after=after, fresh=fresh, again=again)
print(json.dumps(out))
"""
WARM_CHILD_CASES = {
    "a-standard-abc-registering-tl-tensor": (
        {
            "w4_wstd_cfg": "import contextlib\n\nKIND = contextlib.AbstractAsyncContextManager\n",
            "w4_wstd_k": kernel(
                "import w4_wstd_cfg as cfg", CHOOSE.format(cond="isinstance(x, cfg.KIND)")
            ),
        },
        "w4_wstd_k",
        "import contextlib, triton.language as tl\n"
        "contextlib.AbstractAsyncContextManager.register(tl.tensor)",
    ),
    "an-installed-abc-registering-a-plugin": (
        {
            "site/w4wpkg/__init__.py": ABC,
            "w4_wsite_k": kernel(
                "import w4wpkg as cfg\nV = tl.constexpr(3)\n",
                CHOOSE.format(cond="isinstance(V, cfg.KIND)"),
            ),
        },
        "w4_wsite_k",
        "import w4wpkg\nw4wpkg.KIND.register(int)",
    ),
    "the-decimal-context-rounding-a-constexpr": (
        {
            "w4_wctx": CONTEXT,
            "w4_wdec": DECIMALS.format(ctx="w4_wctx"),
            "w4_wdec_k": kernel("import w4_wdec as cfg", "out = x * int(+cfg.A)"),
        },
        "w4_wdec_k",
        "import decimal\ndecimal.getcontext().prec = 3",
    ),
    "an-installed-enum-rebound": (
        {
            "site/w4wenum/__init__.py": ENUM,
            "site/w4wenum/_f.py": TWO,
            "w4_wenum_k": kernel(
                "import w4wenum",
                UNROLLED.format(range="tl.static_range", count="len(w4wenum.Act)"),
            ),
        },
        "w4_wenum_k",
        "import enum, w4wenum\nw4wenum.Act = enum.Enum('Act', 'A B C D')",
    ),
}


@pytest.mark.parametrize("files,module,change", WARM_CHILD_CASES.values(), ids=WARM_CHILD_CASES)
@pytest.mark.parametrize("target", TARGETS)
def test_a_warm_process_of_its_own_embeds_what_a_change_gives_now(
    runs, files, module, change, target
):
    """As the warm tests above, in a child process (the change is to the standard library's
    ABC or decimal context, or to installed code): the lowering after the change is what a
    compile gives now, and the one after it the same, from the cache."""
    write(runs.dir, files)
    out = runs.child(
        WARM_CHILD.format(tests=str(HELPERS)),
        PYTHONDONTWRITEBYTECODE="1",
        PYTHONUSERBASE=str(runs.dir / "user"),
        WITNESS_SRC=str(runs.dir / "src"),
        W4_MODULE=module,
        W4_TMP=str(runs.dir / "warm"),
        W4_CHANGE=change,
    )[target]
    (before, same), after, fresh = out["before"], out["after"], out["fresh"]
    assert before == same
    assert fresh != before, "the change does not change the kernel: not a case"
    assert after == fresh, "the warm process embedded the kernel of before the change"
    assert out["again"] == [after, 0]
