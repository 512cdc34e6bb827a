"""The frontend as witness: a cached kernel is used only while what Triton's frontend read to
generate it finds the same now, whatever the key's description of the code trusted.

The three-way test of :mod:`test_exact_identity`, for changes a description by names misses:
process 1 lowers version A into root R, process 2 version B from R, process 3 version B into a
fresh root; process 2 must embed what process 3 compiled, and process 1 something else. Code
installed into a site-packages directory (here the user site of each child, ``PYTHONUSERBASE``)
is what a container image holds: a constant computed at import from a data file or a variable,
a sibling module, a setter, a class attribute. Then what reaches the compiler besides the
kernel (Triton's language functions patched, a ptxas wrapper), code that claims another name,
attributes of functions, values a ``repr`` cannot tell apart. The warm tests change values in
place between two lowerings of one process.
"""

from __future__ import annotations

import hashlib
import os

import pytest
from bridge_helpers import cuda_devices, kernel_module, kernel_source
from identity_targets import TARGETS, each_target
from support import HELPERS
from three_way import Case, assert_second_gets_a_compile, assert_warm_change
from three_way import three_way as three_way_code

CASES: dict[str, Case] = {
    # 1. installed code: what a module computes at import, a sibling module, a setter
    "installed-constant-from-a-data-file": Case(
        {
            "site/w1pkg/__init__.py": """
                import json, os
                import triton.language as tl
                with open(os.path.join(os.path.dirname(__file__), "scale.json")) as f:
                    SCALE = tl.constexpr(json.load(f)["scale"])
            """,
            "site/w1pkg/scale.json": '{"scale": 2.0}',
            "site/w1pkg/k.py": kernel_source("from w1pkg import SCALE", "x * SCALE"),
        },
        {"site/w1pkg/scale.json": '{"scale": 9.0}'},
        "w1pkg.k",
    ),
    "installed-constant-from-a-variable": Case(
        {
            "site/w2pkg/__init__.py": """
                import os
                import triton.language as tl
                SCALE = tl.constexpr(float(os.environ.get("W2PKG_SCALE", "2.0")))
            """,
            "site/w2pkg/k.py": kernel_source("import w2pkg", "x * w2pkg.SCALE"),
        },
        {},
        "w2pkg.k",
        env={"W2PKG_SCALE": "9.0"},
    ),
    "installed-sibling-module": Case(
        {
            "site/w3pkg/__init__.py": "",
            "site/w3pkg/_consts.py": "import triton.language as tl\nSCALE = tl.constexpr(2.0)\n",
            "site/w3pkg/k.py": kernel_source("from ._consts import SCALE", "x * SCALE"),
        },
        {"site/w3pkg/_consts.py": "import triton.language as tl\nSCALE = tl.constexpr(9.0)\n"},
        "w3pkg.k",
    ),
    "installed-setter": Case(
        {
            "site/w4pkg/__init__.py": """
                import triton
                _SCALE = 2.0
                def set_scale(value):
                    global _SCALE
                    _SCALE = value
                @triton.constexpr_function
                def scale():
                    return _SCALE
            """,
            "site/w4pkg/k.py": kernel_source("from w4pkg import scale", "x * scale()"),
        },
        {},
        "w4pkg.k",
        setup="import w4pkg; w4pkg.set_scale(5.0)",
    ),
    "installed-class-attribute-computed-at-import": Case(
        {
            "site/w5pkg/__init__.py": """
                import os
                import triton.language as tl
                class Cfg:
                    SCALE = tl.constexpr(float(open(os.path.join(os.path.dirname(__file__), "s.txt")).read()))
            """,
            "site/w5pkg/s.txt": "2.0",
            "site/w5pkg/k.py": kernel_source("import w5pkg", "x * w5pkg.Cfg.SCALE"),
        },
        {"site/w5pkg/s.txt": "9.0"},
        "w5pkg.k",
    ),
    # 3. what reaches the compiler besides the kernel
    "triton-function-patched": Case(
        {"w6_k": kernel_source("", "tl.exp(x)")},
        {},
        "w6_k",
        setup="import triton.language as tl; tl.exp = tl.exp2",
    ),
    "triton-function-replaced-by-a-jit-function": Case(
        {
            "w7_patch": "import triton\n\n@triton.jit\ndef s(x):\n    return x * 3.0\n",
            "w7_k": kernel_source("", "tl.sigmoid(x)"),
        },
        {},
        "w7_k",
        setup="import triton.language as tl, w7_patch; tl.sigmoid = w7_patch.s",
    ),
    # 4. code that claims another name
    "class-made-by-new-class": Case(
        {
            "w8_obj": "import types\nK = types.new_class('K', (), {}, lambda ns: ns.update(S=2.0))\n",
            "w8_k": kernel_source("", "x * C.S", "C: tl.constexpr, "),
        },
        {"w8_obj": "import types\nK = types.new_class('K', (), {}, lambda ns: ns.update(S=9.0))\n"},
        "w8_k",
        "C=__import__('w8_obj').K",
    ),
    "class-made-by-make-dataclass": Case(
        {
            "w9_obj": "import dataclasses\nD = dataclasses.make_dataclass('D', [('k', float)], namespace={'s': lambda self: 2.0})\n",
            "w9_k": kernel_source("", "x * C.s()", "C: tl.constexpr, "),
        },
        {
            "w9_obj": "import dataclasses\nD = dataclasses.make_dataclass('D', [('k', float)], namespace={'s': lambda self: 9.0})\n"
        },
        "w9_k",
        "C=__import__('w9_obj').D(1.0)",
    ),
    "module-named-like-the-standard-library": Case(
        {
            "statistics": "import triton.language as tl\nSCALE = tl.constexpr(2.0)\n",
            "w10_k": kernel_source("import statistics", "x * statistics.SCALE"),
        },
        {"statistics": "import triton.language as tl\nSCALE = tl.constexpr(9.0)\n"},
        "w10_k",
    ),
    # 5. fields never described: attributes of functions
    "attribute-of-a-function-read-by-a-constexpr-function": Case(
        {
            "w11_cfg": "def tag():\n    pass\n\ntag.scale = 2.0\n",
            "w11_k": kernel_source(
                """
                @triton.constexpr_function
                def scale(f):
                    return f.scale
                """,
                "x * scale(F)",
                "F: tl.constexpr, ",
            ),
        },
        {},
        "w11_k",
        "F=__import__('w11_cfg').tag",
        setup="import w11_cfg; w11_cfg.tag.scale = 9.0",
    ),
    "attribute-of-a-jit-function": Case(
        {
            "w12_k": kernel_source(
                """
                @triton.jit
                def helper(x):
                    return x
                helper.SCALE = tl.constexpr(2.0)
                """,
                "helper(x) * helper.SCALE",
            )
        },
        {},
        "w12_k",
        setup="import triton.language as tl, w12_k; w12_k.helper.SCALE = tl.constexpr(9.0)",
    ),
    # 6. values a repr does not tell apart
    "nan-sign": Case(
        {"w13_k": kernel_source("NAN = tl.constexpr(float('nan'))", "tl.where(x > 0, x, NAN)")},
        {"w13_k": kernel_source("NAN = tl.constexpr(-float('nan'))", "tl.where(x > 0, x, NAN)")},
        "w13_k",
    ),
    "decimal-context": Case(
        {
            "w14_k": kernel_source(
                """
                import decimal
                @triton.constexpr_function
                def third():
                    return float(decimal.Decimal(1) / decimal.Decimal(3))
                """,
                "x * third()",
            )
        },
        {},
        "w14_k",
        setup="import decimal; decimal.getcontext().prec = 3",
    ),
}


