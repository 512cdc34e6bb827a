"""The size cap of a writable root (``KERNELCACHE_MAX_SIZE``, ``Cache(max_size=)``): real
processes putting at once keep the root under it, least recently used entries go first, one
eviction pass runs at a time, read-only roots are never touched."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import child_env, run_py
from test_cli_support import files_under, kc, kc_json, put

import kernelcache
from kernelcache.capacity import PASS_LOCK
from kernelcache.errors import ConfigError
from kernelcache.locks import Locker

PUTTER = """
import hashlib, os, sys
import kernelcache
tag, count, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
cache = kernelcache.Cache()
for i in range(count):
    key = hashlib.sha256(f"{tag}-{i}".encode()).hexdigest()
    cache.put(key, "cubin", os.urandom(size), {"name": tag, "target": "cuda:90"})
print("put", flush=True)
if cache.capacity:
    cache.capacity.wait()
print(cache.capacity.passes if cache.capacity else -1)
"""


def putters(root: Path, tags: list[str], count: int, size: int, **env: str) -> list[int]:
    """Run one process per tag at once, each putting ``count`` entries of ``size`` bytes into
    ``root``; the eviction passes each ran."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(PUTTER), tag, str(count), str(size)],
            env=child_env(KERNELCACHE_DIR=str(root), **env),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for tag in tags
    ]
    passes = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        passes.append(int(out.split()[-1]))
    return passes


def test_processes_putting_at_once_keep_the_root_under_the_cap(tmp_path):
    root, image = tmp_path / "cache", tmp_path / "image"
    for i in range(5):
        put(image, "baked", size=20_000, seed=i)
    baked = files_under(image)
    cap = 300_000
    passes = putters(
        root,
        ["a", "b", "c"],
        count=60,
        size=8_000,
        KERNELCACHE_MAX_SIZE="300000",
        KERNELCACHE_READONLY_DIRS=str(image),
    )
    doc = kc_json(root, "stats")
    # 180 entries of ~8.4 KB were written (1.5 MB): the root holds at most the cap, give or
    # take the puts that raced with the last pass
    assert 0 < doc["bytes"] <= cap * 1.15, doc["bytes"]
    assert doc["entries"] < 60
    assert sum(passes) >= 1
    assert files_under(image) == baked  # a read-only root is never evicted from
    assert kc_json(root, "verify")["clean"]


def test_least_recently_used_entries_go_first(tmp_path):
    root = tmp_path / "cache"
    # entries of ~10.4 KB: 10 old ones (the higher i, the older), 5 recent ones
    old = [put(root, "old", size=10_000, seed=i, last_used=2 * 86400 + i) for i in range(10)]
    recent = [put(root, "recent", size=10_000, seed=i, last_used=60 + i) for i in range(5)]
    # the 20th entry passes the cap (200K): one pass keeps 80% of it, 15 entries, so the 5
    # least recently used go: the 5 oldest of the old ones
    (passes,) = putters(root, ["new"], count=5, size=10_000, KERNELCACHE_MAX_SIZE="200K")
    assert passes >= 1  # (the first measured the root, in its helper, while the puts went on)
    keys = {e["key"] for e in kc_json(root, "ls")["entries"]}
    assert keys & {a.key for a in old} == {a.key for a in old[:5]}
    assert {a.key for a in recent} <= keys
    assert len(keys) == 15


