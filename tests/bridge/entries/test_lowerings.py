"""Program entries (``bridge.entries.lowerings``): a warm lowering of a program reads one entry for all
its calls, serves nothing its calls' own entries would not, and degrades to those entries when a
program entry is missing, edited, odd or written by another program.

Lowered for cuda on this CPU machine (``embed="ptx"`` under jaxlib < 0.11.1, inline above).
"""

from __future__ import annotations

import json
import os
import struct
import threading
from collections import Counter
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from bridge_helpers import forget_lowerings, forget_programs, lowered_module
from cli_support import kc

import kernelcache
from bridge.cli import tune
from bridge.entries import lowerings
from bridge.entries.lowerings import LOWERING, PROGRAM, VARIANTS
from bridge.lowering import lower as bridge_call
from examples import ops

F32 = jax.ShapeDtypeStruct((4096,), jnp.float32)
F16 = jax.ShapeDtypeStruct((4096,), jnp.float16)
A = jax.ShapeDtypeStruct((512, 256), jnp.bfloat16)
B = jax.ShapeDtypeStruct((256, 384), jnp.bfloat16)
ARGS = (F32, F16, A, B)


@pytest.fixture
def cache(tmp_path):
    return kernelcache.Cache(tmp_path / "root", readonly_roots=(), remote="")


@pytest.fixture
def reads(monkeypatch):
    """The extensions of the entries read since the last clear()."""
    seen: Counter[str] = Counter()
    real = kernelcache.Cache.get

    def get(self, key, ext, **kw):
        seen[ext] += 1
        return real(self, key, ext, **kw)

    monkeypatch.setattr(kernelcache.Cache, "get", get)
    return seen


def program(cache, *, last_block: int = 1024, **kw):
    """A new function each time (JAX caches the lowering of a traced one): 3 distinct calls,
    one of them autotuned."""

    def run(x, h, a, b):
        opts = {"target": "cuda:90", "cache": cache, **kw}
        return (
            ops.add(x, x, **opts),
            ops.matmul(a, b, **opts),
            ops.add(h, h, block=last_block, **opts),
        )

    return run


def text(fn) -> str:
    return lowered_module(fn, *ARGS).as_text()


def lowering_reads(seen: Counter[str]) -> int:
    return seen[LOWERING.ext] + seen[VARIANTS.ext]


def test_a_warm_program_reads_one_entry_and_lowers_byte_identical(cache, assembled, reads):
    cold = text(program(cache))
    assert len(assembled) == 3
    assert len(list(Path(cache.root).glob(f"*.{PROGRAM.ext}"))) == 1
    reads.clear()
    warm = text(program(cache))
    assert len(assembled) == 3
    assert reads[PROGRAM.ext] == 1 and lowering_reads(reads) == 0
    assert forget_lowerings(cache.root) == 5  # 3 lowerings, 1 variants list, their program
    rebuilt = text(program(cache))
    assert len(assembled) == 6
    assert cold == warm == rebuilt
    assert kc(cache.root, "verify").returncode == 0


def test_the_calls_own_entries_serve_a_program_without_its_entry(cache, assembled, reads):
    cold = text(program(cache))
    assert forget_programs(cache.root) == 1
    reads.clear()
    assert text(program(cache)) == cold
    assert len(assembled) == 3  # replayed from the calls' own entries
    assert reads[PROGRAM.ext] == 1 and lowering_reads(reads) == 4
    reads.clear()
    assert text(program(cache)) == cold  # whose program entry was written again
    assert reads[PROGRAM.ext] == 1 and lowering_reads(reads) == 0


def test_programs_that_share_their_first_calls_each_read_their_own(cache, assembled, reads):
    first = text(program(cache))
    other = text(program(cache, last_block=512))  # the same first two calls, another last one
    assert len(assembled) == 4
    assert len(list(Path(cache.root).glob(f"*.{PROGRAM.ext}"))) == 2
    reads.clear()
    assert text(program(cache, last_block=512)) == other
    assert reads[PROGRAM.ext] == 2 and lowering_reads(reads) == 0
    reads.clear()
    assert text(program(cache)) == first
    assert reads[PROGRAM.ext] == 1 and lowering_reads(reads) == 0
    assert len(assembled) == 4


def test_a_changed_call_is_lowered_again_and_the_rest_served(cache, assembled, reads):
    text(program(cache))
    reads.clear()
    changed = text(program(cache, last_block=2048))  # only the last call changed
    assert len(assembled) == 4
    assert reads[PROGRAM.ext] == 2  # the first call's, and the changed call's (none yet)
    assert reads[LOWERING.ext] == 1  # the changed call's own: a miss
    forget_lowerings(cache.root)
    assert text(program(cache, last_block=2048)) == changed


