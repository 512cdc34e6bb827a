"""What a kernel is compiled from decides which kernel a lowering embeds (bridge.identity.kernel_keys
routes, the read set decides): values Triton's frontend reads through another module, a
constexpr_function or a constexpr object; a warm process that sees a changed global lowers the
new code; a constexpr known only by its address leaves the IR to decide."""

from __future__ import annotations

import hashlib
import json
import threading

import jax
import jax.numpy as jnp
import pytest
import triton.language as tl
from bridge_helpers import kernel_module, machine_code, run_child
from identity_constants import DISTINCT, Tile
from identity_targets import TARGETS, machine_ext
from support import HELPERS

import kernelcache
from bridge.compile import compiler as bridge_compile
from bridge.identity import jit

F32 = jax.ShapeDtypeStruct((4096,), jnp.float32)


# -- across processes ---------------------------------------------------------------------------
CFG = "import triton.language as tl\nOFFSET = tl.constexpr({offset})\n"
KERNELS = """
import kid_cfg as cfg

FACTOR = {factor}


@triton.constexpr_function
def factor():
    return FACTOR


@triton.jit
def through_a_module(x_ptr, n, out_ptr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + cfg.OFFSET, mask=mask)


@triton.jit
def through_a_constexpr_function(x_ptr, n, out_ptr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * factor(), mask=mask)
"""
CHILD = """
import hashlib, json, os, sys
sys.path[:0] = [{path!r}, {tests!r}]
import jax, jax.numpy as jnp
import bridge, kernelcache
from bridge.compile import compiler as bridge_compile
from bridge.lowering import proto
from bridge_helpers import custom_calls, kernels_of, lowered_module
from identity_targets import platform_of
import kid_kernels as K

x = jax.ShapeDtypeStruct((4096,), jnp.float32)
found = {{}}
for target in json.loads(os.environ["KC_TARGETS"]):
    compiles, out = bridge_compile.compile_count(), {{}}
    for name in ("through_a_module", "through_a_constexpr_function"):
        fn = lambda x, k=getattr(K, name): bridge.triton_call(
            x, x.size, kernel=k, out_shape=x, grid=(4,), BLOCK=1024, target=target,
            embed="inline")
        (call,) = custom_calls(lowered_module(fn, x, platform=platform_of(target)))
        # (the machine code embedded: the opaque also names the key of the entry it came from)
        code = [k.module_image.object_file for k in kernels_of(proto.decode_opaque(call["opaque"]))]
        out[name] = hashlib.sha256(b"".join(code)).hexdigest()
    found[target] = {{"opaques": out, "compiles": bridge_compile.compile_count() - compiles}}
print(json.dumps(found))
"""


@pytest.mark.parametrize("target", TARGETS)
def test_values_read_through_a_module_or_a_constexpr_function_are_checked(runs, target):
    """A constexpr read as another module's attribute, and a plain global read by a
    constexpr_function: changed between two processes sharing a root, the second process
    compiles the new code (Triton's cache_key sees neither change)."""
    tmp_path = runs.dir
    src = tmp_path / "src"
    src.mkdir(exist_ok=True)
    child = CHILD.format(path=str(src), tests=str(HELPERS))

    def write(offset: str, factor: str) -> None:
        (src / "kid_cfg.py").write_text(CFG.format(offset=offset))
        (src / "kid_kernels.py").write_text(
            "import triton\nimport triton.language as tl\n" + KERNELS.format(factor=factor)
        )

    def run(root: str):
        return runs.child(child, KERNELCACHE_DIR=root, PYTHONDONTWRITEBYTECODE="1")[target]

    shared = str(tmp_path / "shared")
    write("1.0", "2.0")
    first = run(shared)
    assert first["compiles"] == 2
    write("9.0", "2.0")  # the other module's constexpr
    second = run(shared)
    assert second["compiles"] == 1
    assert second["opaques"]["through_a_module"] != first["opaques"]["through_a_module"]
    assert (
        second["opaques"]["through_a_constexpr_function"]
        == first["opaques"]["through_a_constexpr_function"]
    )
    write("9.0", "5.0")  # the constexpr_function's global
    third = run(shared)
    assert third["compiles"] == 1
    assert (
        third["opaques"]["through_a_constexpr_function"]
        != first["opaques"]["through_a_constexpr_function"]
    )
    fresh = run(str(tmp_path / "fresh"))  # what a compile of the same code gives
    assert fresh["compiles"] == 2 and fresh["opaques"] == third["opaques"]


