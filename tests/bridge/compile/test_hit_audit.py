"""Auditing hits in a job (``KERNELCACHE_AUDIT``): a cached kernel that is not what a compile
gives now, served as a kernel hit, through a stored lowering or through a program entry, is
said loudly and made again for the process; an honest cache audited says nothing and embeds
the same bytes; with the share 0 a warm hit runs no frontend and compiles nothing.

The bad entries are made by hand, as a blind spot of the key and the witness would make them:
under the key (and the reads) of the code of now, a *stale* entry holds the machine code and IR
of the code of before; a *forged* one holds the machine code of before with the metadata of now
(its ``ir`` field, its reads, its PTX), so that only its machine code tells it. The lowerings and
program entries that embed them are stored by a process that does not audit, and served to
other processes, as in a fleet."""

from __future__ import annotations

import hashlib
import json
import logging
import re
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from bridge_helpers import (
    COUNT_COMPILES,
    custom_calls,
    kernel_module,
    lowered_module,
    machine_code,
    run_child,
)

import kernelcache
from bridge.compile import compiler, hit_audit
from bridge.compile.compiler import Compiled
from bridge.entries import kernels
from bridge.entries.kernels import PTX
from bridge.entries.lowerings import EVERY, LOWERING, PROGRAM, Item, Lowered
from examples import ops
from kernelcache.schema import COVERS_FIELD, RESERVED_FIELDS

VECTORS = (jax.ShapeDtypeStruct((4096,), jnp.float32),) * 2
MATRICES = (
    jax.ShapeDtypeStruct((512, 256), jnp.bfloat16),
    jax.ShapeDtypeStruct((256, 384), jnp.bfloat16),
)
#: the kernel module, its SCALE given: version A is SCALE 2, version B (the code of now) SCALE 9
SOURCE = """
SCALE = tl.constexpr({scale})


@triton.jit
def scaled(x_ptr, n, out_ptr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * SCALE, mask=mask)
"""
BEFORE, NOW = "2.0", "9.0"
MODULE = "audited_kernels"
QUALNAME = f"{MODULE}:scaled"

#: a process that lowers a kernel module (argv: its folder, the cache root, its name, its
#: source) and says what it embeds, what it warned of AUDIT FAILED, and what it compiled and ran
#: of the frontend
CHILD = (
    COUNT_COMPILES
    + """
import hashlib, json, logging
from pathlib import Path

import jax
import jax.numpy as jnp

import bridge
import kernelcache
from bridge.compile import compiler
from bridge.identity import frontend
from bridge.lowering import proto
from bridge_helpers import custom_calls, kernel_module, kernels_of, lowered_module

said = []


class Said(logging.Handler):
    def emit(self, record):
        said.append(record.getMessage())


logging.getLogger("bridge").addHandler(Said(logging.WARNING))
digests = [0]
_ir_digest = frontend.ir_digest


def counted(*args, **kwargs):
    digests[0] += 1
    return _ir_digest(*args, **kwargs)


frontend.ir_digest = counted
folder, root, name, source = sys.argv[1:5]
module = kernel_module(Path(folder), name, source)


def fn(x):
    return bridge.triton_call(
        x, x.size, kernel=module.scaled, out_shape=x, grid=(4,), BLOCK=1024,
        target="cuda:90", embed="inline", cache=kernelcache.Cache(root),
    )


(call,) = custom_calls(lowered_module(fn, jax.ShapeDtypeStruct((4096,), jnp.float32)))
(kernel,) = kernels_of(proto.decode_opaque(call["opaque"]))
_synced()
print(json.dumps({
    "code": hashlib.sha256(kernel.module_image.object_file).hexdigest(),
    "opaque": hashlib.sha256(call["opaque"]).hexdigest(),
    "said": [m for m in said if "AUDIT FAILED" in m],
    "compiles": compiler.compile_count(),
    "make_ir": counts["make_ir"],
    "ir_digests": digests[0],
}))
"""
)


def _lower(folder: Path, root: Path, scale: str, audit: str | None = None) -> dict:
    """What a fresh process lowering version ``scale`` of the kernel with the cache at ``root``
    embeds and says (see :data:`CHILD`), auditing ``audit`` of its hits."""
    env = {} if audit is None else {"KERNELCACHE_AUDIT": audit}
    source = SOURCE.format(scale=scale)
    return run_child(CHILD, str(folder), str(root), MODULE, source, **env)


def _entries(root: Path) -> dict[str, dict]:
    """The kernel entries' metadata under ``root``, by key."""
    docs = [json.loads(p.read_text()) for p in root.glob("*.json")]
    return {d["key"]: d for d in docs if d.get("ext") == "cubin"}