@pytest.fixture(scope="module")
def three_way(tmp_path_factory):
    """The machine code each case embeds: process 1 (A into R), 2 (B from R), 3 (B into a
    fresh root). Cases that set variables run in processes of their own."""
    return three_way_code(tmp_path_factory.mktemp("witness"), CASES)


@pytest.mark.parametrize("target,name", each_target(CASES))
def test_a_second_process_gets_what_a_compile_of_its_code_gives(three_way, target, name):
    assert_second_gets_a_compile(three_way, name, target)


# -- a warm process: values changed in place between two lowerings ------------------------------
WARM = """
import collections

import triton
import triton.language as tl


class Holder:
    def __init__(self):
        self.table = collections.OrderedDict(a=2.0)


ORDERED = collections.OrderedDict(a=2.0)
DEFAULT = collections.defaultdict(float, a=2.0)
QUEUE = collections.deque([2.0])
HOLDER = Holder()
SCALE = tl.constexpr(2.0)


@triton.constexpr_function
def ordered():
    return ORDERED["a"]


@triton.constexpr_function
def default():
    return DEFAULT["a"]


@triton.constexpr_function
def queue():
    return QUEUE[0]


@triton.constexpr_function
def held():
    return HOLDER.table["a"]


@triton.jit
def kernel(x_ptr, n, out_ptr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.exp(x) * ordered() * default() * queue() * held() * SCALE
    tl.store(out_ptr + offs, y, mask=mask)
"""
WARM_CHANGES = {
    "ordered-dict": lambda m: m.ORDERED.__setitem__("a", 9.0),
    "defaultdict": lambda m: m.DEFAULT.__setitem__("a", 9.0),
    "deque": lambda m: m.QUEUE.appendleft(9.0),
    "ordered-dict-in-an-object": lambda m: m.HOLDER.table.__setitem__("a", 9.0),
    "constexpr-value-set": lambda m: setattr(m.SCALE, "value", 9.0),
    "triton-function-patched": lambda m: setattr(m.tl, "exp", m.tl.exp2),
}


