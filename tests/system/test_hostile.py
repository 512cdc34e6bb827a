"""Hostile input and hostile shared directories.

* Files planted in a shared root that the cache parses (metadata, the scan index, statistics
  logs and summary, soft-lock records) never crash a job or a command, however they are made:
  deeply nested JSON is the case that used to escape as RecursionError.
* Keys and extensions from outside (API arguments, command-line arguments, bundle members,
  manifest records, Redis values) are rejected before any file is touched: an in-process
  recorder of every file-system call proves it, and a root that does not exist stays absent.
* Symlinks planted at every predictable path of a root (entries, .tmp/, .locks/ and its lock
  files, .quarantine/, .stats/ and its index and summary, .handoff/) never redirect a write
  outside the root.
"""

from __future__ import annotations

import builtins
import contextlib
import io
import json
import os
import stat
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from artifact_images import elf_image, launch
from cli_support import kc, put
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from redis_server import REDIS_SERVER, SKIP_REASON, RedisServer
from reliability_support import record_figures, run_cli
from support import (
    CAN_SHARE,
    HELPERS,
    IS_ROOT,
    SHARE_GID,
    key_of,
    other_users_env,
    run_py,
)

import kernelcache
from kernelcache import bundle
from kernelcache.keys import EXT_PATTERN, KEY_PATTERN
from kernelcache.remote import MAGIC, encode_value
from kernelcache.schema import FORMAT_VERSION
from kernelcache.store import Store, make_metadata

#: deeper than any JSON parser's recursion limit, smaller than every size limit
NESTED = b"[" * 200_000
NESTED_SHORT = b"[" * 4000  # a soft lock record is read in 4 KiB


# -- planted files the cache parses -----------------------------------------------------------
def test_deeply_nested_metadata_is_corrupt_not_a_crash(root, caplog_warnings):
    cache = kernelcache.Cache(root, readonly_roots=())
    key = key_of("nested-meta")
    image = elf_image(b"code")  # whole cubins: verify finds only what is nested
    cache.put(key, "cubin", image, launch(name="k"))
    (root / f"{key}.json").write_bytes(NESTED)
    assert cache.get(key, "cubin") is None  # a miss, not RecursionError in the user's job
    assert any("quarantined" in r.getMessage() for r in caplog_warnings.records)
    assert cache.get_or_create(key, "cubin", lambda: (image, launch())).data == image
    other = key_of("nested-meta-2")
    Store(root).put(other, "cubin", elf_image(b"more"), launch())
    (root / f"{other}.json").write_bytes(NESTED)
    code, out = run_cli("--root", str(root), "show", other, "--json")
    assert code == 1 and json.loads(out)["status"] == "corrupt"
    for argv in (["ls"], ["stats"], ["prune", "--dry-run"]):
        code, out = run_cli("--root", str(root), *argv, "--json")
        assert code == 0, (argv, out)
    code, out = run_cli("--root", str(root), "verify", "--json")
    doc = json.loads(out)
    assert code == 1 and [p["key"] for p in doc["problems"]] == [other]
    code, out = run_cli("--root", str(root), "verify", "--repair", "--json")
    assert code == 0 and json.loads(out)["clean"] is True
    assert Store(root).read(other) is None and Store(root).read(key).data == image


def test_deeply_nested_index_summary_and_logs_do_not_break_commands(root):
    put(root, "kern", size=400)  # whole cubins: verify finds only what is nested
    put(root, "kern", size=500)
    run_cli("--root", str(root), "stats")  # writes the scan index
    stats_dir = root / ".stats"
    (stats_dir / "index.json").write_bytes(NESTED)
    (stats_dir / "summary.jsonl").write_bytes(NESTED)
    (stats_dir / "otherhost-1-abcdef01.jsonl").write_bytes(NESTED + b"\n")
    old = 1_000_000_000
    os.utime(stats_dir / "otherhost-1-abcdef01.jsonl", (old, old))  # a finished process: folded
    code, out = run_cli("--root", str(root), "stats", "--json")
    doc = json.loads(out)
    assert code == 0 and doc["entries"] == 2 and doc["log_problems"]
    code, out = run_cli("--root", str(root), "ls", "--json")
    assert code == 0 and json.loads(out)["count"] == 2
    code, out = run_cli("--root", str(root), "verify", "--json")
    assert code == 0 and json.loads(out)["entries_ok"] == 2
    code, out = run_cli("--root", str(root), "prune", "--json")
    result = json.loads(out)["result"]
    # the unreadable summary is never overwritten (its totals would be lost): a fold error
    assert code == 1 and "summary" in result["fold_error"]
    assert (stats_dir / "summary.jsonl").read_bytes() == NESTED