def _plant(before: Path, now: Path, into: Path, *, forged: bool) -> str:
    """Store at ``into`` the kernel entry of version B (whose cache is at ``now``) holding the
    machine code of version A (whose cache is at ``before``): with A's IR and PTX (stale), or
    with B's metadata and PTX (``forged``: only its machine code is A's); its key."""
    ((old_key, old),) = _entries(before).items()
    ((key, new),) = _entries(now).items()
    meta = {k: v for k, v in new.items() if k not in RESERVED_FIELDS and k != COVERS_FIELD}
    ptx_from, ptx_key = (now, key) if forged else (before, old_key)
    if not forged:
        meta.update(ir=old["ir"], ptx_sha256=old["ptx_sha256"])
    art = kernelcache.Cache(str(before)).get(old_key, "cubin", counted=False)
    assert art is not None
    planted = kernelcache.Cache(str(into))
    planted.put(key, "cubin", art.data, meta)
    ptx = PTX.get(kernelcache.Cache(str(ptx_from)), ptx_key)
    assert ptx is not None
    kernels.store_ptx(planted, key, ptx.data.decode(), new)
    return key


def _only(root: Path, ext: str) -> Path:
    """``root`` without its entries of extension ``ext`` (a lowering or program entry)."""
    for path in root.glob(f"*.{ext}"):
        path.with_suffix(".json").unlink()
        path.unlink()
    return root


def _digests(root: Path) -> dict[str, str]:
    """Every file under ``root`` but the cache's own bookkeeping, by name: its digest."""
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in root.iterdir()
        if p.is_file() and p.suffix not in ("", ".lock", ".db")
    }


@pytest.fixture(scope="module")
def versions(tmp_path_factory):
    """The folder of the kernel module, and a cache of each version (A, B), each lowered by a
    process of its own: what each embeds."""
    folder = tmp_path_factory.mktemp("hit_audit")
    a = _lower(folder, folder / "A", BEFORE)
    b = _lower(folder, folder / "B", NOW)
    assert a["code"] != b["code"]
    return folder, a, b


@pytest.fixture(scope="module", params=["stale", "forged"])
def planted(request, versions):
    """A cache whose kernel entry for B holds A (``stale`` or ``forged``: see :func:`_plant`),
    and whose stored lowering and program entry of the call embed it (a process that does not
    audit lowered the call with it); its key and what it embeds."""
    folder, a, _ = versions
    root = folder / request.param
    key = _plant(folder / "A", folder / "B", root, forged=request.param == "forged")
    served = _lower(folder, root, NOW)
    assert served["code"] == a["code"] and not served["said"]  # (the blind spot, unaudited)
    assert list(root.glob(f"*.{LOWERING.ext}")) and list(root.glob(f"*.{PROGRAM.ext}"))
    return request.param, root, key


def _door(root: Path, door: str, into: Path) -> Path:
    """A copy of ``root`` whose hit is served through ``door``: the kernel entry alone, a
    stored lowering (no program entry) or a program entry (no stored lowering)."""
    copy = Path(shutil.copytree(root, into))
    if door in ("kernel", "program"):
        _only(copy, LOWERING.ext)
    if door in ("kernel", "lowering"):
        _only(copy, PROGRAM.ext)
    return copy


def _names_a_stored_lowering(message: str, root: Path) -> bool:
    """Whether ``message`` names the lowering key of a stored lowering under ``root`` (whose
    entry is keyed by that key and its state)."""
    stored = {p.stem for p in root.glob(f"*.{LOWERING.ext}")}
    named = re.findall(r"\b[0-9a-f]{64}\b", message)
    return any(LOWERING.key(key, EVERY) in stored for key in named)


@pytest.mark.parametrize("door", ["kernel", "lowering", "program"])
def test_an_audited_hit_that_is_not_what_a_compile_gives_is_said_and_made_again(
    planted, versions, door, tmp_path
):
    kind, root, key = planted
    folder, _, b = versions
    served = _door(root, door, tmp_path / door)
    kept = _digests(served)
    now = _lower(folder, served, NOW, audit="1")
    assert now["code"] == b["code"] and now["opaque"] == b["opaque"], (kind, door)
    said = now["said"]
    kernel_said = [m for m in said if "cached kernel" in m]
    assert len(kernel_said) == 1 and key in kernel_said[0] and QUALNAME in kernel_said[0], said
    why = "other IR" if kind == "stale" else "machine code differs"
    assert why in kernel_said[0], said
    lowering_said = [m for m in said if "stored lowering" in m]
    if door == "kernel":
        assert not lowering_said, said
    else:
        (message,) = lowering_said
        assert QUALNAME in message and "cuda:90" in message, message
        assert _names_a_stored_lowering(message, root), message
    # the entries stay as they were, for an operator to look at
    assert {n: d for n, d in _digests(served).items() if n in kept} == kept