@pytest.mark.parametrize("change", WARM_CHANGES.values(), ids=WARM_CHANGES.keys())
@pytest.mark.parametrize("target", TARGETS)
def test_a_warm_process_embeds_what_its_frontend_reads_now(tmp_path, monkeypatch, change, target):
    """After a value the frontend reads changed in place, the next lowering in the same
    process embeds what a compile of the code as it is now gives; changed back, the first
    kernel again, from the cache (nothing compiled)."""
    import triton.language as tl

    monkeypatch.setattr(tl, "exp", tl.exp)  # (restored after the test)
    tag = hashlib.sha256(str(tmp_path).encode()).hexdigest()[:8]
    module = kernel_module(tmp_path, f"witness_warm_{tag}", WARM)
    assert_warm_change(module.kernel, tmp_path, lambda: change(module), target)


# -- the compiler's environment ------------------------------------------------------------
ENV_CHILD = """
import hashlib, json, os, sys
sys.path[:0] = [os.environ["WITNESS_SRC"], {tests!r}]
import jax, jax.numpy as jnp
import bridge
from bridge.compile import compiler
from bridge.lowering import proto
from bridge_helpers import custom_calls, kernels_of, lowered_module
from identity_targets import platform_of
exec(os.environ.get("WITNESS_SETUP", ""), {{}})
import w_env_k as mod
x = jax.ShapeDtypeStruct((4096,), jnp.float32)
out = {{}}
for target in json.loads(os.environ["KC_TARGETS"]):
    compiles = compiler.compile_count()
    fn = lambda x: bridge.triton_call(
        x, x.size, kernel=mod.kernel, out_shape=x, grid=(4,), BLOCK=1024, target=target,
        embed="inline")
    (call,) = custom_calls(lowered_module(fn, x, platform=platform_of(target)))
    code = [k.module_image.object_file for k in kernels_of(proto.decode_opaque(call["opaque"]))]
    out[target] = [hashlib.sha256(b"".join(code)).hexdigest(), compiler.compile_count() - compiles]
print(json.dumps(out))
"""


@pytest.fixture
def env_child(runs):
    """Lower the kernel in a fresh process (with a root under the test's folder, variables
    set) for every target: for ``target``, the digest of its machine code and how many
    kernels it compiled."""
    src = runs.dir / "src"
    src.mkdir(exist_ok=True)
    (src / "w_env_k.py").write_text(kernel_source("", "tl.exp(x) * x + tl.sin(x)"))
    child = ENV_CHILD.format(tests=str(HELPERS))

    def run(root, target: str, targets=TARGETS, **env: str) -> tuple[str, int]:
        found = runs.child(
            child,
            KERNELCACHE_DIR=str(runs.dir / root),
            WITNESS_SRC=str(src),
            targets=targets,
            **env,
        )
        code, compiles = found[target]
        return code, compiles

    return run


@pytest.mark.parametrize("target", TARGETS)
def test_device_selection_shares_one_compile_and_debug_does_not(env_child, target):
    """Each rank of a job sees its own device: the kernel compiles once for all of them (and
    an image warmed without the variable serves them); TRITON_DEBUG changes the code, so it
    still has its own kernel."""
    plain, compiles = env_child("R", target)
    assert compiles == 1
    for rank in ("3", "0,1"):
        found = env_child("R", target, CUDA_VISIBLE_DEVICES=rank, HIP_VISIBLE_DEVICES=rank)
        assert found == (plain, 0)
    debug, compiles = env_child("R", target, TRITON_DEBUG="1")
    assert compiles == 1 and debug != plain


