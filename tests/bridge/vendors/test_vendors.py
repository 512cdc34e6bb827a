"""Vendors: what differs by vendor is data and methods of one vendor object, so a third vendor is
one object away, and one Triton has no backend for fails clearly instead of passing for CUDA or
HIP."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import jax
import jax.numpy as jnp
import pytest
from bridge_helpers import decoded
from support import REPO

import bridge
from bridge import warm
from bridge.embed import modes
from bridge.lowering.lower import lower_call, triton_call_p
from bridge.vendors import backends
from bridge.vendors.cuda import CUDA
from bridge.vendors.hip import HIP
from bridge.vendors.targets import Target, max_shared_memory, parse_target
from bridge.vendors.vendor import Vendor, by_platform, register, registered, unregister
from examples import ops

F32 = jax.ShapeDtypeStruct((4096,), jnp.float32)

#: a vendor the bridge does not ship and Triton has no backend for (Intel's GPUs)
XPU = Vendor(
    name="xpu",
    package="intel",
    platform="xpu",
    maker="Intel",
    title="XPU",
    grammar=re.compile(r"xpu[:_]?(pvc|bmg)"),
    name_form="xpu:<device>",
    examples=("xpu:pvc",),
    install_hint="install Triton's Intel XPU backend",
    options_class="XPUOptions",
    probe_arch="pvc",
    binary_ext="spv",
    has_ptx=False,
    inline_on_old_jaxlib="it cannot load the kernel",
    warp_size_default=16,
    jaxlib_threads_per_warp=16,
    max_threads_per_block=1024,
    shared_memory={},
)


@pytest.fixture
def xpu() -> Iterator[Vendor]:
    register(XPU)
    try:
        yield XPU
    finally:
        unregister(XPU)
        backends.option_names.cache_clear()


def test_a_registered_vendor_names_targets(xpu):
    target = parse_target("XPU:PVC")
    assert target == Target("xpu", "pvc", 16) and str(target) == "xpu:pvc"
    assert parse_target(str(target)) == target
    assert target.vendor is xpu and target.platform == "xpu"
    assert target.runs_on(parse_target("xpu_pvc")) and not target.runs_on(parse_target("xpu:bmg"))
    assert not target.runs_on(parse_target("cuda:90"))
    assert parse_target("cuda:90").vendor is CUDA and parse_target("hip:gfx942").vendor is HIP
    with pytest.raises(bridge.TargetError, match=r"or xpu:<device>, e\.g\. .*xpu:pvc"):
        parse_target("xpu:a770")


def test_the_fake_vendor_is_never_cuda_or_hip(xpu):
    target = parse_target("xpu:bmg")
    assert max_shared_memory(target) is None
    assert modes.choose_mode("auto", target, "0.10.0") == "inline"
    with pytest.raises(bridge.EmbedError, match=r"embed='ptx' is for CUDA; xpu:bmg takes 'inline'"):
        modes.choose_mode("ptx", target, "0.11.2")
    with pytest.raises(bridge.EmbedError, match=r"embed='path' is for ROCm"):
        modes.choose_mode("path", target, "0.11.2")
    with pytest.raises(bridge.TargetError, match=r"is a xpu target, but .* lowered for cuda"):
        decoded(lambda x, y: ops.add(x, y, target="xpu:pvc"), F32, F32)


def test_compiling_for_a_vendor_without_a_triton_backend_says_what_is_missing(xpu, tmp_path):
    root = tmp_path / "root"
    missing = r"no 'intel' backend \(triton/backends/intel is missing; .*Intel XPU backend"
    with pytest.raises(bridge.BackendUnavailable, match=missing):
        backends.make_backend(parse_target("xpu:pvc"))
    record = json.loads((REPO / "examples" / "manifest.jsonl").read_text().splitlines()[0])
    with pytest.raises(bridge.BackendUnavailable, match=missing):
        warm.compile_record(record, "xpu:pvc", cache=str(root))
    jaxpr = jax.make_jaxpr(lambda x, y: ops.add(x, y, target="xpu:pvc", cache=str(root)))(F32, F32)
    (eqn,) = [e for e in jaxpr.eqns if e.primitive is triton_call_p]
    with pytest.raises(bridge.BackendUnavailable, match=missing):
        lower_call(eqn.params["call"], "xpu")
    # nothing cached under any name, but what does not depend on the target: the lock files and
    # the memo of the variables Triton reads (made by the first test of a process that keys)
    memos = {p.stem for p in root.glob("*.ident")}
    cached = [
        p
        for p in root.rglob("*")
        if p.is_file() and ".locks" not in p.relative_to(root).parts and p.stem not in memos
    ]
    assert not cached


def test_a_platform_belongs_to_one_vendor(xpu):
    twin = Vendor(**{**vars(XPU), "name": "xpu2"})
    with pytest.raises(ValueError, match="platform 'xpu' belongs to xpu"):
        register(twin)
    assert by_platform("xpu") is xpu and by_platform("metal") is None
    with pytest.raises(bridge.TargetError, match="unknown GPU backend 'xpu2'"):
        Target("xpu2", "pvc", 16)


def test_descriptors_pickle_as_the_registered_one():
    import pickle

    target = parse_target("hip:gfx950")
    assert pickle.loads(pickle.dumps(target)) == target
    assert pickle.loads(pickle.dumps(target)).vendor is HIP


@pytest.mark.parametrize(
    "target, limit",
    [
        ("cuda:80", 166912),
        ("cuda:86", 101376),
        ("cuda:87", 166912),
        ("cuda:89", 101376),
        ("cuda:90", 232448),
        ("cuda:100", 232448),
        ("cuda:120", 101376),
        ("hip:gfx90a", 65536),
        ("hip:gfx942", 65536),
        ("hip:gfx950", 163840),
        ("cuda:75", None),
        ("hip:gfx1100", None),
    ],
)
def test_shared_memory_per_block(target, limit):
    assert max_shared_memory(parse_target(target)) == limit


#: a backend, vendor or platform name compared with a string literal
_COMPARISON = re.compile(
    r"""(==|!=|\bin\s*[(\[{])\s*["'](cuda|hip|rocm|nvidia|amd)["']"""
    r"""|["'](cuda|hip|rocm|nvidia|amd)["']\s*(==|!=|\bin\b)"""
)


def test_every_registered_platform_has_a_lowering():
    platforms = {v.platform for v in registered()}
    assert {"cuda", "rocm"} <= platforms
    # the primitive has a lowering for the platform of every registered vendor
    from jax._src.interpreters import mlir

    lowered = {
        p for p, rules in mlir._platform_specific_lowerings.items() if triton_call_p in rules
    }
    assert platforms <= lowered