def test_deeply_nested_soft_lock_record_does_not_fail_the_job(root):
    key = key_of("nested-softlock")
    locks = root / ".locks"
    locks.mkdir(parents=True)
    (locks / f"{key}.build.softlock").write_bytes(NESTED_SHORT)
    (locks / f"{key}.softlock").write_bytes(NESTED_SHORT)
    cache = kernelcache.Cache(root, readonly_roots=(), lock_mode="soft", lock_timeout=0.5)
    art = cache.get_or_create(key, "bin", lambda: (b"built", {}))
    assert art.data == b"built"  # from memory: both locks look held; the job goes on
    code, out = run_cli("--root", str(root), "verify", "--json")
    assert code == 0, out


def test_deeply_nested_bundle_manifest_is_a_bundle_error(tmp_path):
    path = tmp_path / "nested.tar"
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("manifest.json")
        info.size = len(NESTED)
        tar.addfile(info, io.BytesIO(NESTED))
    dest = tmp_path / "dest"
    with pytest.raises(bundle.BundleError, match="bad manifest"):
        bundle.import_bundle(Store(dest), str(path))
    assert not dest.exists()


@pytest.mark.skipif(REDIS_SERVER is None, reason=SKIP_REASON)
def test_deeply_nested_redis_value_is_rejected(tmp_path):
    key = key_of("nested-redis")
    with RedisServer(tmp_path / "redis") as srv:
        cache = kernelcache.Cache(tmp_path / "root", readonly_roots=(), remote=srv.url)
        value = MAGIC + len(NESTED).to_bytes(4, "big") + NESTED
        srv.client().set(cache.remote.name(key), value)
        assert cache.get(key, "cubin") is None
        art = cache.get_or_create(key, "bin", lambda: (b"built", {}))
        assert art.data == b"built" and art.source == "local"
        assert cache.remote.counters["rejected"] == 1


# -- the ROCm hand-off directory ----------------------------------------------------------------
HANDOFF_CHILD = """
import json, os, sys
from bridge.embed import handoff
out = {}
for name, root in (("planted", sys.argv[1]), ("unwritable", sys.argv[2])):
    path = handoff.materialize(root, "ab" * 16 + ".hsaco", b"\\x7fELF code")
    with open(path, "rb") as f:
        assert f.read() == b"\\x7fELF code"
    out[name] = os.path.realpath(handoff.directory(root)[0])
print(json.dumps(out))
"""


def test_planted_handoff_links_never_redirect_the_hsaco_hand_off(tmp_path):
    """``<root>/.handoff`` planted as a symlink, and the per-user fallback in the temp
    directory planted as a symlink or as another user's directory: none of them is used; the
    private directory used instead is removed when the process ends."""
    root = tmp_path / "cache"
    root.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (root / ".handoff").symlink_to(outside)
    temp = tmp_path / "temp"
    temp.mkdir()
    attacker = tmp_path / "attacker"
    attacker.mkdir()
    (temp / f"kernelcache-handoff-{os.getuid()}").symlink_to(attacker)
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory: the cache root cannot hold .handoff")
    proc = run_py(HANDOFF_CHILD, str(root), str(blocker / "root"), TMPDIR=str(temp))
    dirs = json.loads(proc.stdout.strip().splitlines()[-1])
    assert list(outside.iterdir()) == [] and list(attacker.iterdir()) == []
    for private in dirs.values():
        assert not private.startswith((str(outside), str(attacker))), dirs
        assert private.startswith(str(temp)), dirs  # a private directory of its own
    # ... removed when the process ends, with the directory made to hold it
    assert [p.name for p in temp.iterdir()] == [f"kernelcache-handoff-{os.getuid()}"]


