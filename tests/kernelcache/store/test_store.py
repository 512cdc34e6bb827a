"""The on-disk format: round trips, metadata, atomic publication, failures of the root."""

from __future__ import annotations

import json
import os
import stat
import tempfile
import time
from pathlib import Path

import pytest
from artifact_images import PTX, launch, whole
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import (
    CAN_DROP_PRIVILEGES,
    CAN_UNSHARE,
    IS_ROOT,
    key_of,
    run_in_namespace,
    run_py,
)

import kernelcache
from kernelcache.schema import FIELDS, RESERVED_FIELDS
from kernelcache.store import FORMAT_VERSION, Problem, Store, digest

HEX = "0123456789abcdef"
json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**53), 2**53),
    st.text(max_size=20),
    st.floats(allow_nan=False, allow_infinity=False),
)
meta_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=10,
)
# fields the schema does not know: any plain JSON round-trips (known ones have their own types)
meta_dicts = st.dictionaries(
    st.text(max_size=12).filter(lambda k: k not in FIELDS and k not in RESERVED_FIELDS),
    meta_values,
    max_size=6,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    key=st.text(alphabet=HEX, min_size=32, max_size=128),
    ext=st.sampled_from(["cubin", "ptx", "hsaco", "bin", "x1"]),
    payload=st.binary(max_size=70_000),
    meta=meta_dicts,
)
def test_round_trip(key, ext, payload, meta):
    data = whole(ext, payload)  # an ELF image or PTX holding it, where the ext has a structure
    meta = {**meta, **launch(ext)}
    with tempfile.TemporaryDirectory() as tmp:
        cache = kernelcache.Cache(tmp, readonly_roots=())
        assert cache.get(key, ext) is None
        put = cache.put(key, ext, data, meta)
        got = cache.get(key, ext)
        assert got is not None and got.data == data == put.data
        assert Path(got.path).read_bytes() == data
        assert got.path == os.path.join(tmp, f"{key}.{ext}")
        for name, value in meta.items():
            assert got.meta[name] == value
        assert got.meta["size"] == len(data)
        assert got.meta["digest"] == digest(data)
        assert got.meta["format"] == FORMAT_VERSION
        assert got.meta["key"] == key and got.meta["ext"] == ext
        assert got.meta["producer"]["kernelcache"] == kernelcache.__version__
        # a fresh cache object (as another process would) reads the same
        again = kernelcache.Cache(tmp, readonly_roots=()).get(key, ext)
        assert again is not None and again.data == data


def test_layout_and_no_absolute_paths(root):
    cache = kernelcache.Cache(root, readonly_roots=())
    key = key_of("layout")
    cache.put(key, "cubin", whole("cubin", b"\0" * 100), launch())
    names = sorted(p.name for p in root.iterdir())
    assert f"{key}.cubin" in names and f"{key}.json" in names
    assert os.listdir(root / ".tmp") == []
    text = (root / f"{key}.json").read_text()
    assert str(root) not in text and "/tmp" not in text
    doc = json.loads(text)
    assert doc["name"] == "add_kernel" and doc["target"] == "cuda:90"
    assert isinstance(doc["created"], float)


def test_first_complete_writer_wins(root):
    cache = kernelcache.Cache(root, readonly_roots=())
    key = key_of("first")
    first = cache.put(key, "bin", b"first", {"n": 1})
    second = cache.put(key, "bin", b"second", {"n": 2})
    assert second.data == b"first" and second.meta["n"] == 1
    assert cache.get(key, "bin").data == b"first"
    assert first.meta["created"] == second.meta["created"]


def test_key_holds_one_extension(root):
    cache = kernelcache.Cache(root, readonly_roots=())
    key = key_of("one-ext")
    cubin = whole("cubin", b"cubin bytes")
    cache.put(key, "cubin", cubin, launch())
    corrupt_before = kernelcache.process_stats()["corrupt"]
    assert cache.get(key, "ptx") is None  # another ext is a miss, not corruption
    assert kernelcache.process_stats()["corrupt"] == corrupt_before
    with pytest.raises(ValueError, match=r"already holds a \.cubin"):
        cache.put(key, "ptx", PTX, launch("ptx"))
    assert cache.get(key, "cubin").data == cubin
    assert not (root / ".quarantine").exists()


