"""Lowerings as cache entries (``bridge.entries.lowerings``): a warm lowering is replayed from one entry,
the module is byte-identical to one built from the kernel entries, and nothing stale is served
after the kernel's source, a jitted dependency, Triton, jaxlib, a setting or a decision changes.

Lowered for cuda on this CPU machine (``embed="ptx"`` under jaxlib < 0.11.1, inline above).
"""

from __future__ import annotations

import struct
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from bridge_helpers import (
    decoded,
    forget_lowerings,
    forget_programs,
    kernel_module,
    kernels_of,
    lowered_module,
)
from test_cli_support import kc, kc_json

import bridge
import kernelcache
from bridge import versions
from bridge.cli import tune
from bridge.compile import ptxisa
from bridge.identity import compiler_identity
from bridge.lowering import lower as bridge_call
from bridge.lowering.configs import FETCHED
from bridge.vendors import backends
from examples import ops

F32 = jax.ShapeDtypeStruct((4096,), jnp.float32)
A = jax.ShapeDtypeStruct((512, 256), jnp.bfloat16)
B = jax.ShapeDtypeStruct((256, 384), jnp.bfloat16)


@pytest.fixture
def cache(tmp_path):
    return kernelcache.Cache(tmp_path / "root", readonly_roots=(), remote="")


def module_text(fn, *avals) -> str:
    return lowered_module(fn, *avals).as_text()


def add(cache, **kw):
    return lambda x, y: ops.add(x, y, target="cuda:90", cache=cache, **kw)


def matmul(cache, **kw):
    return lambda x, y: ops.matmul(x, y, target="cuda:90", cache=cache, **kw)


def entries(root) -> dict[str, int]:
    found: dict[str, int] = {}
    for entry in kc_json(root, "ls")["entries"]:
        found[entry["ext"]] = found.get(entry["ext"], 0) + 1
    return found


@pytest.mark.parametrize("program", ["add", "autotuned"])
def test_a_warm_lowering_is_replayed_byte_identical(cache, assembled, program):
    make, avals = (add, (F32, F32)) if program == "add" else (matmul, (A, B))
    cold = module_text(make(cache), *avals)
    assert len(assembled) == 1
    FETCHED.clear()
    warm = module_text(make(cache), *avals)
    assert len(assembled) == 1  # replayed: no binding, keying or reading of kernels
    assert forget_lowerings(cache.root) >= 1
    FETCHED.clear()
    rebuilt = module_text(make(cache), *avals)
    assert len(assembled) == 2
    assert cold == warm == rebuilt
    assert entries(cache.root)["lowering"] == 1
    assert kc(cache.root, "verify").returncode == 0


def test_an_edited_lowering_entry_is_never_served(cache, assembled):
    cold = module_text(add(cache), F32, F32)
    assert forget_programs(cache.root) == 1  # the call's own entry is read (edited programs:
    (path,) = Path(cache.root).glob("*.lowering")  # tests/test_bridge_programs.py)
    raw = bytearray(path.read_bytes())
    raw[-1] ^= 0xFF
    path.write_bytes(bytes(raw))
    assert module_text(add(cache), F32, F32) == cold
    assert len(assembled) == 2  # the edited entry was refused, the lowering built again
    forget_programs(cache.root)
    assert module_text(add(cache), F32, F32) == cold
    assert len(assembled) == 2  # and kept again


KERNEL = """
SCALE = tl.constexpr({scale})

@triton.jit
def helper(x):
    return x {helper}

@triton.jit{decorator}
def kernel(x_ptr, n, y_ptr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, helper(tl.load(x_ptr + offs, mask=mask)) * SCALE {kernel}, mask=mask)
"""
UNCHANGED = {"kernel": "", "helper": "+ 1.0", "scale": "1.0", "decorator": ""}


