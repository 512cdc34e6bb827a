"""A read set checked once per lowering of a program (``read_sets.stale``'s ``seen``): calls of
one kernel in one program check its reads once, calls given other objects check them again, and
a later lowering checks them anew, so a change between two lowerings is found."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from bridge_helpers import custom_calls, kernel_module, lowered_module
from identity_targets import TARGETS, platform_of

import bridge
import kernelcache
from bridge.compile import compiler
from bridge.readsets import read_sets
from bridge.vendors.backends import make_backend
from bridge.vendors.targets import parse_target

#: a JIT function given to the kernel (two modules of this source hold two objects of it)
HELPER = """
@triton.jit
def times_two(x):
    return x * 2.0
"""
SOURCE = (
    HELPER
    + """
SCALE = tl.constexpr(2.0)

@triton.jit
def kernel(x_ptr, n, out_ptr, f: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n)
    tl.store(out_ptr + offs, f(x) * SCALE, mask=offs < n)
"""
)


@pytest.fixture
def checks(monkeypatch):
    """The read sets :func:`read_sets.check` is asked to check (its calls, in order)."""
    made: list[str] = []
    check = read_sets.check

    def counted(text, *args, **kwargs):
        made.append(text)
        return check(text, *args, **kwargs)

    monkeypatch.setattr(read_sets, "check", counted)
    return made


def _program(module, root, functions, target):
    """A program calling ``module.kernel`` once per function of ``functions`` (its ``f``), each
    call on a vector of another size (so each is a call of its own, with a key of its own),
    lowered for ``target``."""

    def fn(*xs):
        return [
            bridge.triton_call(
                x,
                x.size,
                kernel=module.kernel,
                out_shape=x,
                grid=(1,),
                f=f,
                BLOCK=1024,
                target=target,
                embed="inline",
                cache=kernelcache.Cache(str(root)),
            )
            for x, f in zip(xs, functions, strict=True)
        ]

    return fn


def _lower(fn, count, target):
    avals = [jax.ShapeDtypeStruct((1000 + i,), jnp.float32) for i in range(count)]
    return custom_calls(lowered_module(fn, *avals, platform=platform_of(target)))


@pytest.mark.parametrize("target", TARGETS)
def test_calls_of_one_kernel_in_one_program_check_its_reads_once(tmp_path, checks, target):
    module = kernel_module(tmp_path, "once_k", SOURCE)
    root = tmp_path / "cache"
    functions = [module.times_two] * 3
    first = _lower(_program(module, root, functions, target), 3, target)
    checks.clear()  # (the kernel the first call compiled, checked as the others used it)
    compiles = compiler.compile_count()
    again = _lower(_program(module, root, functions, target), 3, target)
    assert compiler.compile_count() == compiles  # three stored lowerings used
    assert [c["opaque"] for c in again] == [c["opaque"] for c in first]
    assert len(checks) == 1


@pytest.mark.parametrize("target", TARGETS)
def test_a_call_given_another_object_checks_again(tmp_path, checks, target):
    module = kernel_module(tmp_path, "again_k", SOURCE)
    root = tmp_path / "cache"
    # one JIT function's source in two modules: one read set (what a read finds is described by
    # content), two objects, so the second call's reads are made again for its own object
    first, second = tmp_path / "a" / "helpers", tmp_path / "b" / "helpers"
    first.mkdir(parents=True), second.mkdir(parents=True)
    functions = [kernel_module(where, "again_h", HELPER).times_two for where in (first, second)]
    _lower(_program(module, root, functions, target), 2, target)
    checks.clear()
    _lower(_program(module, root, functions, target), 2, target)
    assert len(checks) == 2 and checks[0] == checks[1]


@pytest.mark.parametrize("target", TARGETS)
def test_a_change_between_two_lowerings_is_found(tmp_path, checks, target):
    module = kernel_module(tmp_path, "change_k", SOURCE)
    root = tmp_path / "cache"
    functions = [module.times_two] * 2
    _lower(_program(module, root, functions, target), 2, target)
    checks.clear()
    _lower(_program(module, root, functions, target), 2, target)
    compiles = compiler.compile_count()
    module.SCALE = module.tl.constexpr(3.0)
    _lower(_program(module, root, functions, target), 2, target)
    assert compiler.compile_count() > compiles  # the new value's kernel, compiled
    assert len(checks) >= 2  # the second lowering checked the reads anew


@pytest.mark.parametrize("target", TARGETS)
def test_a_partial_read_set_runs_its_frontend_once_per_lowering(
    tmp_path, checks, monkeypatch, target
):
    """A read set that ends with the IR read (a ``constexpr_function`` given a tensor): the
    frontend runs once in a lowering of a program whose calls share it, not once per call."""
    from bridge.identity import frontend

    module = kernel_module(
        tmp_path,
        "partial_k",
        SOURCE.replace("f(x) * SCALE", "f(x) * scale(x)")
        + "\n@triton.constexpr_function\ndef scale(t):\n    return 2.0\n",
    )
    root = tmp_path / "cache"
    functions = [module.times_two] * 3
    _lower(_program(module, root, functions, target), 3, target)
    runs: list[object] = []
    ir_again = frontend.ir_again
    monkeypatch.setattr(frontend, "ir_again", lambda *a: runs.append(a) or ir_again(*a))
    checks.clear()
    compiles = compiler.compile_count()
    _lower(_program(module, root, functions, target), 3, target)
    assert compiler.compile_count() == compiles
    assert '"ir"' in checks[0] and len(checks) == 1 and len(runs) == 1


@pytest.mark.parametrize(
    "operand",
    [
        {"constants": 5},
        {"constants": True},
        {"constants": "param"},
        {"constants": {"a": 1}},
        {"constants": [5, None, ["x"], [1, ["param"]], [1, 2, 3], [[], ["param", ["nested"]]]]},
        {"constants": [[1, ["param", float("nan")]]]},
        ["constants"],
        None,
    ],
)
@pytest.mark.parametrize("target", TARGETS)
def test_a_hostile_read_set_is_a_changed_read_with_the_memo_as_without(operand, target):
    """A read set is read from a shared root: whatever its "ir" or "p" operands hold, the
    memoized check answers what the check answers (the reads differ), and never raises."""
    import json

    text = json.dumps(
        {"format": read_sets.FORMAT, "rows": [[-1, "ir", operand, "x"], [-1, "p", operand, "y"]]}
    )

    def kernel():
        pass

    backend = make_backend(parse_target(target))
    bare = read_sets.stale([text], kernel, {}, backend)
    seen: dict = {}
    assert bare is not None
    assert read_sets.stale([text], kernel, {}, backend, seen) == bare
    assert read_sets.stale([text], kernel, {}, backend, seen) == bare  # (from the memo)
