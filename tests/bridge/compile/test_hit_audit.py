"""Auditing hits in a job (``KERNELCACHE_AUDIT``): a cached kernel that is not what a compile
gives now, served as a kernel hit, through a stored lowering or through a program entry, is
said loudly and made again for the process; an honest cache audited says nothing and embeds
the same bytes; with the share 0 a warm hit runs no frontend and compiles nothing.

The bad entries are made by hand, as a blind spot of the key and the witness would make them:
under the key (and the reads) of the code of now, a *stale* entry holds the machine code and IR
of the code of before; a *forged* one holds the machine code of before with the metadata of now
(its ``ir`` field, its reads, its PTX), so that only its machine code tells it. The lowerings and
program entries that embed them are stored by a process that does not audit, and served to
other processes, as in a fleet. Each holds on cuda:90 and hip:gfx942: a child process lowers for
both targets (one start, a lowering each), and each test, run once per target, reads its own."""

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
from identity_targets import TARGETS, each_target, machine_ext

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
import hashlib, json, logging, os
from pathlib import Path

import jax
import jax.numpy as jnp

import bridge
import kernelcache
from bridge.compile import compiler
from bridge.identity import frontend
from bridge.lowering import proto
from bridge_helpers import custom_calls, kernel_module, kernels_of, lowered_module
from identity_targets import platform_of

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
out = {}
for target in json.loads(os.environ["KC_TARGETS"]):
    _synced()
    before = (len(said), compiler.compile_count(), counts["make_ir"], digests[0])

    def fn(x):
        return bridge.triton_call(
            x, x.size, kernel=module.scaled, out_shape=x, grid=(4,), BLOCK=1024,
            target=target, embed="inline", cache=kernelcache.Cache(root),
        )

    avals = jax.ShapeDtypeStruct((4096,), jnp.float32)
    (call,) = custom_calls(lowered_module(fn, avals, platform=platform_of(target)))
    (kernel,) = kernels_of(proto.decode_opaque(call["opaque"]))
    _synced()
    out[target] = {
        "code": hashlib.sha256(kernel.module_image.object_file).hexdigest(),
        "opaque": hashlib.sha256(call["opaque"]).hexdigest(),
        "said": [m for m in said[before[0]:] if "AUDIT FAILED" in m],
        "compiles": compiler.compile_count() - before[1],
        "make_ir": counts["make_ir"] - before[2],
        "ir_digests": digests[0] - before[3],
    }
print(json.dumps(out))
"""
)


def _lower(folder: Path, root: Path, scale: str, audit: str | None = None) -> dict[str, dict]:
    """What a fresh process lowering version ``scale`` of the kernel with the cache at ``root``
    for every target embeds and says (see :data:`CHILD`), auditing ``audit`` of its hits: by
    target."""
    env = {} if audit is None else {"KERNELCACHE_AUDIT": audit}
    source = SOURCE.format(scale=scale)
    targets = json.dumps(list(TARGETS))
    return run_child(CHILD, str(folder), str(root), MODULE, source, KC_TARGETS=targets, **env)


def _entries(root: Path, target: str) -> dict[str, dict]:
    """The metadata of ``target``'s kernel entries under ``root``, by key."""
    docs = [json.loads(p.read_text()) for p in root.glob("*.json")]
    return {d["key"]: d for d in docs if d.get("ext") == machine_ext(target)}


