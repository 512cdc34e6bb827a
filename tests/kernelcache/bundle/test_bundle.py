"""Bundles: export and import round trips (tar and tar+zstd), and hostile bundles of every kind
rejected with a clear error and nothing written."""

from __future__ import annotations

import gzip
import io
import json
import os
import tarfile
from pathlib import Path

import pytest
import zstandard
from cli_support import files_under, kc, kc_json, put
from support import key_of, run_py

from kernelcache.schema import FORMAT_VERSION, entry_digest
from kernelcache.store import Store, digest


@pytest.fixture
def source(tmp_path: Path) -> Path:
    root = tmp_path / "source"
    for i in range(3):
        put(root, "matmul", "cuda:90", "cubin", 500 + i)
    put(root, "softmax", "hip:gfx942", "hsaco", 800)
    put(root, "softmax", "cuda:80", "ptx", 900)
    return root


def _entries(root: Path) -> dict[str, tuple[dict, bytes]]:
    out = {}
    for meta_path in root.glob("*.json"):
        meta = json.loads(meta_path.read_text())
        out[meta["key"]] = (meta, (root / f"{meta['key']}.{meta['ext']}").read_bytes())
    return out


@pytest.mark.parametrize("name", ["bundle.tar", "bundle.tar.zst", "kernels.bundle"])
def test_round_trip(source, tmp_path, name):
    """zstd by default, but for a name that says a plain tar; an import takes either."""
    bundle = tmp_path / name
    doc = kc_json(source, "export", str(bundle))
    assert doc["entries"] == 5 and doc["skipped"] == []
    zstd = not name.endswith(".tar")
    assert doc["compression"] == ("zstd" if zstd else "none")
    assert (bundle.read_bytes()[:4] == b"\x28\xb5\x2f\xfd") == zstd
    compat = doc["compatibility"]
    assert compat["targets"] == ["cuda:80", "cuda:90", "hip:gfx942"]
    assert compat["exts"] == ["cubin", "hsaco", "ptx"]
    assert "kernelcache" in compat["producers"]
    dest = tmp_path / "dest"
    doc = kc_json(dest, "import", str(bundle))
    assert (doc["entries"], doc["imported"], doc["present"]) == (5, 5, 0)
    # every document as written (created, producer, covers, entry digest) and every artifact
    assert _entries(dest) == _entries(source)
    for meta in source.glob("*.json"):
        assert (dest / meta.name).read_bytes() == meta.read_bytes()
    again = kc_json(dest, "import", str(bundle))
    assert (again["imported"], again["present"]) == (0, 5)
    assert kc_json(dest, "verify")["clean"] is True