def test_a_ptxas_wrapper_is_another_tool(env_child, runs):
    """A wrapper named by TRITON_PTXAS_PATH that adds an option reports ptxas's version but
    compiles other code: the kernel compiled without it is not used with it. (NVIDIA's tool:
    Triton's AMD backend assembles and links in its own library, with no tool to name.)"""
    import triton

    env = {}
    for name in ("ptxas", "ptxas-blackwell"):  # (whichever the installed Triton runs for sm_90)
        real = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)
        wrapper = runs.dir / f"{name}-wrapped"
        wrapper.write_text(
            f'#!/bin/sh\ncase "$1" in --version) exec "{real}" "$@";; esac\n'
            f'exec "{real}" --def-load-cache=cg "$@"\n'
        )
        wrapper.chmod(0o755)
        env[f"TRITON_{name.upper().replace('-', '_')}_PATH"] = str(wrapper)
    cuda = {"target": "cuda:90", "targets": ("cuda:90",)}
    plain, _ = env_child("R", **cuda)
    wrapped, compiles = env_child("R", **cuda, **env)
    assert compiles == 1 and wrapped != plain
    assert env_child("fresh", **cuda, **env) == (wrapped, 1)
    assert env_child("R", **cuda, **env) == (wrapped, 0)


#: a hook rewriting the assembly, for whichever backend compiles: the exp of PTX flushing
#: denormals, or a no-op before the end of the AMDGCN program (every kernel has one)
HOOK = """
import triton
REWRITES = {
    "ptx": ("ex2.approx.f32", "ex2.approx.ftz.f32"),
    "amdgcn": ("\\ts_endpgm", "\\ts_nop 0\\n\\ts_endpgm"),
}
def hook(backend, stages, options, language, capability):
    for stage, (old, new) in REWRITES.items():
        if stage in stages:
            make = stages[stage]
            stages[stage] = lambda src, md, make=make, old=old, new=new: make(src, md).replace(old, new)
triton.knobs.runtime.add_stages_inspection_hook = hook
"""


@pytest.mark.parametrize("target", TARGETS)
def test_a_stages_hook_counts_by_its_code(env_child, target):
    """A hook that rewrites a stage makes the kernel another one; the same hook in another
    process finds it again."""
    plain, _ = env_child("R", target)
    hooked, compiles = env_child("R", target, WITNESS_SETUP=HOOK)
    assert compiles == 1 and hooked != plain
    assert env_child("R", target, WITNESS_SETUP=HOOK) == (hooked, 0)


GPU_KERNEL = """
import collections

import triton
import triton.language as tl

TABLE = collections.OrderedDict(scale=2.0)


@triton.constexpr_function
def scale():
    return TABLE["scale"]


@triton.jit
def kernel(x_ptr, n, out_ptr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * scale(), mask=mask)
"""


@pytest.mark.gpu
@pytest.mark.skipif(not cuda_devices(), reason="needs an NVIDIA GPU")
def test_on_the_gpu_a_warm_process_runs_what_its_code_says_now(tmp_path):
    """On the device: the kernel launched after a value its frontend reads changed in place
    computes with the new value; changed back, with the old one again (from the cache)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    import bridge
    import kernelcache

    tag = hashlib.sha256(str(tmp_path).encode()).hexdigest()[:8]
    module = kernel_module(tmp_path, f"witness_gpu_{tag}", GPU_KERNEL)
    cache = kernelcache.Cache(str(tmp_path / "root"))
    x = jnp.arange(4096, dtype=jnp.float32)

    def run():
        def fn(x):
            return bridge.triton_call(
                x, x.size, kernel=module.kernel, out_shape=x, grid=(4,), BLOCK=1024, cache=cache
            )

        return np.asarray(jax.jit(fn)(x))

    np.testing.assert_allclose(run(), np.asarray(x) * 2.0)
    module.TABLE["scale"] = 9.0
    np.testing.assert_allclose(run(), np.asarray(x) * 9.0)
    module.TABLE["scale"] = 2.0
    np.testing.assert_allclose(run(), np.asarray(x) * 2.0)