@pytest.mark.skipif(not IS_ROOT, reason="needs root to make a directory of another user")
def test_handoff_fallback_owned_by_another_user_is_not_used(tmp_path):
    temp = tmp_path / "temp"
    temp.mkdir()
    theirs = temp / f"kernelcache-handoff-{os.getuid()}"
    theirs.mkdir(mode=0o777)
    os.chown(theirs, 65534, 65534)
    os.chmod(theirs, 0o777)
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    proc = run_py(HANDOFF_CHILD, str(blocker / "r1"), str(blocker / "r2"), TMPDIR=str(temp))
    dirs = json.loads(proc.stdout.strip().splitlines()[-1])
    assert list(theirs.iterdir()) == []
    # (a fallback directory of mkdtemp may share the prefix "kernelcache-handoff-0...": compare
    # whole path components)
    assert all(theirs not in Path(d).parents and Path(d) != theirs for d in dirs.values()), dirs
    assert list(temp.iterdir()) == [theirs], "the fallback made for the process outlived it"


# -- keys and extensions from outside: rejected before any file access -------------------------
_FS = (
    "open",
    "stat",
    "lstat",
    "listdir",
    "scandir",
    "mkdir",
    "makedirs",
    "replace",
    "rename",
    "unlink",
    "rmdir",
    "utime",
    "access",
    "link",
    "symlink",
    "chmod",
    "chown",
    "truncate",
)


@contextlib.contextmanager
def file_access_recorder() -> Iterator[list[tuple[str, object]]]:
    """Record every file-system call made through ``os`` and ``open`` inside the block."""
    seen: list[tuple[str, object]] = []
    saved = {name: getattr(os, name) for name in _FS}

    def spy(name: str, real: Callable) -> Callable:
        def call(*args, **kwargs):
            seen.append((name, args[0] if args else kwargs.get("path")))
            return real(*args, **kwargs)

        return call

    real_open = builtins.open
    try:
        for name, real in saved.items():
            setattr(os, name, spy(name, real))
        builtins.open = spy("builtins.open", real_open)
        yield seen
    finally:
        for name, real in saved.items():
            setattr(os, name, real)
        builtins.open = real_open


GOOD_KEY = "ab" * 32
HOSTILE_KEYS = [
    "../../etc/passwd",
    "/etc/passwd",
    "..",
    "",
    "a" * 31 + "\x00",
    "a" * 32 + "\x00" + "b" * 8,
    "a" * 32 + "/../../x",
    "a" * 32 + ".json",
    "a" * 32 + "\n",
    " " + "a" * 32,
    "A" * 32,  # upper case: another file on a case-sensitive filesystem
    "a" * 129,
    "a" * 100_000,
    "\uff41" * 32,  # fullwidth "a"
    "\u0430" * 32,  # Cyrillic "a"
    "\u0660" * 32,  # Arabic-Indic digit zero (a digit to \d, not to [0-9])
    "\U0001d7ce" * 32,  # mathematical bold digit zero
    "a" * 31 + "\u0301",  # a combining accent
]
HOSTILE_EXTS = [
    "../x",
    "cubin/../../x",
    "json",
    "",
    ".cubin",
    "CUBIN",
    "cub\x00in",
    "cub\u0456n",
    "\uff43ubin",
    "a" * 17,
    "cu bin",
    "ptx\n",
    "x" * 10_000,
]


def _api_calls(root: Path) -> dict[str, Callable[[str, str], object]]:
    cache = kernelcache.Cache(root, readonly_roots=())
    store = Store(root)
    return {
        "Cache.get": lambda k, e: cache.get(k, e),
        "Cache.put": lambda k, e: cache.put(k, e, b"x", {}),
        "Cache.get_or_create": lambda k, e: cache.get_or_create(k, e, lambda: (b"x", {})),
        "Store.get": lambda k, e: store.get(k, e),
        "Store.put": lambda k, e: store.put(k, e, b"x", {}),
        "Store.delete": lambda k, e: store.delete(k),
    }


