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

import io
import json
import os
import tarfile

import pytest
from conftest import IS_ROOT, key_of, run_py
from redis_server import REDIS_SERVER, SKIP_REASON, RedisServer
from test_cli_support import put
from test_reliability_support import run_cli

import kernelcache
from kernelcache import bundle
from kernelcache.remote import MAGIC
from kernelcache.store import Store

#: deeper than any JSON parser's recursion limit, smaller than every size limit
NESTED = b"[" * 200_000
NESTED_SHORT = b"[" * 4000  # a soft lock record is read in 4 KiB


# -- planted files the cache parses -----------------------------------------------------------
def test_deeply_nested_metadata_is_corrupt_not_a_crash(root, caplog_warnings):
    cache = kernelcache.Cache(root, readonly_roots=())
    key = key_of("nested-meta")
    cache.put(key, "cubin", b"code", {"name": "k"})
    (root / f"{key}.json").write_bytes(NESTED)
    assert cache.get(key, "cubin") is None  # a miss, not RecursionError in the user's job
    assert any("quarantined" in r.getMessage() for r in caplog_warnings.records)
    assert cache.get_or_create(key, "cubin", lambda: (b"code", {})).data == b"code"
    other = key_of("nested-meta-2")
    Store(root).put(other, "cubin", b"more", {})
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
    assert Store(root).read(other) is None and Store(root).read(key).data == b"code"


def test_deeply_nested_index_summary_and_logs_do_not_break_commands(root):
    put(root, "kern", size=100)
    put(root, "kern", size=200)
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
        art = cache.get_or_create(key, "cubin", lambda: (b"built", {}))
        assert art.data == b"built" and art.source == "local"
        assert cache.remote.counters["rejected"] == 1


# -- the ROCm hand-off directory ----------------------------------------------------------------
HANDOFF_CHILD = """
import json, os, sys
from bridge import handoff
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
    directory planted as a symlink or as another user's directory: none of them is used."""
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
    assert all(not d.startswith(str(theirs)) for d in dirs.values()), dirs
