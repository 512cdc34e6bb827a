"""Remote values are zstd-compressed where that is smaller, and readers take both forms: a
compressed entry written through a real redis-server comes back whole to another cache, a plain
value (a writer with compression off, or an entry that does not shrink) is read as before, and
a hostile compressed value is a miss said once, never an exception or an unbounded inflation."""

from __future__ import annotations

import hashlib
import struct

import pytest
import zstandard
from artifact_images import launch, sized
from remote_workers import key_of

import kernelcache
from kernelcache.problem import Problem
from kernelcache.remote import MAGIC, decode_value, encode_value, make_value
from kernelcache.remote.codec import MAX_INFLATED, ZMAGIC, inflate_value
from kernelcache.store import make_metadata

META = launch("cubin", name="matmul", target="cuda:90", num_warps=4)


def _cubin(key: str, size: int = 200_000) -> bytes:
    """A whole cubin whose body repeats, as machine code does (it compresses)."""
    return sized("cubin", size, hashlib.sha256(key.encode()).digest() * 4)


def test_a_value_is_compressed_where_smaller_and_read_back_whole(server, tmp_path):
    key = key_of(1)
    data = _cubin(key)
    writer = kernelcache.Cache(tmp_path / "w", readonly_roots=(), remote=server.url)
    writer.put(key, "cubin", data, META)
    stored = server.client().get(writer.remote.name(key))
    plain = encode_value(writer.get(key, "cubin").meta, data)
    assert stored.startswith(ZMAGIC) and len(stored) < len(plain) / 4
    assert inflate_value(stored) == plain
    reader = kernelcache.Cache(tmp_path / "r", readonly_roots=(), remote=server.url)
    art = reader.get(key, "cubin")
    assert art is not None and art.source == "remote" and art.data == data


def test_a_plain_value_is_read_as_before(server, tmp_path):
    key = key_of(2)
    data = _cubin(key, 4096)
    doc = make_metadata(key, "cubin", data, META)
    tier = kernelcache.Cache(tmp_path / "w", readonly_roots=(), remote=server.url).remote
    server.client().set(tier.name(key), encode_value(doc, data))
    reader = kernelcache.Cache(tmp_path / "r", readonly_roots=(), remote=server.url)
    art = reader.get(key, "cubin")
    assert art is not None and art.data == data


def test_what_does_not_shrink_is_stored_plain():
    key = key_of(3)
    data = sized("bin", 4096, hashlib.shake_256(b"noise").digest(4096))
    value = make_value(key, "bin", data, {}, None)
    assert value.startswith(MAGIC)
    found = decode_value(value, key)
    assert not isinstance(found, Problem) and found[0] == data


def _plain(key: str) -> bytes:
    data = _cubin(key, 8192)
    return encode_value(make_metadata(key, "cubin", data, META), data)


@pytest.mark.parametrize(
    "case, said",
    [
        ("no size", "its zstd frame says -1 bytes, not a size an entry may have"),
        ("too large", "not a size an entry may have"),
        ("cut short", "cut short"),
        ("trailing", "followed by other bytes"),
        ("not zstd", "it is not a zstd frame"),
        ("bad inside", "does not start with the kernelcache header"),
    ],
)
def test_a_hostile_compressed_value_is_refused(case, said):
    key = key_of(4)
    plain = _plain(key)
    frame = zstandard.ZstdCompressor(level=3).compress(plain)
    values = {
        "no size": zstandard.ZstdCompressor(write_content_size=False).compress(plain),
        # a header claiming more than an entry may be: refused before anything is inflated
        "too large": _with_size(MAX_INFLATED + 1),
        "cut short": frame[: len(frame) // 2],
        "trailing": frame + b"more",
        "not zstd": b"\0" * 64,
        "bad inside": zstandard.ZstdCompressor().compress(b"XXXX" + plain[4:]),
    }
    found = decode_value(ZMAGIC + values[case], key)
    assert isinstance(found, Problem) and said in found.reason, found


def _with_size(size: int) -> bytes:
    """A zstd frame header saying ``size`` bytes, with one empty raw block after it."""
    descriptor = 0b1100_0000  # 8-byte frame content size, single segment off, no checksum
    header = b"\x28\xb5\x2f\xfd" + bytes([descriptor, 0x58]) + struct.pack("<Q", size)
    return header + b"\x01\x00\x00"


def test_a_hostile_value_in_redis_is_a_miss(server, tmp_path, caplog_warnings):
    key = key_of(5)
    tier = kernelcache.Cache(tmp_path / "w", readonly_roots=(), remote=server.url).remote
    server.client().set(tier.name(key), ZMAGIC + _with_size(MAX_INFLATED + 1))
    reader = kernelcache.Cache(tmp_path / "r", readonly_roots=(), remote=server.url)
    assert reader.get(key, "cubin") is None
    assert reader.remote.counters["rejected"] == 1
    assert "not a size an entry may have" in caplog_warnings.text