@pytest.mark.parametrize("bad", [*HOSTILE_KEYS, None, 12, b"a" * 32], ids=repr)
def test_hostile_keys_are_rejected_before_any_file_access(tmp_path, bad):
    root = tmp_path / "never-created"
    for name, op in _api_calls(root).items():
        with file_access_recorder() as seen, pytest.raises(ValueError, match="invalid cache key"):
            op(bad, "cubin")
        assert seen == [], (name, seen)
    assert not root.exists()


@pytest.mark.parametrize("bad", [*HOSTILE_EXTS, None, 3], ids=repr)
def test_hostile_exts_are_rejected_before_any_file_access(tmp_path, bad):
    root = tmp_path / "never-created"
    for name, op in _api_calls(root).items():
        if name == "Store.delete":
            continue  # takes no ext
        with file_access_recorder() as seen, pytest.raises(ValueError, match="extension"):
            op(GOOD_KEY, bad)
        assert seen == [], (name, seen)
    assert not root.exists()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(key=st.text(max_size=140), ext=st.text(max_size=20))
def test_any_text_is_a_valid_name_or_rejected_untouched(key, ext):
    root = Path(tempfile.gettempdir()) / "kc-hostile-never-created"
    cache = kernelcache.Cache(root, readonly_roots=())
    valid = KEY_PATTERN.fullmatch(key) and EXT_PATTERN.fullmatch(ext) and ext != "json"
    if valid:
        return
    with file_access_recorder() as seen, pytest.raises(ValueError):
        cache.get_or_create(key, ext, lambda: (b"x", {}))
    assert seen == [] and not root.exists()


@pytest.mark.parametrize(
    "bad",
    [
        "../../etc/passwd",
        "abcdef/../..",
        "\uff41" * 32,
        "a" * 129,
        "abcde",
        "abc\x00def",
        "\u0660" * 32,
    ],
    ids=repr,
)
def test_hostile_key_arguments_of_the_command_line(tmp_path, bad):
    root = tmp_path / "never-created"
    with file_access_recorder() as seen:
        code, out = run_cli("--root", str(root), "show", bad, "--json")
    error = json.loads(out)["error"]
    # (a key, or with a "/" the path of an entry: neither is read)
    assert code == 2 and ("invalid key" in error or "invalid entry path" in error), error
    # (argparse looks up its message catalogs: only paths that have nothing to do with it)
    touched = [path for _, path in seen if str(tmp_path) in str(path) or bad in str(path)]
    assert touched == [] and not root.exists()


def test_show_dot_dot_through_the_console_script(tmp_path):
    root = tmp_path / "cache"
    put(root, "kern")
    proc = kc(root, "show", "../../etc/passwd")
    assert proc.returncode == 2 and "invalid entry path" in proc.stderr, proc.stderr
    assert "root:" not in proc.stdout


# -- bundles ------------------------------------------------------------------------------------
def _bundle(path: Path, members: list[tuple[str, bytes]], manifest: dict | None) -> Path:
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        if manifest is not None:
            body = json.dumps(manifest).encode()
            info = tarfile.TarInfo("manifest.json")
            info.size = len(body)
            tar.addfile(info, io.BytesIO(body))
    return path


def _manifest_for(key: str, ext: str, data: bytes) -> dict:
    doc = make_metadata(GOOD_KEY, "cubin", data, {"name": "k"})
    doc.update(key=key, ext=ext)
    return {
        "format": "kernelcache-bundle",
        "version": 1,
        "created": 1.0,
        "compatibility": {"entry_format": FORMAT_VERSION},
        "entries": [doc],
    }


@pytest.mark.parametrize(
    "key, ext",
    [(k, "cubin") for k in HOSTILE_KEYS if "/" not in k and k not in ("", "..")]
    + [(GOOD_KEY, e) for e in HOSTILE_EXTS if "/" not in e and e],
    ids=repr,
)
def test_hostile_names_in_bundles_are_rejected_before_anything_is_written(tmp_path, key, ext):
    data = b"\x7fELF code"
    path = _bundle(
        tmp_path / "b.tar", [(f"entries/{key}.{ext}", data)], _manifest_for(key, ext, data)
    )
    dest = tmp_path / "never-created"
    with pytest.raises(
        bundle.BundleError, match=r"unexpected member|bad manifest|invalid|extended header"
    ):
        bundle.import_bundle(Store(dest), str(path))
    assert not dest.exists()
    # the manifest alone naming a hostile entry (the member itself well named)
    path = _bundle(
        tmp_path / "c.tar", [(f"entries/{GOOD_KEY}.cubin", data)], _manifest_for(key, ext, data)
    )
    with pytest.raises(bundle.BundleError):
        bundle.import_bundle(Store(dest), str(path))
    assert not dest.exists()