def test_one_eviction_pass_at_a_time(tmp_path):
    root = tmp_path / "cache"
    for i in range(10):
        put(root, "old", size=10_000, seed=i, last_used=86400)
    held = Locker(str(root)).acquire(PASS_LOCK, shared=False, timeout=0)
    child = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(PUTTER), "new", "5", "10000"],
        env=child_env(KERNELCACHE_DIR=str(root), KERNELCACHE_MAX_SIZE="50K"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout.readline().strip() == "put"  # every put returned: none waited
        time.sleep(0.3)  # (its pass tries the lock meanwhile)
        assert kc_json(root, "stats")["entries"] == 15  # nothing evicted while another holds it
    finally:
        held.release()
    out, err = child.communicate(timeout=60)
    assert child.returncode == 0, err
    assert int(out.split()[-1]) == 1  # the pass tried again, and ran once the lock was free
    assert kc_json(root, "stats")["bytes"] <= 50 * 1024


def test_no_cap_by_default_and_sizes_read_with_the_one_parser(tmp_path, monkeypatch):
    assert kernelcache.Cache(tmp_path / "a").capacity is None
    assert kernelcache.Cache(tmp_path / "b", max_size="50G").capacity.max_size == 50 << 30
    monkeypatch.setenv("KERNELCACHE_MAX_SIZE", "1.5GiB")
    assert kernelcache.Cache(tmp_path / "c").capacity.max_size == int(1.5 * (1 << 30))
    assert kernelcache.Cache(tmp_path / "d", max_size=0).capacity is None
    with pytest.raises(ValueError, match="invalid size 'lots'"):
        kernelcache.Cache(tmp_path / "e", max_size="lots")
    monkeypatch.setenv("KERNELCACHE_MAX_SIZE", "lots")
    with pytest.raises(ConfigError, match="KERNELCACHE_MAX_SIZE='lots'"):
        kernelcache.Cache(tmp_path / "f")


def test_stats_shows_the_cap(tmp_path):
    put(tmp_path / "cache")
    env = {"KERNELCACHE_MAX_SIZE": "1M"}
    doc = kc_json(tmp_path / "cache", "stats", env=env)
    assert doc["max_size"] == 1 << 20
    human = kc(tmp_path / "cache", "stats", env=env).stdout
    assert "Size cap:" in human and "% used; KERNELCACHE_MAX_SIZE)" in human
    prom = kc(tmp_path / "cache", "stats", "--format", "prometheus", env=env).stdout
    assert "# TYPE kernelcache_max_size_bytes gauge" in prom
    assert prom.count(f"}} {doc['max_size']}\n") == 1  # the cap's sample
    assert kc_json(tmp_path / "cache", "stats")["max_size"] is None
    assert "Size cap:" not in kc(tmp_path / "cache", "stats").stdout


def test_a_bad_cap_is_a_usage_error_naming_the_variable(tmp_path):
    put(tmp_path / "cache")
    proc = kc(tmp_path / "cache", "clear", "--dry-run", env={"KERNELCACHE_MAX_SIZE": "50Q"})
    assert proc.returncode == 2
    assert "KERNELCACHE_MAX_SIZE='50Q'" in proc.stderr


@pytest.mark.parametrize("planted", [os.mkdir, os.mkfifo], ids=["directory", "fifo"])
def test_a_cap_that_cannot_be_kept_never_fails_a_put(tmp_path, planted):
    root = tmp_path / "cache"
    put(root)
    (root / ".stats").mkdir(exist_ok=True)
    planted(root / ".stats" / "usage")  # not a file: accounting cannot work (and never waits)
    out = run_py(
        """
        import hashlib, kernelcache
        cache = kernelcache.Cache(max_size="10K")
        for i in range(5):
            key = hashlib.sha256(str(i).encode()).hexdigest()
            cache.put(key, "cubin", b"x" * 4000, {})
            cache.capacity.wait()
        print(cache.capacity.broken)
        """,
        KERNELCACHE_DIR=str(root),
    )
    assert out.stdout.split()[-1] == "True"
    assert out.stderr.count("cannot keep") == 1
    assert kc_json(root, "stats")["entries"] == 6


def usage_total(path: Path) -> int:
    """The running total the usage file says: its base and the bytes recorded since."""
    data = path.read_bytes()
    records = [data[i : i + 24] for i in range(0, len(data), 24)]
    assert records[0][:1] == b"B" and all(r[:1] == b"+" for r in records[1:])
    return sum(int(r[1:23]) for r in records)


def test_prune_and_clear_make_the_next_capped_put_measure_again(tmp_path):
    root = tmp_path / "cache"
    putters(root, ["a"], count=10, size=10_000, KERNELCACHE_MAX_SIZE="1M")
    usage = root / ".stats" / "usage"
    entry = 10_000 + 400  # bytes of an entry, about
    # the first put made the file; a pass measured the root (the base), puts went on meanwhile
    # (an entry published between the pass's look at the file and its listing counts twice)
    assert 0 <= usage_total(usage) - kc_json(root, "stats")["bytes"] <= 2 * entry
    kc_json(root, "prune", "--max-size", "50K")
    assert not usage.exists()
    assert putters(root, ["b"], count=1, size=10_000, KERNELCACHE_MAX_SIZE="1M") == [1]
    assert 0 <= usage_total(usage) - kc_json(root, "stats")["bytes"] <= 2 * entry
    kc_json(root, "clear")
    assert not usage.exists()


def test_short_processes_wait_at_exit_for_their_pass(tmp_path):
    root = tmp_path / "cache"
    for n in range(4):  # each puts 5 entries of ~10.4 KB and exits at once
        run_py(
            """
            import hashlib, os, sys, kernelcache
            cache = kernelcache.Cache(max_size="60K")
            for i in range(5):
                key = hashlib.sha256(f"{sys.argv[1]}-{i}".encode()).hexdigest()
                cache.put(key, "cubin", os.urandom(10_000), {})
            """,
            str(n),
            KERNELCACHE_DIR=str(root),
        )
    assert 0 < kc_json(root, "stats")["bytes"] <= 60 * 1024


HELPED = """
import hashlib, os, sys, kernelcache
import kernelcache.capacity as capacity
how = sys.argv[1]
if how == "no-helpers":
    sys.executable = ""  # nothing to start a helper with
if how == "failing-helper":
    capacity.HELPER_CODE = "import sys; sys.stderr.write('cannot start here'); sys.exit(3)"
cache = kernelcache.Cache(max_size="60K")
def put(i):
    key = hashlib.sha256(f"{how}-{i}".encode()).hexdigest()
    cache.put(key, "cubin", os.urandom(10_000), {})
for i in range(10):
    put(i)
cache.capacity.wait()
put(10)  # (where the helper failed, this pass runs in a thread)
cache.capacity.wait()
helper = cache.capacity._helper
print(repr(capacity._no_helpers_since))
print(helper.proc.pid if helper and helper.alive else -1, cache.capacity.passes, flush=True)
if how == "killed":
    os._exit(0)  # no exit handlers: the helper sees its input close
"""


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.parametrize("how", ["exits", "killed"])
def test_passes_run_in_a_helper_process_that_ends_with_its_process(tmp_path, how):
    root = tmp_path / "cache"
    out = run_py(HELPED, how, KERNELCACHE_DIR=str(root))
    pid, passes = map(int, out.stdout.split()[-2:])
    assert pid > 0 and passes >= 1
    deadline = time.monotonic() + 20
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(pid)
    assert 0 < kc_json(root, "stats")["bytes"] <= 60 * 1024


@pytest.mark.parametrize("how", ["no-helpers", "failing-helper"])
def test_without_a_helper_process_passes_run_in_a_thread(tmp_path, how):
    root = tmp_path / "cache"
    out = run_py(HELPED, how, KERNELCACHE_DIR=str(root))
    pid, passes = map(int, out.stdout.split()[-2:])
    assert pid == -1 and passes >= 1
    assert 0 < kc_json(root, "stats")["bytes"] <= 60 * 1024
    assert "Traceback" not in out.stderr
    if how == "failing-helper":  # why is kept (and logged at INFO)
        assert "status 3: cannot start here" in out.stdout
