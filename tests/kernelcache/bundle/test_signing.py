"""Signed bundles, and the signing key's configuration: with KERNELCACHE_SIGNING_KEY (or a key
file) set, export signs every entry and import refuses entries without a valid signature; the
key never shows in messages or diagnostics."""

from __future__ import annotations

import io
import json
import os
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from artifact_images import elf_image
from bundle_files import write_bundle
from cli_support import files_under, kc, kc_json, put
from support import IS_ROOT, key_of, run_py

import kernelcache
from kernelcache.config import environment_in_effect, settings
from kernelcache.errors import ConfigError
from kernelcache.schema import encode_metadata
from kernelcache.store import Store

KEY_1 = "first-key-" + "0123456789abcdef" * 2
KEY_2 = "second-key-" + "fedcba9876543210" * 2


@pytest.fixture
def source(tmp_path: Path) -> Path:
    root = tmp_path / "source"
    for i in range(3):
        put(root, "matmul", "cuda:90", "cubin", 500 + i)
    return root


def _export(source: Path, bundle: Path, **env: str) -> None:
    proc = kc(source, "export", str(bundle), env=env)
    assert proc.returncode == 0, proc.stderr


def test_a_signed_bundle_imports_with_the_same_key(source, tmp_path):
    bundle = tmp_path / "b.tar"
    _export(source, bundle, KERNELCACHE_SIGNING_KEY=KEY_1)
    with tarfile.open(bundle) as tar:
        manifest = json.load(tar.extractfile("manifest.json"))
    assert all(e["hmac"].startswith("hmac-sha256:") for e in manifest["entries"])
    assert KEY_1.encode() not in bundle.read_bytes()
    doc = kc_json(tmp_path / "dest", "import", str(bundle), env={"KERNELCACHE_SIGNING_KEY": KEY_1})
    assert doc["imported"] == 3
    # signatures are transport: the entries stored are the plain ones
    for meta in (tmp_path / "dest").glob("*.json"):
        assert "hmac" not in json.loads(meta.read_text())
    # without a key, a signed bundle imports too (nothing to check it against)
    assert kc_json(tmp_path / "plain", "import", str(bundle))["imported"] == 3


@pytest.mark.parametrize("signed_with", [None, KEY_2], ids=["unsigned", "other-key"])
def test_a_bundle_not_signed_with_the_key_is_refused_whole(source, tmp_path, signed_with):
    bundle = tmp_path / "b.tar"
    _export(source, bundle, **({"KERNELCACHE_SIGNING_KEY": signed_with} if signed_with else {}))
    dest = tmp_path / "dest"
    for extra in ([], ["--dry-run"]):
        proc = kc(dest, "import", str(bundle), *extra, env={"KERNELCACHE_SIGNING_KEY": KEY_1})
        assert proc.returncode == 2, proc.stderr
        assert "signature" in proc.stderr or "not signed" in proc.stderr, proc.stderr
        assert "nothing was imported" in proc.stderr
    assert files_under(dest) == set()