@pytest.mark.parametrize(
    "meta, message",
    [
        ({"size": 3}, "reserved"),
        ({"digest": "x"}, "reserved"),
        ({"obj": object()}, "'obj' holds a object, which is not JSON"),
        ({"nan": float("nan")}, "'nan' holds nan"),
    ],
)
def test_bad_metadata_rejected_before_writing(root, meta, message):
    cache = kernelcache.Cache(root, readonly_roots=())
    with pytest.raises(ValueError, match=message):
        cache.put(key_of("bad-meta"), "bin", b"x", meta)
    assert not root.exists() or not any(root.glob("*.json"))


def test_root_is_a_file(tmp_path):
    target = tmp_path / "file"
    target.write_text("not a directory")
    cache = kernelcache.Cache(target, readonly_roots=())
    key = key_of("file-root")
    assert cache.get(key, "bin") is None
    with pytest.raises(kernelcache.CacheError, match="directory") as info:
        cache.put(key, "bin", b"x", {})
    assert str(target) in str(info.value)
    art = cache.get_or_create(key, "bin", lambda: (b"built", {}))
    assert art.data == b"built" and art.path is None and art.source == "memory"
    assert target.read_text() == "not a directory"


def test_readonly_store_never_written(root):
    writable = kernelcache.Cache(root, readonly_roots=())
    key = key_of("ro")
    writable.put(key, "bin", b"payload", {})
    before = sorted(p.name for p in root.rglob("*"))
    ro = Store(root, readonly=True)
    art = ro.get(key, "bin")
    assert art.data == b"payload" and art.source == "readonly"
    with pytest.raises(kernelcache.CacheError, match="read-only"):
        ro.put(key_of("other"), "bin", b"x", {})
    assert sorted(p.name for p in root.rglob("*")) == before


def test_readonly_roots_searched_after_root(tmp_path):
    image = tmp_path / "image"
    local = tmp_path / "local"
    key_image, key_both = key_of("image-only"), key_of("both")
    baker = kernelcache.Cache(image, readonly_roots=())
    baker.put(key_image, "bin", b"from image", {})
    baker.put(key_both, "bin", b"image copy", {})
    kernelcache.Cache(local, readonly_roots=()).put(key_both, "bin", b"local copy", {})
    kernelcache.stats.flush()  # the baker's own counters land in its log now, not later
    image_files = {p: p.stat().st_mtime_ns for p in image.rglob("*")}

    cache = kernelcache.Cache(local, readonly_roots=[image])
    assert cache.get(key_image, "bin").data == b"from image"
    assert cache.get(key_image, "bin").source == "readonly"
    assert cache.get(key_both, "bin").data == b"local copy"
    new = cache.get_or_create(key_of("new"), "bin", lambda: (b"new", {}))
    assert Path(new.path).parent == local
    assert {p: p.stat().st_mtime_ns for p in image.rglob("*")} == image_files


def test_readonly_roots_from_environment(tmp_path, monkeypatch):
    image = tmp_path / "image"
    key = key_of("env-image")
    kernelcache.Cache(image, readonly_roots=()).put(key, "bin", b"baked", {})
    monkeypatch.setenv("KERNELCACHE_READONLY_DIRS", f"{tmp_path / 'missing'}{os.pathsep}{image}")
    cache = kernelcache.Cache(tmp_path / "local")
    assert cache.get(key, "bin").data == b"baked"


def test_default_root_from_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNELCACHE_DIR", str(tmp_path / "from-env"))
    cache = kernelcache.Cache()
    assert cache.root == str(tmp_path / "from-env")
    monkeypatch.delenv("KERNELCACHE_DIR")
    import platformdirs

    assert kernelcache.Cache().root == platformdirs.user_cache_dir("kernelcache", appauthor=False)


def test_disabled_cache_builds_in_memory(root, monkeypatch):
    monkeypatch.setenv("KERNELCACHE_DISABLE", "1")
    cache = kernelcache.Cache(root, readonly_roots=())
    calls = []
    for _ in range(2):
        art = cache.get_or_create(key_of("off"), "bin", lambda: (calls.append(1) or b"b", {}))
        assert art.path is None and art.data == b"b"
    assert len(calls) == 2 and not root.exists()


@pytest.mark.parametrize(
    "umask, file_mode, dir_mode",
    [(0o002, 0o664, 0o775), (0o022, 0o644, 0o755), (0o077, 0o600, 0o700)],
)
def test_modes_follow_umask(root, umask, file_mode, dir_mode):
    code = """
        import os, sys, kernelcache
        os.umask(int(sys.argv[2], 8))
        c = kernelcache.Cache(sys.argv[1], readonly_roots=())
        c.get_or_create("ab" * 16, "bin", lambda: (b"x", {}))
    """
    run_py(code, str(root), oct(umask))
    for name in (f"{'ab' * 16}.bin", f"{'ab' * 16}.json"):
        assert stat.S_IMODE((root / name).stat().st_mode) == file_mode, name
    for name in (".tmp", ".locks"):
        assert stat.S_IMODE((root / name).stat().st_mode) == dir_mode, name