# -- Redis values ---------------------------------------------------------------------------------
@pytest.mark.skipif(REDIS_SERVER is None, reason=SKIP_REASON)
def test_hostile_metadata_in_redis_values_is_rejected(tmp_path):
    key = key_of("redis-hostile")
    data = b"\x7fELF remote code"
    good = make_metadata(key, "cubin", data, {"name": "k"})
    variants = [dict(good, key=k) for k in ("../../etc/passwd", "\uff41" * 64, key.upper())]
    variants += [dict(good, ext=e) for e in ("../../x", "json", "cub\u0456n", "cubin\x00")]
    variants += [dict(good, size=-1), dict(good, size=True), dict(good, digest=None)]
    root = tmp_path / "root"
    with RedisServer(tmp_path / "redis") as srv:
        cache = kernelcache.Cache(root, readonly_roots=(), remote=srv.url)
        for doc in variants:
            srv.client().set(cache.remote.name(key), encode_value(doc, data))
            assert cache.get(key, "cubin") is None, doc
        assert cache.remote.counters["rejected"] == len(variants)
    assert {p.name for p in tmp_path.iterdir()} <= {"root", "redis"}
    assert not root.exists() or not [p for p in root.iterdir() if not p.name.startswith(".")]


# -- manifest records ---------------------------------------------------------------------------
def test_hostile_manifest_records_write_nothing(tmp_path):
    """Records name a kernel by import path; the key is computed, never taken from the record.
    Bad records are refused (KernelArgumentError, or TypeError/ValueError/KeyError from the
    current manifest reader, see docs/reliability.md) with nothing written."""
    from bridge import warm

    base = {
        "kernel": "examples.kernels:add_kernel",
        "arguments": {},
        "variant": {"kwargs": {}, "options": {}},
    }
    records = [
        {**base, "kernel": "os:system"},
        {**base, "kernel": "../../etc:passwd"},
        {**base, "kernel": "examples.kernels:add_kernel\x00"},
        {**base, "kernel": "examples/../../x:y"},
        {**base, "arguments": {"x_ptr": {"jit": "os:getcwd"}}},
        {**base, "arguments": {"x_ptr": {"array": "float32", "shape": [-1]}}},
        {"kernel": "examples.kernels:add_kernel"},
    ]
    root = tmp_path / "never-created"
    for record in records:
        with pytest.raises((TypeError, ValueError, KeyError)):
            warm.compile_record(record, "cuda:90", cache=str(root))
        assert not root.exists(), record
    with pytest.raises(ValueError):
        warm.compile_record(base, "../../cuda:90", cache=str(root))
    assert not root.exists()


# -- symlinks planted at every predictable path -----------------------------------------------------
WORKLOAD = """
import json, logging, os, sys
logging.basicConfig(level=logging.WARNING)
sys.path.insert(0, sys.argv[3])
import kernelcache
from kernelcache import stats
from reliability_support import record_figures, run_cli
root, elsewhere = sys.argv[1], sys.argv[2]
keys = [("%02x" % i) * 32 for i in range(4)]
cache = kernelcache.Cache(root, readonly_roots=(), lock_timeout=2)
for i, key in enumerate(keys):
    art = cache.get_or_create(key, "bin", lambda i=i: (b"code%d" % i * 100, {"name": "k"}))
    assert art.data == b"code%d" % i * 100
art = cache.get(keys[0], "bin")
if art is not None and art.path:  # damage an entry: its quarantine goes through .quarantine/
    with open(art.path, "r+b") as f:
        f.write(b"X")
    assert cache.get(keys[0], "bin") is None
try:
    cache.put(keys[0], "bin", b"code0" * 100, {})
except kernelcache.CacheError as e:  # put raises where the entry cannot be stored
    print("PUT", e, file=sys.stderr)
stats.flush()
codes = {}
for argv in (["stats"], ["stats", "-o", os.path.join(elsewhere, "metrics.prom"), "--format", "prometheus"],
             ["ls"], ["verify", "--repair"], ["prune", "--max-size", "600B"],
             ["export", os.path.join(elsewhere, "b.tar")], ["import", os.path.join(elsewhere, "b.tar")],
             ["doctor"]):
    json_flag = [] if "--format" in argv else ["--json"]  # (they conflict)
    codes[argv[0]] = run_cli("--root", root, *argv, *json_flag)[0]
print(json.dumps(codes))
"""
KEYS = [f"{i:02x}" * 32 for i in range(4)]