def _plant(before: Path, now: Path, into: Path, target: str, *, forged: bool) -> str:
    """Store at ``into`` the kernel entry of version B for ``target`` (whose cache is at
    ``now``) holding the machine code of version A (whose cache is at ``before``): with A's IR
    (and PTX, where the target has it: stale), or with B's metadata and PTX (``forged``: only
    its machine code is A's); its key."""
    ext = machine_ext(target)
    ((old_key, old),) = _entries(before, target).items()
    ((key, new),) = _entries(now, target).items()
    meta = {k: v for k, v in new.items() if k not in RESERVED_FIELDS and k != COVERS_FIELD}
    ptx_from, ptx_key = (now, key) if forged else (before, old_key)
    if not forged:
        meta.update({f: old[f] for f in ("ir", "ptx_sha256") if f in old})
    art = kernelcache.Cache(str(before)).get(old_key, ext, counted=False)
    assert art is not None
    planted = kernelcache.Cache(str(into))
    planted.put(key, ext, art.data, meta)
    if "ptx_sha256" in new:  # (PTX beside the machine code: CUDA's)
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
    """The folder of the kernel module, and a cache of each version (A, B), each lowered for
    every target by a process of its own: what each embeds, by target."""
    folder = tmp_path_factory.mktemp("hit_audit")
    a = _lower(folder, folder / "A", BEFORE)
    b = _lower(folder, folder / "B", NOW)
    assert all(a[t]["code"] != b[t]["code"] for t in TARGETS)
    return folder, a, b


@pytest.fixture(scope="module", params=["stale", "forged"])
def planted(request, versions):
    """A cache whose kernel entries for B hold A (``stale`` or ``forged``: see :func:`_plant`),
    one per target, and whose stored lowerings and program entries of the call embed them (a
    process that does not audit lowered the call with them); their keys by target."""
    folder, a, _ = versions
    root = folder / request.param
    forged = request.param == "forged"
    keys = {t: _plant(folder / "A", folder / "B", root, t, forged=forged) for t in TARGETS}
    served = _lower(folder, root, NOW)
    for t in TARGETS:  # (the blind spot, unaudited)
        assert served[t]["code"] == a[t]["code"] and not served[t]["said"]
    assert list(root.glob(f"*.{LOWERING.ext}")) and list(root.glob(f"*.{PROGRAM.ext}"))
    return request.param, root, keys


@pytest.fixture(scope="module")
def audited(versions):
    """An audit of a root through a door: a copy of ``root`` served through ``door`` (see
    :func:`_door`), lowered by a fresh process for every target, auditing ``audit`` of its
    hits: the copy, the digests of its files before and after, and what the process embedded
    and said (by target). Made once for the tests of every target."""
    folder = versions[0]
    done: dict[tuple[str, str, str | None], tuple] = {}

    def audit(root: Path, door: str, audit: str | None = "1") -> tuple:
        which = (root.name, door, audit)
        if which not in done:
            served = _door(root, door, folder / "audits" / f"{root.name}-{door}-{audit}")
            kept = _digests(served)
            now = _lower(folder, served, NOW, audit=audit)
            done[which] = (served, kept, now, _digests(served))
        return done[which]

    return audit


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
@pytest.mark.parametrize("target", TARGETS)
def test_an_audited_hit_that_is_not_what_a_compile_gives_is_said_and_made_again(
    planted, versions, audited, door, target
):
    kind, root, keys = planted
    key = keys[target]
    _, _, b = versions
    _, kept, found, after = audited(root, door)
    now, b = found[target], b[target]
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
        assert QUALNAME in message and target in message, message
        assert _names_a_stored_lowering(message, root), message
    # the entries stay as they were, for an operator to look at
    assert {n: d for n, d in after.items() if n in kept} == kept


@pytest.mark.parametrize("target", TARGETS)
def test_an_honest_cache_audited_says_nothing_and_embeds_the_same_bytes(versions, audited, target):
    folder, _, b = versions
    b = b[target]
    for door in ("kernel", "lowering", "program"):
        now = audited(folder / "B", door)[2][target]
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
@pytest.mark.parametrize("target", TARGETS)
def test_with_the_share_0_a_warm_hit_runs_no_frontend_and_compiles_nothing(
    versions, audited, audit, target
):
    folder, _, b = versions
    for door in ("kernel", "lowering", "program"):
        now = audited(folder / "B", door, audit)[2][target]
        assert now["code"] == b[target]["code"] and not now["said"], door
        done = (now["compiles"], now["make_ir"], now["ir_digests"])
        assert done == (0, 0, 0), (door, now)