# -- inside one warm process --------------------------------------------------------------------
WARM_CFG = "import triton.language as tl\nOFFSET = tl.constexpr(1.0)\n"
WARM = """
import {cfg} as cfg

SCALE = tl.constexpr(2.0)
TABLE = [1.0, 2.0]


@triton.constexpr_function
def first_of_table():
    return TABLE[0]


@triton.jit
def plus_one(x):
    return x + 1.0


@triton.jit
def plus_two(x):
    return x + 2.0


helper = plus_one


@triton.jit
def kernel(x_ptr, n, out_ptr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask) * SCALE + cfg.OFFSET
    tl.store(out_ptr + offs, helper(x) * first_of_table(), mask=mask)
"""
CHANGES = {
    "constexpr-global": lambda m, cfg: setattr(m, "SCALE", tl.constexpr(3.0)),
    "module-attribute": lambda m, cfg: setattr(cfg, "OFFSET", tl.constexpr(9.0)),
    "helper-rebound": lambda m, cfg: setattr(m, "helper", m.plus_two),
    "list-edited-in-place": lambda m, cfg: m.TABLE.__setitem__(0, 4.0),
}


@pytest.mark.parametrize("change", CHANGES.values(), ids=CHANGES.keys())
@pytest.mark.parametrize("target", TARGETS)
def test_a_warm_process_lowers_the_code_as_it_is_now(tmp_path, change, target):
    """After a global, another module's attribute, a helper or a list the frontend reads
    changed, the next lowering in the same process embeds what a compile of the code as it is
    now gives (as Triton's launcher refuses a kernel whose globals changed)."""
    tag = hashlib.sha256(str(tmp_path).encode()).hexdigest()[:8]
    cfg = kernel_module(tmp_path, f"kid_warm_cfg_{tag}", WARM_CFG)
    module = kernel_module(tmp_path, f"kid_warm_{tag}", WARM.format(cfg=cfg.__name__))
    root = tmp_path / "root"
    before = machine_code(module.kernel, root, target=target)
    assert machine_code(module.kernel, root, target=target) == before  # (warm: the same)
    change(module, cfg)
    after = machine_code(module.kernel, root, target=target)
    assert after != before
    assert machine_code(module.kernel, tmp_path / "fresh", target=target) == after


# -- constexpr objects --------------------------------------------------------------------------
OBJECTS = """
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.language.core import _aggregate as aggregate


def Scheduler(GROUP):
    # a class made per group size, as Gluon's persistent-matmul tutorial makes its schedulers
    GROUP = gl.constexpr(GROUP)

    @aggregate
    class SchedulerImpl:
        start: gl.tensor

        @gluon.jit
        def scale(x):
            return x * GROUP

    return SchedulerImpl


class Hidden:
    def __init__(self, k):
        self.k = k

    def __repr__(self):
        return "Hidden"


@gluon.jit
def gluon_kernel(x_ptr, n, out_ptr, Impl: gl.constexpr, BLOCK: gl.constexpr, TPW: gl.constexpr):
    layout: gl.constexpr = gl.BlockedLayout([4], [TPW], [gl.num_warps()], [0])
    offs = gl.program_id(0) * BLOCK + gl.arange(0, BLOCK, layout=layout)
    mask = offs < n
    gl.store(out_ptr + offs, Impl.scale(gl.load(x_ptr + offs, mask=mask)), mask=mask)


@triton.jit
def triton_kernel(x_ptr, n, out_ptr, C: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * C.k, mask=mask)


@triton.jit
def tagged_kernel(x_ptr, n, out_ptr, TAG: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask), mask=mask)
"""


@pytest.fixture(scope="module")
def objects(tmp_path_factory):
    return kernel_module(tmp_path_factory.mktemp("objects"), "kid_objects", OBJECTS)