@pytest.mark.skipif(not IS_ROOT, reason="needs root to hand a directory to another group")
def test_group_shared_root_with_setgid(root):
    os.makedirs(root)
    os.chown(root, 0, 65534)
    os.chmod(root, 0o2775)
    run_py(
        """
        import os, sys, kernelcache
        os.umask(0o002)
        kernelcache.Cache(sys.argv[1], readonly_roots=()).get_or_create("cd" * 16, "bin", lambda: (b"x", {}))
        """,
        str(root),
    )
    for path in [
        root / ".tmp",
        root / ".locks",
        root / f"{'cd' * 16}.bin",
        root / f"{'cd' * 16}.json",
    ]:
        assert path.stat().st_gid == 65534, path
    for path in [root / ".tmp", root / ".locks"]:
        assert path.stat().st_mode & stat.S_ISGID, path


@pytest.mark.skipif(not CAN_DROP_PRIVILEGES, reason="needs root and setpriv to act as another user")
def test_unwritable_root_for_another_user(shared_tmp):
    root = shared_tmp / "owned-by-root"
    root.mkdir()
    os.chmod(root, 0o755)
    key = key_of("unwritable")
    kernelcache.Cache(root, readonly_roots=()).put(key, "bin", b"shared", {})
    import subprocess
    import sys
    import textwrap

    from support import other_users_env

    code = textwrap.dedent(
        """
        import sys, logging, kernelcache
        logging.basicConfig()
        c = kernelcache.Cache(sys.argv[1], readonly_roots=())
        assert c.get(sys.argv[2], "bin").data == b"shared"
        try:
            c.put("ef" * 16, "bin", b"x", {})
        except kernelcache.CacheError as e:
            print("PUT-ERROR", e)
        art = c.get_or_create("ef" * 16, "bin", lambda: (b"mem", {}))
        print("SOURCE", art.source, art.path)
        """
    )
    proc = subprocess.run(
        [
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            sys.executable,
            "-c",
            code,
            str(root),
            key,
        ],
        env=other_users_env(shared_tmp),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert "PUT-ERROR" in proc.stdout and "writable" in proc.stdout
    assert "SOURCE memory None" in proc.stdout
    assert sorted(p.name for p in root.iterdir() if not p.name.startswith(".")) == [
        f"{key}.bin",
        f"{key}.json",
    ]


@pytest.mark.skipif(not CAN_UNSHARE, reason="needs a private mount namespace (unshare -rm)")
def test_full_disk_leaves_nothing_partial(tmp_path):
    root = tmp_path / "small"
    root.mkdir()
    proc = run_in_namespace(
        f"mount -t tmpfs -o size=256k tmpfs {root}",
        f"""
        import logging, os, kernelcache
        logging.basicConfig()
        root = {str(root)!r}
        c = kernelcache.Cache(root, readonly_roots=())
        small = c.put("11" * 16, "bin", b"s" * 1000, {{}})
        try:
            c.put("22" * 16, "bin", os.urandom(1 << 20), {{}})
        except kernelcache.CacheError as e:
            print("PUT-ERROR", e)
        art = c.get_or_create("33" * 16, "bin", lambda: (os.urandom(1 << 20), {{}}))
        print("BUILT", art.source, len(art.data))
        assert c.get("22" * 16, "bin") is None and c.get("33" * 16, "bin") is None
        assert c.get("11" * 16, "bin").data == b"s" * 1000
        print("FILES", sorted(n for n in os.listdir(root) if not n.startswith(".")))
        print("TMP", os.listdir(os.path.join(root, ".tmp")))
        """,
    )
    assert "PUT-ERROR" in proc.stdout and "No space left" in proc.stdout and "prune" in proc.stdout
    assert "BUILT memory 1048576" in proc.stdout
    assert f"FILES {sorted(['11' * 16 + '.bin', '11' * 16 + '.json'])!r}" in proc.stdout
    assert "TMP []" in proc.stdout
    assert proc.stderr.count("using an in-memory artifact") == 1


@pytest.mark.skipif(not CAN_UNSHARE, reason="needs a private mount namespace (unshare -rm)")
def test_readonly_filesystem(tmp_path):
    root = tmp_path / "ro"
    key = key_of("rofs")
    kernelcache.Cache(root, readonly_roots=()).put(key, "bin", b"baked", {})
    proc = run_in_namespace(
        f"mount --bind {root} {root} && mount -o remount,ro,bind {root}",
        f"""
        import logging, kernelcache
        logging.basicConfig()
        c = kernelcache.Cache({str(root)!r}, readonly_roots=())
        assert c.get({key!r}, "bin").data == b"baked"
        try:
            c.put("44" * 16, "bin", b"x", {{}})
        except kernelcache.CacheError as e:
            print("PUT-ERROR", e)
        print("SOURCE", c.get_or_create("44" * 16, "bin", lambda: (b"m", {{}})).source)
        """,
    )
    assert "PUT-ERROR" in proc.stdout and "read-only" in proc.stdout
    assert "SOURCE memory" in proc.stdout


def test_file_size_limit_in_child(root):
    """RLIMIT_FSIZE stops root too: an over-limit artifact fails cleanly, the job continues."""
    proc = run_py(
        """
        import logging, os, resource, sys, kernelcache
        logging.basicConfig()
        resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, 100_000))
        c = kernelcache.Cache(sys.argv[1], readonly_roots=())
        art = c.get_or_create("55" * 16, "bin", lambda: (b"z" * 200_000, {}))
        print("SOURCE", art.source, len(art.data))
        ok = c.get_or_create("66" * 16, "bin", lambda: (b"z" * 1000, {}))
        print("SMALL", ok.source)
        print("TMP", os.listdir(os.path.join(sys.argv[1], ".tmp")))
        """,
        str(root),
    )
    assert "SOURCE memory 200000" in proc.stdout
    assert "SMALL local" in proc.stdout
    assert "TMP []" in proc.stdout
    assert "ulimit" in proc.stderr
    assert not (root / f"{'55' * 16}.bin").exists() and not (root / f"{'55' * 16}.json").exists()


@pytest.mark.parametrize("planted", [".tmp", ".locks", ".quarantine"])
def test_symlinked_subdirectory_is_not_followed(tmp_path, planted):
    root = tmp_path / "cache"
    outside = tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (root / planted).symlink_to(outside)
    cache = kernelcache.Cache(root, readonly_roots=())
    key = key_of("symlink", planted)
    art = cache.get_or_create(key, "bin", lambda: (b"payload", {}))
    assert art.data == b"payload"
    if planted == ".quarantine":
        # quarantine is only used on corruption; corrupt the entry and read it
        Path(art.path).write_bytes(b"tampered")
        assert cache.get(key, "bin") is None
    assert list(outside.iterdir()) == []


def test_symlink_at_entry_path_is_replaced_not_followed(tmp_path):
    root = tmp_path / "cache"
    root.mkdir()
    victim = tmp_path / "victim"
    victim.write_bytes(b"do not touch")
    key = key_of("entry-link")
    (root / f"{key}.bin").symlink_to(victim)
    (root / f"{key}.json").symlink_to(victim)
    cache = kernelcache.Cache(root, readonly_roots=())
    assert cache.get(key, "bin") is None
    art = cache.get_or_create(key, "bin", lambda: (b"real", {}))
    assert art.data == b"real"
    assert victim.read_bytes() == b"do not touch"
    assert not (root / f"{key}.bin").is_symlink()
    assert cache.get(key, "bin").data == b"real"


def test_store_read_reports_problems(root):
    store = Store(root)
    key = key_of("problem")
    assert store.read(key) is None
    store.put(key, "bin", b"abc", {})
    (root / f"{key}.bin").write_bytes(b"abd")
    result = store.read(key, "bin")
    assert isinstance(result, Problem) and result.corrupt and "digest" in result.reason


def test_last_used_stamp_is_coarse_and_repairs_clock_skew(root):
    cache = kernelcache.Cache(root, readonly_roots=())
    key = key_of("stamp")
    cache.put(key, "bin", b"x", {})
    meta = root / f"{key}.json"
    now = time.time()
    os.utime(meta, (now - 600, now - 600))  # used ten minutes ago: a hit leaves it alone
    cache.get(key, "bin")
    assert abs(meta.stat().st_mtime - (now - 600)) < 1
    os.utime(meta, (now - 7200, now - 7200))  # two hours ago: a hit refreshes it
    kernelcache.Cache(root, readonly_roots=()).get(key, "bin")
    assert abs(meta.stat().st_mtime - time.time()) < 5
    os.utime(meta, (now + 86400, now + 86400))  # "from the future" (clock skew): reset to now
    kernelcache.Cache(root, readonly_roots=()).get(key, "bin")
    assert abs(meta.stat().st_mtime - time.time()) < 5