def test_an_honest_cache_audited_says_nothing_and_embeds_the_same_bytes(versions, tmp_path):
    folder, _, b = versions
    for door in ("kernel", "lowering", "program"):
        served = _door(folder / "B", door, tmp_path / door)
        now = _lower(folder, served, NOW, audit="1")
        assert not now["said"], (door, now["said"])
        assert (now["code"], now["opaque"]) == (b["code"], b["opaque"]), door
        assert now["compiles"] == 1, (door, now)  # (the audit's compile of the one kernel)


#: a call of each kind: what it calls (op, target, embedding), on what, and its kernels
CALLS = {
    "cuda-inline": (ops.add, "cuda:90", None, VECTORS, 1),
    "cuda-ptx": (ops.add, "cuda:80", "ptx", VECTORS, 1),
    "hip-inline": (ops.add, "hip:gfx942", "inline", VECTORS, 1),
    "autotuned": (ops.matmul, "cuda:90", None, MATRICES, 4),
}


@pytest.mark.parametrize("which", list(CALLS))
def test_an_honest_lowering_audited_says_nothing_whatever_the_call(
    which, tmp_path, monkeypatch, caplog
):
    """(In this process: its kernels are fetched again by the audit, whatever it fetched.)"""
    op, target, embed, avals, kernels = CALLS[which]
    cache = kernelcache.Cache(str(tmp_path))
    platform = "rocm" if target.startswith("hip") else "cuda"

    def opaques() -> list[bytes]:  # (a function of its own: JAX lowers anew)
        def fn(x, y):
            return op(x, y, cache=cache, target=target, embed=embed)

        lowered = lowered_module(fn, *avals, platform=platform)
        return [call["opaque"] for call in custom_calls(lowered)]

    cold = opaques()
    monkeypatch.setenv("KERNELCACHE_AUDIT", "1")
    compiled = compiler.compile_count()
    with caplog.at_level(logging.WARNING):
        warm = opaques()
    assert warm == cold
    assert not [r for r in caplog.records if "AUDIT" in r.getMessage()]
    assert compiler.compile_count() - compiled == kernels  # (each kernel compiled by its audit)


@pytest.mark.parametrize("audit", [None, "0"])
def test_with_the_share_0_a_warm_hit_runs_no_frontend_and_compiles_nothing(
    versions, audit, tmp_path
):
    folder, _, b = versions
    for door in ("kernel", "lowering", "program"):
        served = _door(folder / "B", door, tmp_path / door)
        now = _lower(folder, served, NOW, audit=audit)
        assert now["code"] == b["code"] and not now["said"], door
        done = (now["compiles"], now["make_ir"], now["ir_digests"])
        assert done == (0, 0, 0), (door, now)


# -- in this process --------------------------------------------------------------------------


@pytest.fixture
def stale_root(tmp_path):
    """A root whose entry for the kernel with SCALE 9 holds the kernel with SCALE 2, and the
    module (its SCALE 9)."""
    tag = hashlib.sha256(str(tmp_path).encode()).hexdigest()[:8]
    module = kernel_module(tmp_path, f"hit_audit_{tag}", SOURCE.format(scale=BEFORE))
    before = machine_code(module.scaled, tmp_path / "A")
    module.SCALE = module.tl.constexpr(float(NOW))
    machine_code(module.scaled, tmp_path / "B")
    _plant(tmp_path / "A", tmp_path / "B", tmp_path / "stale", forged=False)
    return module, tmp_path / "stale", before


def test_without_the_audit_the_blind_spot_serves_the_stale_kernel(stale_root, monkeypatch):
    """(What the audit is for: the entry is served as it is.)"""
    module, root, before = stale_root
    monkeypatch.delenv("KERNELCACHE_AUDIT", raising=False)
    assert machine_code(module.scaled, root) == before


def test_an_audited_hit_compiled_from_other_ir_is_said_and_compiled_again(
    stale_root, monkeypatch, caplog, tmp_path
):
    module, root, before = stale_root
    monkeypatch.setenv("KERNELCACHE_AUDIT", "1")
    with caplog.at_level(logging.WARNING):
        now = machine_code(module.scaled, root)
    assert now != before
    assert now == machine_code(module.scaled, tmp_path / "fresh")
    said = [r.getMessage() for r in caplog.records if "AUDIT FAILED" in r.getMessage()]
    assert len(said) == 1 and module.scaled.__qualname__ in said[0], said