def test_a_bundle_entry_with_other_bytes_under_a_valid_signature_is_refused(source, tmp_path):
    """Replacing an artifact and updating its size and both digests keeps the manifest
    consistent, but the signature covers the bytes themselves."""
    from kernelcache.schema import entry_digest
    from kernelcache.store import digest

    bundle = tmp_path / "b.tar"
    _export(source, bundle, KERNELCACHE_SIGNING_KEY=KEY_1)
    with tarfile.open(bundle) as tar:
        members = [(m, tar.extractfile(m).read()) for m in tar.getmembers()]
    manifest = json.loads(members[-1][1])
    evil = elf_image(b"EVIL" * 100)  # whole: only the signature tells it from ours
    first = manifest["entries"][0]
    first.update(size=len(evil), digest=digest(evil))
    first["entry_digest"] = entry_digest(first)
    forged = tmp_path / "forged.tar"
    with tarfile.open(forged, "w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members[:-1]:
            if info.name == f"entries/{first['key']}.{first['ext']}":
                data = evil
                info.size = len(evil)
            tar.addfile(info, io.BytesIO(data))
        body = json.dumps(manifest).encode()
        info = tarfile.TarInfo("manifest.json")
        info.size = len(body)
        tar.addfile(info, io.BytesIO(body))
    assert kc_json(tmp_path / "nokey", "import", str(forged), "--dry-run")["imported"] == 3
    proc = kc(tmp_path / "dest", "import", str(forged), env={"KERNELCACHE_SIGNING_KEY": KEY_1})
    assert proc.returncode == 2 and first["key"] in proc.stderr and "signature" in proc.stderr


#: a process without the bridge, as an earlier version was (a kernelcache that knew no launch
#: fields): puts one entry (its digest covers name and target only) and exports it, signed
#: with $KERNELCACHE_SIGNING_KEY
EXPORT_WITHOUT_THE_BRIDGE = """
import json, sys
from kernelcache.schema import fields
fields.COVERED.intersection_update({"name", "target"})  # what such a writer covered
from kernelcache.bundle import export_bundle
from kernelcache.config import settings
from kernelcache.maintenance.scan import scan
from kernelcache.store import Store
root, bundle, key, meta = sys.argv[1:]
Store(root).put(key, "bin", b"\\x7fELF code" * 50, json.loads(meta))
export_bundle(root, scan(root).entries, bundle, signing_key=settings().signing_secret())
assert "bridge" not in sys.modules
"""


def _export_without_the_bridge(tmp_path: Path, meta: dict[str, object]) -> tuple[Path, str]:
    bundle, key = tmp_path / "plain.tar", key_of("plain", json.dumps(meta))
    run_py(
        EXPORT_WITHOUT_THE_BRIDGE,
        str(tmp_path / "plain"),
        str(bundle),
        key,
        json.dumps(meta),
        KERNELCACHE_SIGNING_KEY=KEY_1,
    )
    return bundle, key


def _rewrite_manifest(bundle: Path, edit: Callable[[dict[str, Any]], None]) -> Path:
    """A copy of ``bundle`` whose manifest ``edit`` changed (members as they were)."""
    with tarfile.open(bundle) as tar:
        manifest = json.load(tar.extractfile("manifest.json"))
        entries = manifest.pop("entries")
        blobs = [tar.extractfile(f"entries/{e['key']}.{e['ext']}").read() for e in entries]
    manifest["entries"] = entries
    edit(manifest)
    return write_bundle(bundle.with_name("edited-" + bundle.name), blobs, **manifest)


def test_a_launch_field_its_writer_did_not_cover_is_refused_in_a_signed_bundle(tmp_path):
    """num_warps 4 -> 32 and shared 0 -> 200000 in a bundle signed by a writer that did not
    cover them: the signature still holds, but the importer (whose kernelcache command loads
    the bridge, which requires launch fields covered) refuses the bundle rather than cover
    the edited values itself."""
    meta = {"name": "add_kernel", "target": "cuda:90", "num_warps": 4, "shared": 0}
    bundle, key = _export_without_the_bridge(tmp_path, meta)

    def edit(manifest: dict[str, Any]) -> None:
        (entry,) = manifest["entries"]
        assert entry["covers"] == ["name", "target"] and entry["hmac"]
        entry.update(num_warps=32, shared=200_000)

    forged = _rewrite_manifest(bundle, edit)
    dest = tmp_path / "dest"
    for extra in ([], ["--dry-run"]):
        proc = kc(dest, "import", str(forged), *extra, env={"KERNELCACHE_SIGNING_KEY": KEY_1})
        assert proc.returncode == 2, proc.stdout
        assert key in proc.stderr and "does not cover num_warps, shared" in proc.stderr
    assert files_under(dest) == set()


def test_a_bundle_entry_is_imported_as_written(tmp_path):
    """An entry whose writer covered less than the importer declares (and which holds none
    of the fields it did not cover): stored as written, its signature dropped; never with
    a wider covers list or another entry digest."""
    bundle, key = _export_without_the_bridge(tmp_path, {"name": "k", "target": "cuda:90"})
    dest = tmp_path / "dest"
    doc = kc_json(dest, "import", str(bundle), env={"KERNELCACHE_SIGNING_KEY": KEY_1})
    assert doc["imported"] == 1
    with tarfile.open(bundle) as tar:
        (entry,) = json.load(tar.extractfile("manifest.json"))["entries"]
    del entry["hmac"]
    assert (tmp_path / "plain" / f"{key}.json").read_bytes() == encode_metadata(entry)
    assert (dest / f"{key}.json").read_bytes() == encode_metadata(entry)


@pytest.mark.parametrize("entry_digest_too", [False, True], ids=["as-is", "digest-recomputed"])
def test_a_covers_list_edited_after_signing_is_refused(tmp_path, entry_digest_too):
    """Dropping from ``covers`` a launch field the entry does not hold changes no covered
    value: the entry digest and the signature cover the list itself."""
    from kernelcache.schema import entry_digest

    source = tmp_path / "source"
    Store(source).put(key_of("covers"), "bin", b"code" * 100, {"name": "k", "num_warps": 4})
    bundle = tmp_path / "b.tar"
    _export(source, bundle, KERNELCACHE_SIGNING_KEY=KEY_1)

    def edit(manifest: dict[str, Any]) -> None:
        (entry,) = manifest["entries"]
        assert "tmem_size" in entry["covers"] and "tmem_size" not in entry
        entry["covers"].remove("tmem_size")
        if entry_digest_too:
            entry["entry_digest"] = entry_digest(entry)

    forged = _rewrite_manifest(bundle, edit)
    proc = kc(tmp_path / "dest", "import", str(forged), env={"KERNELCACHE_SIGNING_KEY": KEY_1})
    assert proc.returncode == 2
    assert ("signature" if entry_digest_too else "entry digest mismatch") in proc.stderr
    assert files_under(tmp_path / "dest") == set()


def test_a_key_file(source, tmp_path):
    key_file = tmp_path / "key"
    key_file.write_text(KEY_1 + "\n")
    os.chmod(key_file, 0o600)
    bundle = tmp_path / "b.tar"
    _export(source, bundle, KERNELCACHE_SIGNING_KEY_FILE=str(key_file))
    env = {"KERNELCACHE_SIGNING_KEY": KEY_1}  # the same key, given directly
    assert kc_json(tmp_path / "dest", "import", str(bundle), env=env)["imported"] == 3


@pytest.mark.parametrize(
    "env, message",
    [
        ({"KERNELCACHE_SIGNING_KEY": "short"}, "at least 16 bytes"),
        ({"KERNELCACHE_SIGNING_KEY_FILE": "/nonexistent/key"}, "cannot read it"),
    ],
)
def test_bad_key_settings_are_clear_errors(tmp_path, env, message):
    proc = kc(tmp_path, "export", str(tmp_path / "b.tar"), env=env)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert "short" not in proc.stderr.replace("at least", "")


def test_a_key_file_readable_by_everyone_is_refused(tmp_path, monkeypatch):
    key_file = tmp_path / "key"
    key_file.write_text(KEY_1)
    os.chmod(key_file, 0o644)
    monkeypatch.setenv("KERNELCACHE_SIGNING_KEY_FILE", str(key_file))
    with pytest.raises(ConfigError, match="readable by every user"):
        settings().signing_secret()
    # a job is not failed: its remote tier is off (never unsigned values instead), warned once
    cache = kernelcache.Cache(tmp_path / "root", readonly_roots=(), remote="redis://127.0.0.1:1/0")
    assert cache.remote is None
    os.chmod(key_file, 0o640)
    assert settings().signing_secret() == KEY_1.encode()
    monkeypatch.setenv("KERNELCACHE_SIGNING_KEY", KEY_2)
    with pytest.raises(ConfigError, match="not both"):
        settings().signing_secret()


def test_the_key_never_shows(monkeypatch):
    monkeypatch.setenv("KERNELCACHE_SIGNING_KEY", KEY_1)
    assert environment_in_effect()["KERNELCACHE_SIGNING_KEY"] == "***"
    assert KEY_1 not in repr(settings())
    monkeypatch.setenv("KERNELCACHE_SIGNING_KEY", "too-short-" + KEY_1[:3])
    with pytest.raises(ConfigError) as info:
        settings().signing_secret()
    assert KEY_1[:3] not in str(info.value).replace("at least", "")
    proc = kc(None, "doctor", "--json", env={"KERNELCACHE_SIGNING_KEY": KEY_1})
    assert KEY_1 not in proc.stdout + proc.stderr


@pytest.mark.skipif(not IS_ROOT, reason="needs root to create files of another user")
def test_import_follows_the_configured_trust_policy(tmp_path):
    """An entry of another user that the group policy trusts and the owner policy does not:
    import counts it as present under group, and replaces it under owner."""
    from kernelcache.store import Store

    nobody = 65534
    root = tmp_path / "shared"
    root.mkdir()
    os.chown(root, 0, nobody)
    key = key_of("import-trust")
    Store(root).put(key, "bin", b"someone else's code", {})
    for name in (f"{key}.bin", f"{key}.json"):
        os.chown(root / name, nobody, nobody)
    source = tmp_path / "source"
    Store(source).put(key, "bin", b"our code", {})
    bundle = tmp_path / "b.tar"
    _export(source, bundle)
    grouped = kc_json(root, "import", str(bundle), "--dry-run")
    assert (grouped["imported"], grouped["present"]) == (0, 1)
    owned = kc_json(root, "import", str(bundle), env={"KERNELCACHE_TRUST": "owner"})
    assert (owned["imported"], owned["present"]) == (1, 0)
    assert Store(root, trust="owner").read(key).data == b"our code"