def _program_entry(items: list[list[object]], blobs: bytes = b"x") -> bytes:
    head = json.dumps({"items": items}).encode()
    return struct.pack(">4sI", b"KCP1", len(head)) + head + blobs


KEY = "ab" * 32
HEAD = {"embed": "ptx", "autotuned": False, "needs": [0]}
ODD_PROGRAMS = {
    "empty": b"",
    "magic": b"XXXX" + _program_entry([[KEY, "every", None, HEAD, 1]])[4:],
    "size-lie": struct.pack(">4sI", b"KCP1", 1 << 31) + b"{}",
    "not-json": struct.pack(">4sI", b"KCP1", 2) + b"\xff{",
    "no-items": _program_entry([]),
    "row-length": _program_entry([[KEY, "every", None, HEAD]]),
    "bad-key": _program_entry([["AB" * 32, "every", None, HEAD, 1]]),
    "bad-state": _program_entry([[KEY, "-1", None, HEAD, 1]]),
    "one-variant": _program_entry([[KEY, "every", [KEY], HEAD, 1]]),
    "bad-head": _program_entry([[KEY, "every", None, {**HEAD, "needs": [-1]}, 1]]),
    "length-lie": _program_entry([[KEY, "every", None, HEAD, 99]]),
    "trailing-bytes": _program_entry([[KEY, "every", None, HEAD, 1]], b"xy"),
    "bool-length": _program_entry([[KEY, "every", None, HEAD, True]]),
    "deep": struct.pack(">4sI", b"KCP1", 200_000) + b"[" * 100_000 + b"]" * 100_000,
}


@pytest.mark.parametrize("raw", ODD_PROGRAMS.values(), ids=ODD_PROGRAMS.keys())
def test_an_odd_program_entry_is_a_miss(raw):
    assert lowerings.decode_program(raw) is None


@pytest.mark.parametrize("edit", ["flipped-byte", "another-programs-items"])
def test_an_edited_or_foreign_program_entry_is_never_served(cache, assembled, reads, edit):
    cold = text(program(cache))
    (path,) = Path(cache.root).glob(f"*.{PROGRAM.ext}")
    if edit == "flipped-byte":  # the digest refuses it: quarantined
        raw = bytearray(path.read_bytes())
        raw[-1] ^= 0xFF
        path.write_bytes(bytes(raw))
    else:  # well formed and signed, but its first item is not the call that looks it up
        items = lowerings.decode_program(path.read_bytes())
        assert items is not None and len(items) == 3
        path.with_suffix(".json").unlink()
        path.unlink()
        cache.put(path.stem, PROGRAM.ext, lowerings.encode_program(items[1:]), {"kind": "lowering"})
    reads.clear()
    assert text(program(cache)) == cold
    assert len(assembled) == 3  # served by the calls' own entries
    assert lowering_reads(reads) == 4


