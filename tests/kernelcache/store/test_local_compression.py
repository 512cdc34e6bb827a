"""A root's entries compressed, as an option of its own configuration (``compression = zstd``
in its file, ``kernelcache -o compression=zstd``; off by default): a new artifact is written
as one zstd frame where that is smaller, its metadata unchanged (the artifact's own size and
digest); every read takes a packed or a plain artifact alike, so a root holds both; a damaged
packed artifact is a corrupt entry like any other, refused before it is inflated past the size
its metadata says."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
import zstandard
from artifact_images import launch, sized
from cli_support import kc, kc_json

import kernelcache
from kernelcache.store import Store
from kernelcache.store.compression import FRAME_MAGIC

META = launch("cubin", name="matmul", target="cuda:90", num_warps=4)


def _cubin(seed: int, size: int = 64 << 10) -> bytes:
    """A whole cubin whose body repeats, as machine code does (it compresses)."""
    return sized("cubin", size, hashlib.sha256(str(seed).encode()).digest() * 8)


def _key(seed: int) -> str:
    return hashlib.sha256(f"compression-{seed}".encode()).hexdigest()


def _compressing(root: Path) -> Path:
    assert kc(root, "-o", "compression=zstd").returncode == 0
    return root


def test_a_compressing_root_writes_frames_and_serves_the_artifacts(tmp_path):
    root = _compressing(tmp_path / "cache")
    cache = kernelcache.Cache(root)  # a job: the root's file says zstd
    data = _cubin(1)
    art = cache.put(_key(1), "cubin", data, META)
    on_disk = Path(art.path).read_bytes()
    assert on_disk.startswith(FRAME_MAGIC) and len(on_disk) < len(data) / 2
    assert zstandard.ZstdDecompressor().decompress(on_disk) == data
    doc = json.loads(Path(root / f"{_key(1)}.json").read_text())
    assert doc["size"] == len(data)  # the artifact's own size, as ever
    again = kernelcache.Cache(root).get(_key(1), "cubin")
    assert again is not None and again.data == data
    assert kc_json(root, "verify")["clean"]
    listed = kc_json(root, "ls")["entries"][0]
    assert listed["size"] == len(on_disk)  # what the file system says
    shown = kc_json(root, "show", _key(1))
    assert shown["status"] == "ok" and shown["size"] == len(data)


def test_a_root_holds_packed_and_plain_entries_alike(tmp_path):
    root = tmp_path / "cache"
    Store(root).put(_key(2), "cubin", _cubin(2), META)  # before: plain
    _compressing(root)
    kernelcache.Cache(root).put(_key(3), "cubin", _cubin(3), META)
    assert (root / f"{_key(2)}.cubin").read_bytes() == _cubin(2)
    assert (root / f"{_key(3)}.cubin").read_bytes().startswith(FRAME_MAGIC)
    assert kc(root, "-o", "compression=none").returncode == 0  # turned off: both still served
    cache = kernelcache.Cache(root)
    assert cache.get(_key(2), "cubin").data == _cubin(2)
    assert cache.get(_key(3), "cubin").data == _cubin(3)
    bundle = tmp_path / "b.tar"
    assert kc_json(root, "export", str(bundle))["entries"] == 2
    plain = tmp_path / "plain"
    assert kc_json(plain, "import", str(bundle))["imported"] == 2
    assert (plain / f"{_key(3)}.cubin").read_bytes() == _cubin(3)


def test_what_does_not_shrink_is_written_plain(tmp_path):
    root = _compressing(tmp_path / "cache")
    data = sized("cubin", 8192, os.urandom(8192))
    art = kernelcache.Cache(root).put(_key(4), "cubin", data, META)
    assert Path(art.path).read_bytes() == data


def _flipped(data: bytes) -> bytes:
    """``data`` with one byte of its middle changed."""
    middle = len(data) // 2
    return data[:middle] + bytes([data[middle] ^ 0xFF]) + data[middle + 1 :]


@pytest.mark.parametrize(
    "damage, said",
    [
        ("cut", "cut short"),
        ("flipped", "digest"),
        ("larger", "says 1,000,000 bytes, not 65,536 bytes"),
        ("trailing", "followed by other bytes"),
        ("not zstd", "artifact has"),
    ],
)
def test_a_damaged_packed_artifact_is_a_corrupt_entry(tmp_path, damage, said):
    root = _compressing(tmp_path / "cache")
    data = _cubin(5)
    art = kernelcache.Cache(root).put(_key(5), "cubin", data, META)
    frame = Path(art.path).read_bytes()
    other = sized("cubin", 1_000_000, b"\1")
    damaged = {
        "cut": frame[: len(frame) - 20],
        "flipped": zstandard.ZstdCompressor().compress(_flipped(data)),
        "larger": zstandard.ZstdCompressor().compress(other),  # (more than the entry is)
        "trailing": frame + b"x",
        "not zstd": b"\0" * 100,
    }[damage]
    if damage == "larger":
        damaged = damaged[: len(frame) - 1] if len(damaged) >= len(frame) else damaged
    Path(art.path).write_bytes(damaged)
    found = Store(root, readonly=True).read(_key(5))
    assert not isinstance(found, kernelcache.Artifact) and said in found.reason, found
    assert kernelcache.Cache(root).get(_key(5), "cubin") is None  # a miss, quarantined
    assert list((root / ".quarantine").iterdir())