def test_an_audit_that_cannot_compile_uses_the_hit_as_it_is(stale_root, monkeypatch, caplog):
    module, root, before = stale_root
    monkeypatch.setenv("KERNELCACHE_AUDIT", "1")

    def broken(*args, **kwargs):
        raise RuntimeError("no compiler here")

    monkeypatch.setattr(hit_audit, "compile_source", broken)
    with caplog.at_level(logging.DEBUG, logger="bridge.compile.hit_audit"):
        assert machine_code(module.scaled, root) == before
    assert any("could not compile" in r.getMessage() for r in caplog.records)
    assert not [r for r in caplog.records if "AUDIT FAILED" in r.getMessage()]


def test_an_audit_that_cannot_lower_again_uses_the_stored_lowering(caplog):
    stored = Item("0" * 64, EVERY, None, Lowered(b"stored", "inline", False))

    def failing() -> tuple[Lowered, str]:
        raise RuntimeError("no kernel now")

    about = ("/nowhere", "m:k", "cuda:90")
    with caplog.at_level(logging.DEBUG, logger="bridge.compile.hit_audit"):
        assert hit_audit.replayed(stored, about, 1.0, failing) is None
    assert any("could not lower" in r.getMessage() for r in caplog.records)


def test_a_lowering_made_again_in_another_state_is_not_judged(caplog):
    """(A decision made meanwhile: the stored lowering of the state asked is used.)"""
    stored = Item("3" * 64, EVERY, None, Lowered(b"stored", "inline", True))
    about = ("/nowhere", "m:k", "cuda:90")
    with caplog.at_level(logging.DEBUG, logger="bridge.compile.hit_audit"):
        found = hit_audit.replayed(
            stored, about, 1.0, lambda: (Lowered(b"one", "inline", False), "2")
        )
    assert found is None
    assert not [r for r in caplog.records if "AUDIT FAILED" in r.getMessage()]


def test_a_lowering_audited_once_is_not_made_again_in_the_process():
    stored = Item("1" * 64, EVERY, None, Lowered(b"stored", "inline", False))
    made: list[Lowered] = []

    def again() -> tuple[Lowered, str]:
        made.append(Lowered(b"other", "inline", False))
        return made[-1], EVERY

    about = ("/nowhere", "m:k", "cuda:90")
    first = hit_audit.replayed(stored, about, 1.0, again)
    assert first is not None and first.opaque == b"other"
    assert hit_audit.replayed(stored, about, 0.5, again) is first and len(made) == 1


def test_with_the_share_0_nothing_is_drawn_made_or_compared(monkeypatch):
    def forbidden(*args, **kwargs):
        raise AssertionError("an audit ran with the share 0")

    monkeypatch.setattr(hit_audit.random, "random", forbidden)
    stored = Item("2" * 64, EVERY, None, Lowered(b"stored", "inline", False))
    assert hit_audit.replayed(stored, ("/nowhere", "m:k", "cuda:90"), 0.0, forbidden) is None
    assert not hit_audit.sampled(0.0)
    with hit_audit.every_hit():
        assert hit_audit.share() == 1.0


def test_what_an_audited_kernel_is_compared_in():
    from bridge.entries.kernels import launch_fields
    from bridge.vendors.targets import parse_target

    target = parse_target("cuda:90")
    fresh = Compiled(b"code B", "ptx B", {"name": "k", "num_warps": 4}, ir="ir B")
    launch = launch_fields(fresh.metadata, target)

    def differs(meta, binary, ptx):
        return hit_audit.difference({**launch, **meta}, binary, ptx, fresh, target)

    assert differs({"ir": "ir B"}, b"code B", "ptx B") is None
    assert hit_audit.difference({}, b"code B", None, fresh, target) is None  # (nothing said)
    assert "other IR" in str(differs({"ir": "ir A"}, b"code B", "ptx B"))
    assert "machine code" in str(differs({"ir": "ir B"}, b"code A", "ptx B"))
    assert "PTX" in str(differs({"ir": "ir B"}, b"code B", "ptx A"))
    # what the machine code is launched with: a forged entry's warps, name or shared memory
    for field, forged in (("num_warps", 8), ("name", "kk"), ("shared", 1 << 16)):
        assert field in str(differs({field: forged}, b"code B", "ptx B")), field


def test_a_stored_lowering_that_says_it_is_autotuned_when_it_is_not_is_a_difference():
    stored = Item("3" * 64, EVERY, None, Lowered(b"opaque", "inline", True))
    fresh = Lowered(b"opaque", "inline", False)
    hit_audit._lowerings.clear()
    found = hit_audit.replayed(stored, ("/nowhere", "m:k", "cuda:90"), 1.0, lambda: (fresh, EVERY))
    assert found == fresh


def test_the_audit_fraction_is_checked(monkeypatch):
    from bridge.settings import job_settings

    monkeypatch.setenv("KERNELCACHE_AUDIT", "0.25")
    assert job_settings().audit == 0.25
