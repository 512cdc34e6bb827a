"""Triton's pointer and block types as exact values (:mod:`bridge.identity.exact_values`): each
described so that no other type has its description and made again equal, so that a
``constexpr_function`` given one (``scale(x.type)``, ``scale(x_ptr.dtype)``) is a call the
witness makes again, not a partial read set vouched for by running the frontend."""

from __future__ import annotations

import json

import pytest
import triton.language as tl
from bridge_helpers import _lowered_call, kernel_module
from identity_targets import TARGETS, machine_ext

from bridge.identity.namespaces import exact, remake
from kernelcache import Store

#: an address space other than the default (a number before Triton 3.9, a name since)
OTHER_SPACE = 3 if isinstance(tl.pointer_type(tl.float32).address_space, int) else "shared"
TYPES = [
    tl.pointer_type(tl.float32),
    tl.pointer_type(tl.float16),
    tl.pointer_type(tl.float32, OTHER_SPACE),
    tl.pointer_type(tl.float32, const=True),
    tl.pointer_type(tl.pointer_type(tl.int8)),
    tl.block_type(tl.float32, [1024]),
    tl.block_type(tl.float32, [1024, 2]),
    tl.block_type(tl.float32, [2, 1024]),
    tl.block_type(tl.bfloat16, [1024]),
    tl.block_type(tl.pointer_type(tl.float32), [16, 32]),
]


@pytest.mark.parametrize("value", TYPES, ids=str)
def test_a_type_is_made_again_equal_and_of_its_own_class(value):
    again = remake(json.loads(json.dumps(exact(value))))
    assert type(again) is type(value) and again == value and str(again) == str(value)


def test_no_two_types_share_a_description():
    described = [json.dumps(exact(value)) for value in TYPES]
    assert len(set(described)) == len(TYPES)


@pytest.mark.parametrize(
    "desc",
    [
        ["dp", [["d", "fp32"], 1.0, False]],
        ["dp", [["i", "3"], 1, False]],
        ["dp", [["d", "fp32"], 1]],
        ["db", [["d", "fp32"]]],
        ["db", [["d", "fp32"], ["s", "1024"]]],
        ["db", [["i", "1"], ["i", "1024"]]],
        ["db", "fp32"],
    ],
)
def test_a_malformed_description_is_no_value(desc):
    with pytest.raises(ValueError):
        remake(desc)


@pytest.mark.parametrize("target", TARGETS)
def test_a_constexpr_function_given_a_type_is_a_call_made_again(tmp_path, target):
    module = kernel_module(
        tmp_path,
        "typed_kernel",
        """
        @triton.constexpr_function
        def scale(t, p):
            return 2.0 if str(t).endswith("fp32>") and "pointer" in str(p) else 3.0

        @triton.jit
        def kernel(x_ptr, n, out_ptr, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            x = tl.load(x_ptr + offs, mask=offs < n)
            tl.store(out_ptr + offs, x * scale(x.type, x_ptr.dtype), mask=offs < n)
        """,
    )
    root = tmp_path / "cache"
    _lowered_call(module.kernel, root, "inline", {}, target)
    store = Store(root)
    (meta,) = [store.inspect(p.stem).meta for p in root.glob(f"*.{machine_ext(target)}")]
    reads = json.loads(meta["reads"])
    assert reads["partial"] == []
    assert [row[1] for row in reads["rows"]].count("c") == 1
    assert "ir" not in [row[1] for row in reads["rows"]]


def test_every_function_of_gluons_language_has_an_exact_description():
    """Gluon's language wraps Triton's builtins (since Triton 3.9, in modules other than the one
    ``functools.wraps`` names, with an ``inspect.Signature`` beside each): each is described,
    by where Triton defines it or by its code, what it wraps and its signature, so a Gluon
    kernel's read set is whole (partial before, on 3.9: a compile's IR in every process)."""
    import types

    from triton.experimental.gluon import language as gl

    from bridge.identity.exact_values import describe

    functions = {n: v for n, v in vars(gl).items() if type(v) is types.FunctionType}
    assert len(functions) > 20
    assert [n for n, v in functions.items() if describe(v) is None] == []