def test_export_filters_and_overwrite(source, tmp_path):
    bundle = tmp_path / "cuda.tar"
    doc = kc_json(source, "export", str(bundle), "--target", "cuda:90", "--target", "cuda:80")
    assert doc["entries"] == 4
    refused = kc(source, "export", str(bundle), "--kernel", "softmax")
    assert refused.returncode == 2 and "--force" in refused.stderr  # 2: nothing was done
    doc = kc_json(source, "export", str(bundle), "--kernel", "softmax", "--force")
    assert doc["entries"] == 2
    dest = tmp_path / "dest"
    kc_json(dest, "import", str(bundle))
    assert {m["name"] for m, _ in _entries(dest).values()} == {"softmax"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cuda.tar", "dest", "source"]


def test_import_dry_run_and_conflicts(source, tmp_path):
    bundle = tmp_path / "b.tar"
    kc_json(source, "export", str(bundle))
    dest = tmp_path / "dest"
    doc = kc_json(dest, "import", str(bundle), "--dry-run")
    assert doc["dry_run"] is True and doc["imported"] == 5
    assert not dest.exists()
    one = next(iter(_entries(source)))
    Store(dest).put(one, "bin", b"another ext", {})
    doc = kc_json(dest, "import", str(bundle), code=1)
    assert doc["imported"] == 4 and doc["conflicts"][0]["key"] == one


def test_import_skips_present_and_replaces_corrupt(source, tmp_path):
    bundle = tmp_path / "b.tar"
    kc_json(source, "export", str(bundle))
    dest = tmp_path / "dest"
    kc_json(dest, "import", str(bundle))
    meta, data = next(iter(_entries(dest).values()))
    artifact = dest / f"{meta['key']}.{meta['ext']}"
    artifact.write_bytes(b"\0" * len(data))  # corrupt a present entry
    doc = kc_json(dest, "import", str(bundle))
    assert (doc["imported"], doc["present"]) == (1, 4)
    assert artifact.read_bytes() == data


# -- hostile bundles --------------------------------------------------------------------------
def _valid_parts(root: Path) -> tuple[list[tuple[tarfile.TarInfo, bytes | None]], dict]:
    """Members and manifest of a correct bundle of ``root``."""
    members = []
    docs = []
    for meta, data in sorted(_entries(root).values(), key=lambda md: md[0]["key"]):
        info = tarfile.TarInfo(f"entries/{meta['key']}.{meta['ext']}")
        info.size = len(data)
        members.append((info, data))
        docs.append(meta)
    manifest = {
        "format": "kernelcache-bundle",
        "version": 1,
        "created": 1.0,
        "compatibility": {"entry_format": FORMAT_VERSION},
        "entries": docs,
    }
    return members, manifest


def _write(path: Path, members, manifest, *, compress: str = "none", manifest_bytes=None) -> Path:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
        if manifest is not None or manifest_bytes is not None:
            body = manifest_bytes if manifest_bytes is not None else json.dumps(manifest).encode()
            info = tarfile.TarInfo("manifest.json")
            info.size = len(body)
            tar.addfile(info, io.BytesIO(body))
    raw = buf.getvalue()
    if compress == "zstd":
        raw = zstandard.ZstdCompressor().compress(raw)
    elif compress == "gzip":
        raw = gzip.compress(raw)
    path.write_bytes(raw)
    return path


def _link(kind: bytes, name: str, target: str) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = target
    return info


def _hostile(kind: str, members, manifest):
    """Variations of a valid bundle; (members, manifest, manifest_bytes, expected message)."""
    first_info, first_data = members[0]
    key = first_info.name.split("/")[1].split(".")[0]
    if kind == "absolute":
        info = tarfile.TarInfo("/etc/kernelcache-evil")
        info.size = 4
        return [*members, (info, b"evil")], manifest, None, "absolute path"
    if kind == "dotdot":
        info = tarfile.TarInfo("entries/../../evil.cubin")
        info.size = 4
        return [*members, (info, b"evil")], manifest, None, "'..'"
    if kind == "symlink":
        link = _link(tarfile.SYMTYPE, first_info.name, "/etc/passwd")
        return [(link, None), *members[1:]], manifest, None, "symbolic link"
    if kind == "hardlink":
        link = _link(tarfile.LNKTYPE, f"entries/{key_of('hl')}.cubin", first_info.name)
        return [*members, (link, None)], manifest, None, "hard link"
    if kind == "device":
        dev = tarfile.TarInfo(first_info.name)
        dev.type = tarfile.CHRTYPE
        dev.devmajor, dev.devminor = 1, 3
        return [(dev, None), *members[1:]], manifest, None, "device file"
    if kind == "fifo":
        fifo = tarfile.TarInfo(first_info.name)
        fifo.type = tarfile.FIFOTYPE
        return [(fifo, None), *members[1:]], manifest, None, "FIFO"
    if kind == "directory":
        d = tarfile.TarInfo("entries")
        d.type = tarfile.DIRTYPE
        return [(d, None), *members], manifest, None, "directory"
    if kind == "unexpected-name":
        info = tarfile.TarInfo("README")
        info.size = 2
        return [*members, (info, b"hi")], manifest, None, "unexpected member 'README'"
    if kind == "metadata-member":
        info = tarfile.TarInfo(f"entries/{key}.json")
        info.size = 2
        return [*members, (info, b"{}")], manifest, None, "unexpected member"
    if kind == "duplicate":
        return [*members, members[0]], manifest, None, "appears twice"
    if kind == "digest-mismatch":
        data = bytes(b ^ 1 for b in first_data)
        return [(first_info, data), *members[1:]], manifest, None, "does not match the manifest"
    if kind == "manifest-digest":
        doc = json.loads(json.dumps(manifest))
        doc["entries"][0]["digest"] = digest(b"something else")
        doc["entries"][0]["entry_digest"] = entry_digest(doc["entries"][0])  # consistent
        return members, doc, None, "does not match the manifest"
    if kind == "not-in-manifest":
        info = tarfile.TarInfo(f"entries/{key_of('extra')}.cubin")
        info.size = 3
        return [*members, (info, b"abc")], manifest, None, "not listed in the manifest"
    if kind == "missing-member":
        return members[1:], manifest, None, "which the bundle lacks"
    if kind == "no-manifest":
        return members, None, None, "no manifest.json"
    if kind == "manifest-not-json":
        return members, None, b"{definitely not json", "bad manifest: not JSON"
    if kind == "manifest-wrong-format":
        doc = dict(manifest, format="something-else")
        return members, doc, None, "bad manifest"
    if kind == "manifest-future-version":
        doc = dict(manifest, version=99)
        return members, doc, None, "bundle version 99 is not supported"
    if kind == "manifest-bad-key":
        doc = json.loads(json.dumps(manifest))
        doc["entries"][0]["key"] = "../../etc/passwd"
        return members, doc, None, "no valid key"
    raise AssertionError(kind)


HOSTILE = [
    "absolute",
    "dotdot",
    "symlink",
    "hardlink",
    "device",
    "fifo",
    "directory",
    "unexpected-name",
    "metadata-member",
    "duplicate",
    "digest-mismatch",
    "manifest-digest",
    "not-in-manifest",
    "missing-member",
    "no-manifest",
    "manifest-not-json",
    "manifest-wrong-format",
    "manifest-future-version",
    "manifest-bad-key",
]


@pytest.mark.parametrize("kind", HOSTILE)
def test_hostile_bundle_is_rejected_and_nothing_written(source, tmp_path, kind):
    members, manifest = _valid_parts(source)
    members, manifest, raw_manifest, message = _hostile(kind, members, manifest)
    bundle = _write(tmp_path / f"{kind}.tar", members, manifest, manifest_bytes=raw_manifest)
    fresh = tmp_path / "fresh"
    proc = kc(fresh, "import", str(bundle))
    assert proc.returncode == 2, proc.stderr  # refused whole: nothing was done
    assert message in proc.stderr and "nothing was imported" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not fresh.exists()
    # Into a root with entries already: unchanged, not a file added or touched.
    existing = tmp_path / "existing"
    put(existing, "already", size=420)
    before = {p: p.stat().st_mtime_ns for p in existing.rglob("*")}
    assert kc(existing, "import", str(bundle)).returncode == 2
    assert {p: p.stat().st_mtime_ns for p in existing.rglob("*")} == before
    assert not Path("/etc/kernelcache-evil").exists()


@pytest.mark.parametrize("kind", ["symlink", "digest-mismatch", "manifest-not-json"])
def test_hostile_zstd_bundle_is_rejected(source, tmp_path, kind):
    members, manifest = _valid_parts(source)
    members, manifest, raw_manifest, message = _hostile(kind, members, manifest)
    bundle = _write(
        tmp_path / "b.tar.zst", members, manifest, compress="zstd", manifest_bytes=raw_manifest
    )
    doc = kc_json(tmp_path / "fresh", "import", str(bundle), code=2)
    assert message in doc["error"]
    assert not (tmp_path / "fresh").exists()


def _header_bomb(path: Path, typeflag: bytes, size: int, byte: bytes) -> None:
    """A zstd tar whose first member is an extended header announcing ``size`` bytes of
    ``byte`` (a pax header of digits without a newline, or a GNU long name), then a manifest."""
    head = tarfile.TarInfo("././@LongLink")
    head.type, head.size = typeflag, size
    with open(path, "wb") as f, zstandard.ZstdCompressor().stream_writer(f) as w:
        w.write(head.tobuf(format=tarfile.USTAR_FORMAT))
        chunk = byte * (1 << 20)
        for start in range(0, size, len(chunk)):
            w.write(chunk[: size - start])
        w.write(b"\0" * (-size % 512) + tarfile.TarInfo("manifest.json").tobuf() + b"\0" * 1024)


@pytest.mark.parametrize(
    ("typeflag", "byte"),
    [(tarfile.XHDTYPE, b"1"), (tarfile.GNUTYPE_LONGNAME, b"a")],
    ids=["pax-digits", "gnu-long-name"],
)
def test_a_member_header_announcing_much_is_refused_unread(tmp_path, typeflag, byte):
    """A 30 KB zstd bundle whose first header announced 256 MiB (a pax header of digits, which
    Python's tarfile parses in quadratic time before 3.11.10, or a GNU long name, which it
    reads whole): import held that memory, or ran for minutes. Refused before it is read."""
    bundle = tmp_path / "bomb.tar.zst"
    _header_bomb(bundle, typeflag, 256 << 20, byte)
    assert bundle.stat().st_size < 100_000
    proc = run_py(IMPORT_RSS, str(bundle), str(tmp_path / "fresh"), timeout=120)
    exit_code, rss_kib, elapsed = proc.stdout.split()
    assert int(exit_code) == 2, proc.stderr
    assert "extended header is 268,435,456 bytes" in proc.stderr
    assert int(rss_kib) < 150 << 10 and float(elapsed) < 5.0
    assert not (tmp_path / "fresh").exists()


#: ``kernelcache import BUNDLE`` into ROOT in this process: its exit code, peak memory (KiB) and
#: seconds
IMPORT_RSS = """
import sys, time
from kernelcache.cli.app import main
started = time.monotonic()
code = main(["--root", sys.argv[2], "import", sys.argv[1]])
elapsed = time.monotonic() - started
with open("/proc/self/status") as f:  # (this process's own peak: ru_maxrss keeps its parent's)
    peak = next(line.split()[1] for line in f if line.startswith("VmHWM:"))
print(code, peak, elapsed)
"""


def test_oversized_member(source, tmp_path):
    root = tmp_path / "big"
    put(root, "huge", size=3 << 20)
    bundle = tmp_path / "big.tar"
    kc_json(root, "export", str(bundle))
    fresh = tmp_path / "fresh"
    proc = kc(fresh, "import", str(bundle), "--max-member-size", "1M")
    assert (
        proc.returncode == 2 and "oversized" in proc.stderr and "--max-member-size" in proc.stderr
    )
    assert files_under(fresh) == set()
    assert kc_json(fresh, "import", str(bundle), "--max-member-size", "4M")["imported"] == 1


def test_max_member_size_0_is_no_limit(source, tmp_path):
    """0 means no limit, as it does for every size limit of the command."""
    root = tmp_path / "big"
    put(root, "huge", size=3 << 20)
    bundle = tmp_path / "big.tar"
    kc_json(root, "export", str(bundle))
    fresh = tmp_path / "fresh"
    assert kc_json(fresh, "import", str(bundle), "--max-member-size", "0")["imported"] == 1
    assert kc_json(fresh, "ls")["count"] == 1
    assert "0 means no limit" in " ".join(kc(None, "import", "--help").stdout.split())


def test_a_truncated_bundle_is_called_truncated(source, tmp_path):
    """A copy cut short, wherever the cut falls, is named as such (not "not a tar archive"),
    with what to do; a plain tar cut inside a member too."""
    bundle = tmp_path / "b.tar.zst"
    kc_json(source, "export", str(bundle))
    raw = bundle.read_bytes()
    for cut in (20, len(raw) // 4, len(raw) // 2, len(raw) - 10):
        truncated = tmp_path / f"cut{cut}.tar.zst"
        truncated.write_bytes(raw[:cut])
        proc = kc(tmp_path / "fresh", "import", str(truncated))
        assert proc.returncode == 2, (cut, proc.stderr)
        assert "truncated" in proc.stderr and "copy it again" in proc.stderr, (cut, proc.stderr)
        assert "not a tar archive" not in proc.stderr
    assert files_under(tmp_path / "fresh") == set()
    plain = tmp_path / "b.tar"
    kc_json(source, "export", str(plain))
    data = plain.read_bytes()
    (tmp_path / "cut.tar").write_bytes(data[: len(data.rstrip(b"\0")) - 100])
    proc = kc(tmp_path / "fresh", "import", str(tmp_path / "cut.tar"))
    assert proc.returncode == 2 and "truncated" in proc.stderr, proc.stderr


def test_damaged_and_foreign_files(source, tmp_path):
    bundle = tmp_path / "b.tar"
    kc_json(source, "export", str(bundle))
    raw = bundle.read_bytes()
    truncated = tmp_path / "truncated.tar"
    truncated.write_bytes(raw[: len(raw.rstrip(b"\0")) - 100])  # into the last member
    proc = kc(tmp_path / "fresh", "import", str(truncated))
    assert proc.returncode == 2 and "nothing was imported" in proc.stderr
    gz = tmp_path / "b.tar.gz"
    gz.write_bytes(gzip.compress(raw))
    proc = kc(tmp_path / "fresh", "import", str(gz))
    assert proc.returncode == 2 and "gzip-compressed bundles are not supported" in proc.stderr
    junk = tmp_path / "junk.tar"
    junk.write_bytes(os.urandom(4096))
    assert kc(tmp_path / "fresh", "import", str(junk)).returncode == 2
    zst = tmp_path / "bad.tar.zst"
    zst.write_bytes(b"\x28\xb5\x2f\xfd" + os.urandom(200))
    proc = kc(tmp_path / "fresh", "import", str(zst))
    assert proc.returncode == 2 and "nothing was imported" in proc.stderr
    missing = kc(tmp_path / "fresh", "import", str(tmp_path / "nope.tar"))
    assert missing.returncode == 2 and "nope.tar does not exist" in missing.stderr  # a usage error
    assert not (tmp_path / "fresh").exists()


def test_without_zstandard(source, tmp_path):
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    (shadow / "zstandard.py").write_text("raise ImportError('no zstandard here')\n")
    env = {"PYTHONPATH": os.pathsep.join([str(shadow), os.environ.get("PYTHONPATH", "")])}
    proc = kc(source, "export", str(tmp_path / "b.tar.zst"), env=env)
    assert proc.returncode == 2 and "pip install 'kernelcache[zstd]'" in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shadow", "source"]
    kc_json(source, "export", str(tmp_path / "b.tar.zst"))
    proc = kc(tmp_path / "fresh", "import", str(tmp_path / "b.tar.zst"), env=env)
    assert proc.returncode == 2 and "kernelcache[zstd]" in proc.stderr
    plain = kc(source, "export", str(tmp_path / "plain.tar"), env=env)
    assert plain.returncode == 0