def _plant(root: Path, victim_dir: Path, victim: Path, layout: str) -> None:
    root.mkdir()
    if layout == "directories":
        for name in (".tmp", ".locks", ".quarantine", ".stats", ".handoff"):
            (root / name).symlink_to(victim_dir)
        return
    for name in (".tmp", ".locks", ".quarantine", ".stats"):
        (root / name).mkdir()
    links = ["index.json", "summary.jsonl", ".index.json.tmp"]
    links = [f".stats/{n}" for n in links]
    links += [".locks/.probe", ".locks/stats-summary.lock"]
    for key in KEYS:
        links += [f".locks/{key}.lock", f".locks/{key}.build.lock", f".locks/{key}.softlock"]
    links += [f"{KEYS[1]}.bin", f"{KEYS[1]}.json", f"{KEYS[2]}.json"]
    for rel in links:
        (root / rel).symlink_to(victim)


@pytest.mark.parametrize("layout", ["directories", "files"])
def test_planted_symlinks_never_redirect_a_write(tmp_path, layout):
    """Every directory of a root, or every file name that can be predicted in it (entries,
    lock files, the scan index and statistics summary), planted as a symlink to a victim
    outside. Jobs and every command run; the victims are never written, and the jobs get
    their kernels."""
    victim_dir = tmp_path / "victim-dir"
    victim_dir.mkdir()
    victim = tmp_path / "victim-file"
    victim.write_bytes(b"precious")
    before = victim.stat()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    root = tmp_path / "cache"
    _plant(root, victim_dir, victim, layout)
    proc = run_py(WORKLOAD, str(root), str(elsewhere), str(HELPERS))
    codes = json.loads(proc.stdout.strip().splitlines()[-1])
    assert codes["stats"] == 0 and codes["ls"] == 0, (codes, proc.stderr)
    assert list(victim_dir.iterdir()) == []
    after = victim.stat()
    assert victim.read_bytes() == b"precious"
    assert (after.st_mtime_ns, after.st_size, after.st_mode) == (
        before.st_mtime_ns,
        before.st_size,
        before.st_mode,
    )


# -- a group-shared root, two real users, and an intruder ------------------------------------------
# One role of the scenario, run as a real user (setpriv) with umask 002.
ROLE = """
import json, logging, os, sys
logging.basicConfig(level=logging.WARNING)
os.umask(0o002)
import kernelcache
sys.path.insert(0, sys.argv[3])
from reliability_support import record_figures, run_cli
role, root = sys.argv[1], sys.argv[2]
k1, k2, k3 = "a1" * 32, "b2" * 32, "c3" * 32
cache = kernelcache.Cache(root, readonly_roots=())
out = {"uid": os.getuid(), "groups": sorted(os.getgroups())}
if role == "writer":      # daemon: publishes k1
    out["k1"] = cache.get_or_create(k1, "bin", lambda: (b"daemon's kernel", {})).source
elif role == "reader":    # nobody: reads k1, publishes k2
    got = cache.get(k1, "bin")
    out["k1"] = got.data.decode() if got else None
    out["k2"] = cache.get_or_create(k2, "bin", lambda: (b"nobody's kernel", {})).source
elif role == "writer2":   # daemon again: reads k2
    got = cache.get(k2, "bin")
    out["k2"] = got.data.decode() if got else None
elif role == "intruder":  # bin, not in the group: cannot write the shared root; plants in /world
    out["shared"] = cache.get_or_create(k3, "bin", lambda: (b"bin's kernel", {})).source
    world = kernelcache.Cache(sys.argv[4], readonly_roots=())
    out["world"] = world.get_or_create(k3, "bin", lambda: (b"EVIL", {})).source
elif role == "victim":    # nobody in the world-writable root the intruder planted into
    got = cache.get(k3, "bin")
    out["planted"] = got.data.decode() if got else None
    art = cache.get_or_create(k3, "bin", lambda: (b"good kernel", {}))
    out["k3"] = [art.data.decode(), art.source]
    code, text = run_cli("--root", root, "verify", "--json")
    out["verify"] = [p["kind"] for p in json.loads(text)["problems"]]
print(json.dumps(out))
"""


