"""Mayhem: damage entries on disk in every way we know; each is detected, quarantined, rebuilt."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from artifact_images import elf_image, launch
from support import key_of

import kernelcache
from kernelcache import stats

PAYLOAD = elf_image(bytes(range(256)) * 64)  # a whole cubin of 16 KiB and some
META = launch(name="k")  # what a cubin is launched with


def _flip_byte(root: Path, key: str) -> None:
    path = root / f"{key}.cubin"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def _truncate(root: Path, key: str) -> None:
    path = root / f"{key}.cubin"
    path.write_bytes(path.read_bytes()[:100])


def _extend(root: Path, key: str) -> None:
    with open(root / f"{key}.cubin", "ab") as f:
        f.write(b"\0")


def _empty_artifact(root: Path, key: str) -> None:
    (root / f"{key}.cubin").write_bytes(b"")


def _delete_artifact(root: Path, key: str) -> None:
    (root / f"{key}.cubin").unlink()


def _garbage_metadata(root: Path, key: str) -> None:
    (root / f"{key}.json").write_bytes(b"\x00\xff{not json")


def _truncated_metadata(root: Path, key: str) -> None:
    path = root / f"{key}.json"
    path.write_bytes(path.read_bytes()[:20])


def _metadata_other_key(root: Path, key: str) -> None:
    path = root / f"{key}.json"
    doc = json.loads(path.read_text())
    doc["key"] = "0" * 32
    path.write_text(json.dumps(doc))


def _metadata_wrong_digest(root: Path, key: str) -> None:
    path = root / f"{key}.json"
    doc = json.loads(path.read_text())
    doc["digest"] = "xxh3_128:" + "0" * 32
    path.write_text(json.dumps(doc))


def _metadata_future_format(root: Path, key: str) -> None:
    path = root / f"{key}.json"
    doc = json.loads(path.read_text())
    doc["format"] = 999
    path.write_text(json.dumps(doc))


def _metadata_is_list(root: Path, key: str) -> None:
    (root / f"{key}.json").write_text("[1, 2, 3]")


def _artifact_symlink(root: Path, key: str) -> None:
    path = root / f"{key}.cubin"
    decoy = root.parent / "decoy.bin"
    decoy.write_bytes(path.read_bytes())  # even identical bytes behind a link are refused
    path.unlink()
    path.symlink_to(decoy)


def _metadata_symlink(root: Path, key: str) -> None:
    path = root / f"{key}.json"
    decoy = root.parent / "decoy.json"
    decoy.write_bytes(path.read_bytes())
    path.unlink()
    path.symlink_to(decoy)


def _artifact_is_directory(root: Path, key: str) -> None:
    path = root / f"{key}.cubin"
    path.unlink()
    path.mkdir()


def _artifact_fifo(root: Path, key: str) -> None:
    path = root / f"{key}.cubin"
    path.unlink()
    os.mkfifo(path)  # opening it for reading would block forever without O_NONBLOCK


def _metadata_fifo(root: Path, key: str) -> None:
    path = root / f"{key}.json"
    path.unlink()
    os.mkfifo(path)


DAMAGE: dict[str, Callable[[Path, str], None]] = {
    "flip-byte": _flip_byte,
    "truncate": _truncate,
    "extend": _extend,
    "empty-artifact": _empty_artifact,
    "delete-artifact": _delete_artifact,
    "garbage-metadata": _garbage_metadata,
    "truncated-metadata": _truncated_metadata,
    "metadata-other-key": _metadata_other_key,
    "metadata-wrong-digest": _metadata_wrong_digest,
    "metadata-future-format": _metadata_future_format,
    "metadata-is-list": _metadata_is_list,
    "artifact-symlink": _artifact_symlink,
    "metadata-symlink": _metadata_symlink,
    "artifact-is-directory": _artifact_is_directory,
    "artifact-fifo": _artifact_fifo,
    "metadata-fifo": _metadata_fifo,
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_damage_is_detected_quarantined_and_rebuilt(root, damage, caplog_warnings):
    cache = kernelcache.Cache(root, readonly_roots=())
    key = key_of("mayhem", damage)
    cache.put(key, "cubin", PAYLOAD, META)
    DAMAGE[damage](root, key)
    before = stats.process_stats()["corrupt"]

    assert cache.get(key, "cubin") is None
    assert stats.process_stats()["corrupt"] == before + 1
    quarantined = sorted(p.name for p in (root / ".quarantine").iterdir())
    assert any(name.endswith(".reason") for name in quarantined)
    reason = json.loads(next((root / ".quarantine").glob("*.reason")).read_text())
    assert reason["key"] == key and reason["reason"]
    assert not (root / f"{key}.json").exists() and not (root / f"{key}.json").is_symlink()
    assert any("quarantined" in r.getMessage() for r in caplog_warnings.records)

    builds = []
    art = cache.get_or_create(key, "cubin", lambda: (builds.append(1) or PAYLOAD, META))
    assert builds == [1] and art.data == PAYLOAD and art.source == "local"
    again = cache.get(key, "cubin")
    assert again is not None and again.data == PAYLOAD
    assert Path(again.path).read_bytes() == PAYLOAD


def test_orphan_artifact_is_a_miss_and_is_replaced(root):
    """An artifact without metadata (a writer killed between the two renames) is not an entry."""
    cache = kernelcache.Cache(root, readonly_roots=())
    key = key_of("orphan")
    cache.put(key, "cubin", PAYLOAD, META)
    (root / f"{key}.json").unlink()
    (root / f"{key}.cubin").write_bytes(b"half-written garbage")
    assert cache.get(key, "cubin") is None
    art = cache.get_or_create(key, "cubin", lambda: (PAYLOAD, META))
    assert art.data == PAYLOAD and (root / f"{key}.cubin").read_bytes() == PAYLOAD


def test_corrupt_entry_in_readonly_root_is_skipped_not_touched(tmp_path, caplog_warnings):
    image, local = tmp_path / "image", tmp_path / "local"
    key = key_of("ro-corrupt")
    kernelcache.Cache(image, readonly_roots=()).put(key, "cubin", PAYLOAD, META)
    _flip_byte(image, key)
    damaged = (image / f"{key}.cubin").read_bytes()
    cache = kernelcache.Cache(local, readonly_roots=[image])
    assert cache.get(key, "cubin") is None
    art = cache.get_or_create(key, "cubin", lambda: (PAYLOAD, META))
    assert art.source == "local" and art.data == PAYLOAD
    assert (image / f"{key}.cubin").read_bytes() == damaged
    assert not (image / ".quarantine").exists()
    assert cache.get(key, "cubin").data == PAYLOAD


def test_quarantine_keeps_bytes_for_inspection(root):
    cache = kernelcache.Cache(root, readonly_roots=())
    key = key_of("inspect")
    cache.put(key, "cubin", PAYLOAD, META)
    _flip_byte(root, key)
    damaged = (root / f"{key}.cubin").read_bytes()
    assert cache.get(key, "cubin") is None
    kept = [p for p in (root / ".quarantine").iterdir() if p.name.startswith(f"{key}.cubin.")]
    assert len(kept) == 1 and kept[0].read_bytes() == damaged


def test_repeated_damage_is_quarantined_each_time(root):
    cache = kernelcache.Cache(root, readonly_roots=())
    key = key_of("repeat")
    for round_ in range(3):
        cache.get_or_create(key, "cubin", lambda: (PAYLOAD, META))
        _flip_byte(root, key)
        assert cache.get(key, "cubin") is None
        reasons = list((root / ".quarantine").glob("*.reason"))
        assert len(reasons) == round_ + 1
    assert os.listdir(root / ".tmp") == []