# -- in this process --------------------------------------------------------------------------


@pytest.fixture(params=each_target())
def stale_root(tmp_path, request):
    """A root whose entry for the kernel with SCALE 9 holds the kernel with SCALE 2, for a
    target (each test runs on each), the module (its SCALE 9), and the target."""
    target = request.param
    tag = hashlib.sha256(str(tmp_path).encode()).hexdigest()[:8]
    module = kernel_module(tmp_path, f"hit_audit_{tag}", SOURCE.format(scale=BEFORE))
    before = machine_code(module.scaled, tmp_path / "A", target=target)
    module.SCALE = module.tl.constexpr(float(NOW))
    machine_code(module.scaled, tmp_path / "B", target=target)
    _plant(tmp_path / "A", tmp_path / "B", tmp_path / "stale", target, forged=False)
    return module, tmp_path / "stale", before, target


def test_without_the_audit_the_blind_spot_serves_the_stale_kernel(stale_root, monkeypatch):
    """(What the audit is for: the entry is served as it is.)"""
    module, root, before, target = stale_root
    monkeypatch.delenv("KERNELCACHE_AUDIT", raising=False)
    assert machine_code(module.scaled, root, target=target) == before


def test_an_audited_hit_compiled_from_other_ir_is_said_and_compiled_again(
    stale_root, monkeypatch, caplog, tmp_path
):
    module, root, before, target = stale_root
    monkeypatch.setenv("KERNELCACHE_AUDIT", "1")
    with caplog.at_level(logging.WARNING):
        now = machine_code(module.scaled, root, target=target)
    assert now != before
    assert now == machine_code(module.scaled, tmp_path / "fresh", target=target)
    said = [r.getMessage() for r in caplog.records if "AUDIT FAILED" in r.getMessage()]
    assert len(said) == 1 and module.scaled.__qualname__ in said[0], said


def test_an_audit_that_cannot_compile_uses_the_hit_as_it_is(stale_root, monkeypatch, caplog):
    module, root, before, target = stale_root
    monkeypatch.setenv("KERNELCACHE_AUDIT", "1")

    def broken(*args, **kwargs):
        raise RuntimeError("no compiler here")

    monkeypatch.setattr(hit_audit, "compile_source", broken)
    with caplog.at_level(logging.DEBUG, logger="bridge.compile.hit_audit"):
        assert machine_code(module.scaled, root, target=target) == before
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


@pytest.mark.parametrize("target", TARGETS)
def test_what_an_audited_kernel_is_compared_in(target):
    from bridge.entries.kernels import launch_fields
    from bridge.vendors.targets import parse_target

    parsed = parse_target(target)
    text = "ptx B" if target.startswith("cuda") else None  # (HSACO comes with no text)
    fresh = Compiled(b"code B", text, {"name": "k", "num_warps": 4}, ir="ir B")
    launch = launch_fields(fresh.metadata, parsed)

    def differs(meta, binary, ptx):
        return hit_audit.difference({**launch, **meta}, binary, ptx, fresh, parsed)

    assert differs({"ir": "ir B"}, b"code B", text) is None
    assert hit_audit.difference({}, b"code B", None, fresh, parsed) is None  # (nothing said)
    assert "other IR" in str(differs({"ir": "ir A"}, b"code B", text))
    assert "machine code" in str(differs({"ir": "ir B"}, b"code A", text))
    if text is not None:
        assert "PTX" in str(differs({"ir": "ir B"}, b"code B", "ptx A"))
    # what the machine code is launched with: a forged entry's warps, name or shared memory
    for field, forged in (("num_warps", 8), ("name", "kk"), ("shared", 1 << 16)):
        assert field in str(differs({field: forged}, b"code B", text)), field


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
