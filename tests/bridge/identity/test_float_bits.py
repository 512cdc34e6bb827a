"""A float in a key is described by its bits (bridge.identity.static_reads.plain_text):
``repr`` shows every NaN as ``nan``, whatever its sign, and a NaN given as a constexpr reaches
the machine code bit for bit. A kernel lowered with a NaN and with the NaN of the other sign
gets two kernels under two keys, in one process and in two processes sharing a root.
"""

from __future__ import annotations

import hashlib
import math
import struct

import pytest
from bridge_helpers import kernel_module, kernel_source, machine_code
from identity_targets import TARGETS, machine_ext
from support import HELPERS

from bridge.compile import compiler as bridge_compile
from bridge.identity import jit, static_reads
from bridge.lowering import lowering_keys

NAN = float("nan")
NEGATIVE_NAN = -NAN
#: the kernel: whatever it loads, it stores the constexpr S (``x * 0.0`` is a NaN for an
#: infinite or NaN x, so no compiler folds it away); the code holds S's bits
KERNEL = kernel_source("", "x * 0.0 + S", "S: tl.constexpr, ")


def test_the_two_nans_are_told_apart():
    assert math.copysign(1.0, NEGATIVE_NAN) == -1.0 and repr(NAN) == repr(NEGATIVE_NAN)
    assert jit.constant(NAN) != jit.constant(NEGATIVE_NAN)
    assert jit.constant((1.0, NAN)) != jit.constant((1.0, NEGATIVE_NAN))
    assert jit.constant(complex(0.0, NAN)) != jit.constant(complex(0.0, NEGATIVE_NAN))
    assert jit.constant(0.0) != jit.constant(-0.0)
    canon = lowering_keys._canon
    assert canon(NAN, {}) != canon(NEGATIVE_NAN, {})
    # a code object's constants (folded at compile time: inf * 0 is a NaN)
    one = compile("def f():\n    return 1e400 * 0\n", "<one>", "exec")
    other = compile("def f():\n    return -(1e400 * 0)\n", "<other>", "exec")
    (f_one,) = [c for c in one.co_consts if hasattr(c, "co_code")]
    (f_other,) = [c for c in other.co_consts if hasattr(c, "co_code")]
    assert repr(f_one.co_consts) == repr(f_other.co_consts)
    assert static_reads.code_facts(f_one)[0] != static_reads.code_facts(f_other)[0]


def test_plain_text_is_repr_but_for_floats():
    for value in (1, -1, "1.0", b"x", True, None, "float:0"):
        assert static_reads.plain_text(value) == repr(value)
    assert static_reads.plain_text(2.0) == "float:" + struct.pack("<d", 2.0).hex()
    assert static_reads.plain_text(
        "float:" + struct.pack("<d", 2.0).hex()
    ) != static_reads.plain_text(2.0)
    assert static_reads.plain_text(frozenset({NAN, 1})) == static_reads.plain_text(
        frozenset({1, NAN})
    )


@pytest.mark.parametrize("target", TARGETS)
def test_a_nans_sign_gives_another_kernel_in_one_process(tmp_path, target):
    """The same kernel with S=nan and S=-nan, one after the other into one root: two compiles,
    two kernel keys, each the code a fresh root compiles; again, both from the cache."""
    tag = hashlib.sha256(str(tmp_path).encode()).hexdigest()[:8]
    module = kernel_module(tmp_path, f"nan_sign_{tag}", KERNEL)
    root = tmp_path / "root"
    before = bridge_compile.compile_count()
    positive = machine_code(module.kernel, root, target=target, S=NAN)
    negative = machine_code(module.kernel, root, target=target, S=NEGATIVE_NAN)
    assert bridge_compile.compile_count() == before + 2
    assert positive != negative
    assert len(list(root.glob(f"*.{machine_ext(target)}"))) == 2
    assert (
        machine_code(module.kernel, tmp_path / "fresh", target=target, S=NEGATIVE_NAN) == negative
    )
    compiles = bridge_compile.compile_count()
    assert machine_code(module.kernel, root, target=target, S=NAN) == positive
    assert machine_code(module.kernel, root, target=target, S=NEGATIVE_NAN) == negative
    assert bridge_compile.compile_count() == compiles


CHILD = """
import hashlib, json, os, sys
sys.path[:0] = [{path!r}, {tests!r}]
from bridge.compile import compiler
from bridge_helpers import machine_code
from identity_targets import machine_ext
import nan_sign_k as mod

sign = float(os.environ["NAN_SIGN"])
s = float("nan") if sign > 0 else -float("nan")
root = os.environ["KERNELCACHE_DIR"]
out = {{}}
for target in json.loads(os.environ["KC_TARGETS"]):
    compiles = compiler.compile_count()
    code = machine_code(mod.kernel, root, target=target, S=s)
    ext = "." + machine_ext(target)
    keys = sorted(n.split(".")[0] for n in os.listdir(root) if n.endswith(ext))
    out[target] = [hashlib.sha256(code).hexdigest(), compiler.compile_count() - compiles, keys]
print(json.dumps(out))
"""


@pytest.mark.parametrize("first,second", [("1", "-1"), ("-1", "1")])
@pytest.mark.parametrize("target", TARGETS)
def test_a_nans_sign_gives_another_kernel_across_processes(runs, first, second, target):
    """Process 1 lowers the kernel with one NaN into root R; process 2, with the NaN of the
    other sign, from R: it compiles, under another key, what a fresh root compiles."""
    src = runs.dir / "src"
    src.mkdir(exist_ok=True)
    (src / "nan_sign_k.py").write_text(KERNEL)
    child = CHILD.format(path=str(src), tests=str(HELPERS))

    def run(root: str, sign: str) -> list:
        return runs.child(child, KERNELCACHE_DIR=str(runs.dir / root), NAN_SIGN=sign)[target]

    one = run("R", first)
    two = run("R", second)
    fresh = run("fresh", second)
    assert one[1] == 1 and two[1] == 1
    assert two[0] != one[0] and two[0] == fresh[0]
    assert len(two[2]) == 2 and fresh[2][0] in two[2] and one[2][0] in two[2]
    assert run("R", first)[:2] == [one[0], 0]