def lower_module_kernel(module, cache):
    def fn(x):
        return bridge.triton_call(
            x,
            x.size,
            kernel=module.kernel,
            out_shape=x,
            grid=(x.size // 256,),
            BLOCK=256,
            target="cuda:90",
            cache=cache,
        )

    (call,) = decoded(fn, F32)
    return call


@pytest.mark.parametrize(
    "edit",
    [
        {"kernel": "* 2.0"},
        {"helper": "+ 2.0"},
        {"scale": "2.0"},
        {"decorator": "(do_not_specialize=['n'])"},
    ],
    ids=["source", "jitted-dependency", "constexpr-global", "decorator-setting"],
)
def test_an_edited_kernel_or_dependency_is_lowered_again(tmp_path, cache, assembled, edit):
    name = f"lowerings_kernel_{'_'.join(edit)}"
    first = kernel_module(tmp_path, name, KERNEL.format(**UNCHANGED))
    before = kernels_of(lower_module_kernel(first, cache))[0].ptx
    assert kernels_of(lower_module_kernel(first, cache))[0].ptx == before
    assert len(assembled) == 1
    changed = kernel_module(tmp_path, name, KERNEL.format(**{**UNCHANGED, **edit}))
    after = kernels_of(lower_module_kernel(changed, cache))[0].ptx
    assert len(assembled) == 2 and after != before
    assert entries(cache.root)["lowering"] == 2


def test_values_of_different_types_key_differently():
    """The key holds the ``repr`` of each value's canonical form: values that print alike but
    specialize differently (an int and a bool, a float, a string, an int subclass, a tuple)
    never share a key."""
    import enum

    from bridge.lowering import lowering_keys

    class Flag(enum.IntEnum):
        ON = 1

    values = [1, True, 1.0, "1", Flag.ON, (1,), {"1": 1}, None, 0, False, "", ()]
    shown = [repr(lowering_keys._canon(v, {})) for v in values]
    assert len(set(shown)) == len(values), shown


def test_an_extern_library_is_keyed_by_its_file(tmp_path):
    """A kernel key holds an extern library's content; a lowering key holds its file's identity
    (and, through the compiler's fingerprint, that of the backends' own device libraries)."""
    import os

    from bridge.lowering import lowering_keys

    lib = tmp_path / "lib.bc"
    lib.write_bytes(b"one")
    options = {"extern_libs": {"libdevice": str(lib)}, "num_warps": 4}
    before = repr(lowering_keys._canon(lowering_keys._libraries(options), {}))
    lib.write_bytes(b"other")
    os.utime(lib, ns=(1, 1))
    assert repr(lowering_keys._canon(lowering_keys._libraries(options), {})) != before
    assert lowering_keys._libraries({"num_warps": 4}) == {"num_warps": 4}
    import triton

    base = os.path.dirname(os.path.abspath(triton.__file__))
    names = [row[0] for row in compiler_identity._library_rows(base)]
    assert any("libdevice" in n for n in names) and any(n.startswith("amd") for n in names)


def _other_triton(monkeypatch):
    monkeypatch.setattr(compiler_identity, "triton_fingerprint", lambda: "another triton")


def _other_jaxlib(monkeypatch):
    release = versions.jaxlib_version()
    major, minor, micro = (int(p) for p in release.split(".")[:3])
    monkeypatch.setattr(versions, "jaxlib_version", lambda: f"{major}.{minor}.{micro}.post1")


def _other_ptxas(monkeypatch):
    found = ptxisa.jaxlib_assembler()
    other = ptxisa.Assembler(cuda="13.9", isa=99, origin="a newer ptxas")  # takes any PTX
    assert found != other
    monkeypatch.setattr(ptxisa, "jaxlib_assembler", lambda cache=None: other)


def _triton_setting(monkeypatch):
    monkeypatch.setenv("TRITON_DEFAULT_FP_FUSION", "0" if backends.default_fp_fusion() else "1")


@pytest.mark.parametrize(
    "change",
    [_other_triton, _other_jaxlib, _other_ptxas, _triton_setting],
    ids=["triton", "jaxlib", "jaxlib-ptxas", "triton-setting"],
)
def test_a_changed_toolchain_or_setting_is_lowered_again(cache, assembled, monkeypatch, change):
    # embed="ptx": the PTX is assembled by jaxlib's ptxas whatever jaxlib is installed
    module_text(add(cache, embed="ptx"), F32, F32)
    module_text(add(cache, embed="ptx"), F32, F32)
    assert len(assembled) == 1
    change(monkeypatch)
    module_text(add(cache, embed="ptx"), F32, F32)
    assert len(assembled) == 2
    module_text(add(cache, embed="ptx"), F32, F32)
    assert len(assembled) == 2  # kept under its own key


def test_a_decision_made_later_replaces_the_autotuned_lowering_and_a_setting_restores_it(
    tmp_path, cache, monkeypatch
):
    (before,) = decoded(matmul(cache), A, B)
    assert len(before.autotuned_kernel_call.configs) == 4
    manifest = tmp_path / "manifest.jsonl"
    monkeypatch.setenv("KERNELCACHE_RECORD", str(manifest))
    decoded(matmul(cache, autotune="runtime"), A, B)
    monkeypatch.delenv("KERNELCACHE_RECORD")
    (result,) = tune.tune(str(manifest), cache, pins={"matmul_kernel": 2})
    assert result.status == "pinned"
    (after,) = decoded(matmul(cache), A, B)
    assert after.HasField("kernel_call")  # the decision's one kernel, not the stored four
    assert after.kernel_call.kernel == before.autotuned_kernel_call.configs[2].kernel_call.kernel
    (again,) = decoded(matmul(cache), A, B)
    assert again == after
    assert entries(cache.root)["lowering"] == 2  # every config, and the decided one
    monkeypatch.setenv("KERNELCACHE_AUTOTUNE", "runtime")  # a setting: jaxlib autotunes again
    (runtime,) = decoded(matmul(cache), A, B)
    assert runtime == before


def test_a_held_lock_on_a_lowering_entry_costs_no_wait(tmp_path, assembled):
    """Another process writing the same lowering entry (its key's lock held for as long as
    it likes): the lowering neither waits for it nor fails, and keeps nothing itself."""
    import time

    cache = kernelcache.Cache(tmp_path / "root", readonly_roots=(), remote="", lock_timeout=20)
    cold = module_text(add(cache), F32, F32)
    (path,) = Path(cache.root).glob("*.lowering")
    key = path.stem
    forget_lowerings(cache.root)
    held = cache.store.lock(key, shared=False, timeout=1)
    assert held is not None
    try:
        started = time.monotonic()
        assert module_text(add(cache), F32, F32) == cold
        assert time.monotonic() - started < 10  # not the lock timeout (20 s)
    finally:
        held.release()
    assert len(assembled) == 2 and not list(Path(cache.root).glob("*.lowering"))


def _lowering(head: bytes, opaque: bytes = b"x", size: int | None = None) -> bytes:
    return struct.pack(">4sI", b"KCL1", len(head) if size is None else size) + head + opaque


ODD_LOWERINGS = {
    "empty": b"",
    "short": b"KCL1\x00",
    "magic": b"XXXX" + _lowering(b"{}")[4:],
    "size-lie": _lowering(b'{"embed": "ptx"}', size=1 << 31),
    "not-json": _lowering(b"\xff\xfe{"),
    "not-an-object": _lowering(b"[1, 2]"),
    "embed-type": _lowering(b'{"embed": 5, "autotuned": false, "needs": [0]}'),
    "autotuned-type": _lowering(b'{"embed": "ptx", "autotuned": 1, "needs": [0]}'),
    "needs-negative": _lowering(b'{"embed": "ptx", "autotuned": false, "needs": [-1]}'),
    "needs-nan": _lowering(b'{"embed": "ptx", "autotuned": false, "needs": [NaN]}'),
    "deep": _lowering(b"[" * 100_000 + b"]" * 100_000),
}
ODD_VARIANTS = {
    "not-json": b"\xff",
    "not-a-list": b'{"variants": 5}',
    "not-strings": b'{"variants": [1, 2, 3, 4]}',
    "lone-surrogate": b'{"variants": ["\\ud800", "a", "b", "c"]}',
    "huge": b'{"variants": ["' + b"a" * 100_000 + b'"]}',
}


@pytest.mark.parametrize("raw", ODD_LOWERINGS.values(), ids=ODD_LOWERINGS.keys())
def test_an_odd_lowering_entry_is_a_miss(cache, assembled, raw):
    cold = module_text(add(cache), F32, F32)
    (path,) = Path(cache.root).glob("*.lowering")
    forget_lowerings(cache.root)
    cache.put(path.stem, "lowering", raw, {"kind": "lowering"})
    assert module_text(add(cache), F32, F32) == cold
    assert len(assembled) == 2


@pytest.mark.parametrize("raw", ODD_VARIANTS.values(), ids=ODD_VARIANTS.keys())
def test_an_odd_variants_entry_is_a_miss(cache, assembled, raw):
    cold = module_text(matmul(cache), A, B)
    forget_programs(cache.root)
    (path,) = Path(cache.root).glob("*.variants")
    path.with_suffix(".json").unlink()
    path.unlink()
    cache.put(path.stem, "variants", raw, {"kind": "lowering"})
    assert module_text(matmul(cache), A, B) == cold
    assert len(assembled) == 2


def test_a_program_reads_the_settings_once_per_lowering(cache, monkeypatch):
    made: list[tuple[object, ...]] = []
    real = bridge_call.setup
    monkeypatch.setattr(
        bridge_call,
        "setup",
        lambda call, *a: made.append((call.target, call.cache)) or real(call, *a),
    )

    def program():  # a new function each time: JAX caches the lowering of a traced one
        def run(x, y):
            z = ops.add(x, y, target="cuda:90", cache=cache)
            z = ops.add(z, y, target="cuda:90", cache=cache)
            return ops.add(z, x, target="cuda:90", cache=cache, embed="ptx")

        return run

    first = module_text(program(), F32, F32)
    assert len(made) == 2  # one per (target, embed, cache) the calls pass
    monkeypatch.setenv("TRITON_DEFAULT_FP_FUSION", "0" if backends.default_fp_fusion() else "1")
    second = module_text(program(), F32, F32)
    assert len(made) == 4  # read again for the next lowering, which sees the new setting
    assert second != first