@pytest.mark.parametrize("case", ["gluon-aggregate-classes", "objects-with-hidden-fields"])
@pytest.mark.parametrize("target", TARGETS)
def test_constexpr_objects_that_print_alike_get_their_own_kernels(tmp_path, objects, case, target):
    if case == "gluon-aggregate-classes":
        kernel, one, other = objects.gluon_kernel, objects.Scheduler(1), objects.Scheduler(8)
        assert str(one) == str(other)  # what Triton's key holds of them
        name = "Impl"
    else:
        kernel, one, other = objects.triton_kernel, objects.Hidden(2.0), objects.Hidden(3.0)
        name = "C"
    shared = tmp_path / "shared"
    compiles = bridge_compile.compile_count()
    first = machine_code(kernel, shared, target=target, **{name: one})
    second = machine_code(kernel, shared, target=target, **{name: other})
    assert bridge_compile.compile_count() - compiles == 2 and first != second
    assert machine_code(kernel, tmp_path / "fresh", target=target, **{name: other}) == second
    # each is stored under its own key: lowered again, nothing compiles, the same bytes
    compiles = bridge_compile.compile_count()
    again = {name: objects.Scheduler(1) if name == "Impl" else one}
    assert machine_code(kernel, shared, target=target, **again) == first
    assert bridge_compile.compile_count() == compiles


@pytest.mark.parametrize("target", TARGETS)
def test_a_constexpr_known_only_by_its_address_leaves_the_ir_to_decide(tmp_path, objects, target):
    """An object whose state no field shows (a lock) has no description: the read set that
    found it is partial and ends with the IR, so a lookup runs the frontend and compares; the
    kernel is stored once and found again without a compile; the call's lowering (which has no
    key) is not stored."""
    root = tmp_path / "root"
    compiles = bridge_compile.compile_count()
    first = machine_code(objects.tagged_kernel, root, target=target, TAG=threading.Lock())
    second = machine_code(objects.tagged_kernel, root, target=target, TAG=threading.Lock())
    assert first == second
    assert bridge_compile.compile_count() - compiles == 1  # (the second lowering hit)
    ext = machine_ext(target)
    assert len(list(root.glob(f"*.{ext}"))) == 1 and not list(root.glob("*.lowering"))
    (entry,) = [kernelcache.Cache(str(root)).get(p.stem, ext) for p in root.glob(f"*.{ext}")]
    reads = json.loads(entry.meta["reads"])
    assert any("lock" in why for why in reads["partial"]) and reads["rows"][-1][1] == "ir"


def test_constants_that_differ_are_described_apart():
    found = [repr(jit.constant(v)) for v in DISTINCT]
    assert len(set(found)) == len(found)


def test_a_constant_is_described_alike_in_every_process(tmp_path):
    code = f"""
import json, sys
sys.path.insert(0, {str(HELPERS)!r})
from bridge.identity import jit
import identity_constants as T
print(json.dumps([repr(jit.constant(v)) for v in T.DISTINCT if not callable(v)]
                 + [repr(jit.constant(T.maker(1)))]))
"""
    first = run_child(code, PYTHONHASHSEED="1")
    assert run_child(code, PYTHONHASHSEED="2") == first


def test_a_constant_known_only_by_its_address_is_undescribable():
    with pytest.raises(ValueError, match="lock has no description"):
        jit.constant(threading.Lock())
    with pytest.raises(ValueError, match="Tile has no description"):
        jit.constant(Tile(threading.Lock(), 1))  # (a field of one)


class Pickled:
    __slots__ = ("k",)

    def __init__(self, k):
        self.k = k


def test_pickling_an_object_does_not_change_its_description():
    """``pickle`` caches ``__slotnames__`` on a class the first time it pickles an instance:
    that is not the class's behaviour, and not part of its description."""
    import pickle

    before = repr(jit.constant(Pickled(3)))
    pickle.dumps(Pickled(3))
    assert "__slotnames__" in vars(Pickled)
    assert repr(jit.constant(Pickled(3))) == before