def _damaged(opaque: bytes) -> bytes:
    """``opaque`` with one byte of its compressed body changed: it no longer inflates."""
    raw = bytearray(opaque)
    raw[len(raw) // 2] ^= 0x55
    return bytes(raw)


@pytest.mark.parametrize("which", ["program", "lowering"])
def test_an_entry_whose_opaque_does_not_inflate_is_a_corrupt_miss(cache, assembled, which):
    """Written with its digests made again (by a writer the trust policy trusts), an entry
    whose opaque cannot be inflated is never served: quarantined, counted, lowered again."""
    cold = text(program(cache))
    (path,) = Path(cache.root).glob(f"*.{PROGRAM.ext}")
    items = lowerings.decode_program(path.read_bytes())
    assert items is not None
    if which == "program":
        first, second, *rest = items
        lowered = second.lowered
        bad = lowerings.Item(
            second.key,
            second.state,
            second.variants,
            lowerings.Lowered(_damaged(lowered.opaque), lowered.embed, lowered.autotuned),
        )
        data = lowerings.encode_program([first, bad, *rest])
    else:  # the calls' own entries only: the first call's lowering entry
        forget_programs(cache.root)
        path = Path(cache.root) / f"{LOWERING.key(items[0].key, items[0].state)}.lowering"
        done = lowerings.decode(path.read_bytes())
        assert done is not None
        data = lowerings.encode(lowerings.Lowered(_damaged(done.opaque), done.embed, False))
    path.with_suffix(".json").unlink()
    path.unlink()
    cache.put(path.stem, path.suffix[1:], data, {"kind": "lowering"})  # digests made again
    before = kernelcache.process_stats()["corrupt"]
    assert text(program(cache)) == cold
    assert kernelcache.process_stats()["corrupt"] == before + 1
    (moved,) = Path(cache.root, ".quarantine").glob(f"{path.stem}.{path.suffix[1:]}.*")
    assert moved.read_bytes() == data
    if path.exists():  # (the entry, stored again by this lowering: whole)
        raw = path.read_bytes()
        if which == "program":
            again = [i.lowered for i in lowerings.decode_program(raw) or ()]
        else:
            again = [lowerings.decode(raw)]
        assert again and all(d is not None and lowerings.whole(d.opaque) for d in again)


def test_a_warm_process_inflates_no_opaque_its_user_checked(cache, assembled, monkeypatch):
    """The process that writes a program entry records that its opaques inflate; a later
    lowering by the same user checks none of them again, until the record is gone or is not
    this user's."""
    inflated: list[bytes] = []
    real = lowerings.whole

    def whole(opaque: bytes) -> bool:
        inflated.append(opaque)
        return real(opaque)

    monkeypatch.setattr(lowerings, "whole", whole)
    cold = text(program(cache))
    assert inflated == []  # (built here: nothing to check)
    assert text(program(cache)) == cold and inflated == []
    (record,) = Path(cache.root, ".checked").iterdir()
    record.unlink()
    assert text(program(cache)) == cold and len(inflated) == 3  # checked, and recorded again
    (record,) = Path(cache.root, ".checked").iterdir()
    if os.geteuid() == 0:  # a record this user does not own vouches for nothing
        os.chown(record, 65534, -1)
        inflated.clear()
        assert text(program(cache)) == cold and len(inflated) == 3


def test_a_decision_made_later_is_read_from_the_calls_entry(tmp_path, cache, monkeypatch, reads):
    text(program(cache))  # the program entry holds the matmul's every-config lowering
    manifest = tmp_path / "manifest.jsonl"
    monkeypatch.setenv("KERNELCACHE_RECORD", str(manifest))
    lowered_module(program(cache, autotune="runtime"), *ARGS)
    monkeypatch.delenv("KERNELCACHE_RECORD")
    (result,) = tune.tune(str(manifest), cache, pins={"matmul_kernel": 1})
    assert result.status == "pinned"
    decided = text(program(cache))
    reads.clear()
    assert text(program(cache)) == decided
    assert reads[PROGRAM.ext] == 1
    assert reads[LOWERING.ext] == 1  # the decided state, which the program lacks
    forget_lowerings(cache.root)
    assert text(program(cache)) == decided


def test_a_program_is_stored_when_jax_does_not_report_its_end(cache, assembled, monkeypatch):
    monkeypatch.setattr(bridge_call, "_MODULE_EVENT", "not an event JAX sends")
    text(program(cache))
    assert not list(Path(cache.root).glob(f"*.{PROGRAM.ext}"))  # still open
    text(program(cache, last_block=512))  # the next module's first call closes it
    assert len(list(Path(cache.root).glob(f"*.{PROGRAM.ext}"))) == 1


def test_threads_lowering_at_once_keep_their_programs_apart(cache, assembled, reads):
    cold = [text(program(cache)), text(program(cache, last_block=512))]
    forget_programs(cache.root)
    barrier = threading.Barrier(2)
    found: dict[int, str] = {}

    def lower(i: int) -> None:
        barrier.wait()
        found[i] = text(program(cache, last_block=(1024, 512)[i]))

    threads = [threading.Thread(target=lower, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [found[0], found[1]] == cold
    assert len(assembled) == 4  # every call served by its own entries
    for block in (1024, 512, 1024, 512):  # the program entries written meanwhile: any missing
        text(program(cache, last_block=block))  # is written by the first of these
    reads.clear()
    assert [text(program(cache)), text(program(cache, last_block=512))] == cold
    assert lowering_reads(reads) == 0 and reads[PROGRAM.ext] <= 4


def test_an_opaque_that_inflates_a_thousand_times_is_refused_in_bounded_memory():
    """A stored opaque is inflated in chunks that are let go and no further than a bridge's
    opaque inflates: a zlib bomb (a quarter of a megabyte inflating to 256 MiB) is not whole,
    and checking it holds a few megabytes at most (it held all it inflated to before)."""
    import tracemalloc
    import zlib

    packer, zeros = zlib.compressobj(1), bytes(1 << 20)
    bomb = b"".join(packer.compress(zeros) for _ in range(256)) + packer.flush()  # 256 MiB
    honest = zlib.compress(os.urandom(1 << 20) + b"\0" * (8 << 20))
    tracemalloc.start()
    try:
        assert not lowerings.whole(bomb)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, peak
    assert lowerings.whole(honest)