@pytest.mark.skipif(not CAN_SHARE, reason="needs root, unshare -m and setpriv (real users)")
def test_group_shared_root_two_users_and_an_intruder(shared_tmp):
    """Users daemon (1) and nobody (65534) share group 4242 (an /etc/group bind-mounted in a
    private mount namespace); the root is root:4242, mode 2775 (set-group-ID), umask 002.
    Each user's entries are readable by the other and trusted (same group). User bin (2), not
    in the group, cannot write there; in a world-writable sticky root it can plant an entry,
    which nobody refuses with a warning (KERNELCACHE_TRUST=group) and does not serve."""
    shared = shared_tmp
    group = shared / "group"
    group.write_text(Path("/etc/group").read_text() + f"kcshare:x:{SHARE_GID}:daemon,nobody\n")
    root, world = shared / "cache", shared / "world"
    for path, mode in ((root, 0o2775), (world, 0o3777)):
        path.mkdir()
        os.chown(path, 0, SHARE_GID)
        os.chmod(path, mode)
    helpers_dir = str(HELPERS)

    def as_user(uid: int, gid: int, role: str, where: Path) -> str:
        who = f"--reuid={uid} --regid={gid} --init-groups"
        argv = " ".join(repr(a) for a in (role, str(where), helpers_dir, str(world)))
        return f'setpriv {who} {sys.executable} -c "$ROLE" {argv}'

    script = "\n".join(
        [
            "set -e",
            f"mount --bind {group} /etc/group",
            as_user(1, SHARE_GID, "writer", root),
            as_user(65534, SHARE_GID, "reader", root),
            as_user(1, SHARE_GID, "writer2", root),
            as_user(2, 2, "intruder", root),
            as_user(65534, SHARE_GID, "victim", world),
        ]
    )
    proc = subprocess.run(
        ["unshare", "-m", "sh", "-c", script],
        env=other_users_env(shared, ROLE=ROLE),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    writer, reader, writer2, intruder, victim = map(json.loads, proc.stdout.splitlines())
    assert SHARE_GID in writer["groups"] and SHARE_GID in reader["groups"]
    assert writer["k1"] == "local"
    assert reader == {**reader, "k1": "daemon's kernel", "k2": "local"}
    assert writer2["k2"] == "nobody's kernel"
    assert intruder == {**intruder, "shared": "memory", "world": "local"}
    assert victim["planted"] is None and victim["k3"] == ["good kernel", "memory"]
    assert victim["verify"] == ["untrusted"]
    assert "refusing artifacts" in proc.stderr and "owned by user 2" in proc.stderr
    for name, owner in ((f"{'a1' * 32}.bin", 1), (f"{'b2' * 32}.json", 65534)):
        st = (root / name).stat()
        assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (owner, SHARE_GID, 0o664)
    for sub in (".tmp", ".locks"):
        st = (root / sub).stat()
        assert st.st_gid == SHARE_GID and st.st_mode & stat.S_ISGID, sub
    assert (world / f"{'c3' * 32}.bin").read_bytes() == b"EVIL"  # left alone, not served
    record_figures(
        "group-shared root, two users and an intruder",
        processes=5,
        operations=9,
        faults=1,
        corrupt_served=0,
        jobs_failed=0,
    )
