"""Faults in the environment: locks left by killed processes, permissions that really stop
the process (another user via setpriv, or a private mount namespace: tests run as root in CI,
where permission bits alone stop nothing), full disks, clock skew.

The job never fails and gets the right kernel; nothing partial or corrupt is left or served.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from artifact_images import elf_image
from cli_support import put
from reliability_support import record_figures, run_cli
from support import (
    CAN_DROP_PRIVILEGES,
    CAN_UNSHARE,
    HELPERS,
    child_env,
    key_of,
    other_users_env,
    run_in_namespace,
    run_py,
)

import kernelcache
from kernelcache.store import Artifact, Store
from kernelcache.store.locks import Locker


def _softlock(root, name: str, body: bytes, age: float):
    locks = root / ".locks"
    locks.mkdir(parents=True, exist_ok=True)
    path = locks / f"{name}.softlock"
    path.write_bytes(body)
    when = time.time() - age
    os.utime(path, (when, when))
    return path


# -- locks left behind ------------------------------------------------------------------------
def test_soft_lock_without_a_holder_record_is_broken_after_seconds_not_minutes(root):
    """A process killed between creating its soft lock (O_EXCL) and writing the record in it
    leaves an empty file: no host, no pid. It used to hold the key for lock_stale (5 minutes),
    so every process waited for the whole lock timeout."""
    name = key_of("empty-softlock")
    path = _softlock(root, name, b"", age=10)
    locker = Locker(str(root), mode="soft", stale_after=300)
    started = time.monotonic()
    locker.acquire(name, shared=False, timeout=2).release()
    assert time.monotonic() - started < 1
    assert not path.exists()
    fresh = _softlock(root, name, b"", age=0)  # a holder about to write its record: kept
    with pytest.raises(Exception, match="timed out"):
        locker.acquire(name, shared=False, timeout=0.3)
    assert fresh.exists()


def test_a_stale_soft_lock_is_taken_at_once_even_without_waiting(root):
    """timeout=0 (delete, prune) breaks a dead holder's lock and takes it in the same try."""
    name = key_of("dead-holder")
    record = {"host": __import__("socket").gethostname(), "pid": 2**22 + 1, "time": 0, "token": "t"}
    _softlock(root, name, json.dumps(record).encode(), age=0)
    locker = Locker(str(root), mode="soft", stale_after=300)
    locker.acquire(name, shared=False, timeout=0).release()


def test_a_fold_killed_after_hiding_the_logs_is_finished_by_the_next_prune(root):
    """prune folds the statistics logs of finished processes: it renames each out of view,
    writes the summary, then deletes them. Killed between the renames and the summary, the
    counts were hidden until some other process's log became foldable."""
    Store(root).put(key_of("fold"), "bin", b"x", {})
    stats_dir = root / ".stats"
    stats_dir.mkdir()
    for i in range(2):
        log = stats_dir / f"otherhost-{i}-0000000{i}.jsonl"
        log.write_text(json.dumps({"v": 1, "delta": {"hits": 5, "builds": 1}}) + "\n")
        os.utime(log, (1e9, 1e9))
    assert _counter(root, "hits") == 10
    for log in stats_dir.glob("otherhost-*.jsonl"):  # the killed fold's renames
        log.rename(log.with_name(log.name + ".folding"))
    code, out = run_cli("--root", str(root), "prune", "--json")
    assert code == 0 and json.loads(out)["result"]["folded_logs"] == 2, out
    assert _counter(root, "hits") == 10 and _counter(root, "builds") == 2
    assert sorted(p.name for p in stats_dir.iterdir()) == ["index.json", "summary.jsonl"]


def _counter(root, name: str) -> int:
    code, out = run_cli("--root", str(root), "stats", "--json")
    assert code == 0, out
    return json.loads(out)["counters"][name]


# A job process: get_or_create three kernels (whole cubins; each build waits until told to
# finish when $KC_HOLD names a file), print what it got.
JOB = (
    f"import sys\nsys.path.insert(0, {str(HELPERS)!r})\n"
    + """
import json, logging, os, sys, time, kernelcache
from artifact_images import elf_image, launch
logging.basicConfig(level=logging.WARNING)
root, hold = sys.argv[1], os.environ.get("KC_HOLD")
keys = [("%02x" % i) * 32 for i in range(3)]

def build(i):
    def run():
        print("BUILDING", i, flush=True)
        while hold and not os.path.exists(hold):
            time.sleep(0.01)
        return elf_image(b"kernel-%d" % i * 1000), launch(name="k%d" % i)
    return run

cache = kernelcache.Cache(root, readonly_roots=())
got = [cache.get_or_create(k, "cubin", build(i)) for i, k in enumerate(keys)]
assert all(a.data == elf_image(b"kernel-%d" % i * 1000) for i, a in enumerate(got))
print(json.dumps({"sources": [a.source for a in got], "stats": kernelcache.process_stats()}))
"""
)
JOB_KEYS = [(f"{i:02x}" * 32, elf_image(f"kernel-{i}".encode() * 1000)) for i in range(3)]


@pytest.mark.parametrize("lock_mode", ["soft", "flock"])
def test_builder_killed_while_holding_the_build_lock(tmp_path, lock_mode):
    """A job process killed in the middle of a build (holding the key's single-flight lock)
    does not stall the next process: a soft lock of a dead pid is broken at once, a flock is
    dropped by the kernel."""
    root = tmp_path / "cache"
    hold = tmp_path / "never"
    env = child_env(
        KERNELCACHE_LOCK_MODE=lock_mode, KERNELCACHE_LOCK_TIMEOUT="60", KC_HOLD=str(hold)
    )
    first = subprocess.Popen(
        [sys.executable, "-c", JOB, str(root)], env=env, stdout=subprocess.PIPE, text=True
    )
    assert first.stdout.readline().split() == ["BUILDING", "0"]
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=30)
    first.stdout.close()
    started = time.monotonic()
    proc = run_py(JOB, str(root), KERNELCACHE_LOCK_MODE=lock_mode, KERNELCACHE_LOCK_TIMEOUT="60")
    assert time.monotonic() - started < 20  # not the 60 s lock timeout
    doc = json.loads(proc.stdout.strip().splitlines()[-1])
    assert doc["sources"] == ["local"] * 3 and doc["stats"]["lock_timeouts"] == 0
    if lock_mode == "soft":
        assert proc.stderr.count("broke stale lock") == 1
    code, out = run_cli("--root", str(root), "verify", "--json")
    assert code == 0 and json.loads(out)["entries_ok"] == 3
    record_figures(
        f"builder killed holding the build lock ({lock_mode})",
        processes=2,
        operations=4,
        faults=1,
        corrupt_served=0,
        jobs_failed=0,
    )


# -- permissions that stop the process --------------------------------------------------------
@pytest.mark.skipif(not CAN_DROP_PRIVILEGES, reason="needs root and setpriv to act as another user")
def test_lock_directory_of_another_user_that_this_user_cannot_write(shared_tmp):
    """A shared root whose .locks/ belongs to root (mode 755) and that user 65534 may write:
    three processes of that user at once get their kernels (without locks, one warning each
    kind), publish valid entries, and leave nothing in .locks/."""
    shared = shared_tmp
    root = shared / "cache"
    root.mkdir()
    os.chmod(root, 0o777)
    (root / ".locks").mkdir()
    os.chmod(root / ".locks", 0o755)
    procs = [
        subprocess.Popen(
            [
                "setpriv",
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                sys.executable,
                "-c",
                JOB,
                str(root),
            ],
            env=other_users_env(shared),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        doc = json.loads(out.strip().splitlines()[-1])
        assert doc["sources"] == ["local"] * 3 and doc["stats"]["errors"] == 0
        assert err.count("without locks") <= 1 and err.count("without a lock") <= 1
    assert os.listdir(root / ".locks") == []
    store = Store(root, readonly=True, trust="any")
    for key, data in JOB_KEYS:
        art = store.read(key, "cubin")
        assert isinstance(art, Artifact) and art.data == data
        assert os.stat(art.path).st_uid == 65534
    record_figures(
        "lock directory not writable (user 65534)",
        processes=3,
        operations=9,
        faults=3,
        corrupt_served=0,
        jobs_failed=0,
    )


# -- clock skew -------------------------------------------------------------------------------
def test_entries_from_the_future_and_prune(root):
    """Last-used stamps far in the future (clock skew between hosts): prune never fails on
    them, a size cap of one byte removes them, and a hit resets the stamp to now, after which the entry
    ages (and is pruned) like any other. Until it is used again, --older-than keeps it and
    --max-size evicts it last: see test_a_future_stamp_ages_from_when_prune_first_sees_it."""
    now = time.time()
    keys = {}
    for name, offset in (("old", -3 * 86400), ("recent", -60), ("future", 365 * 86400)):
        art = put(root, name, size=1000)
        os.utime(root / f"{art.key}.json", (now + offset, now + offset))
        keys[name] = art.key
    code, out = run_cli("--root", str(root), "prune", "--older-than", "1d", "--json")
    assert code == 0
    gone = [a["key"] for a in json.loads(out)["plan"]["actions"]]
    assert gone == [keys["old"]]
    one = 1000 + (root / f"{keys['future']}.json").stat().st_size  # room for one entry
    cap = f"{one + 200}B"
    code, out = run_cli("--root", str(root), "prune", "--max-size", cap, "--dry-run", "--json")
    assert [a["key"] for a in json.loads(out)["plan"]["actions"]] == [keys["recent"]]
    cache = kernelcache.Cache(root, readonly_roots=())
    assert cache.get(keys["future"], "cubin") is not None  # a hit: the stamp is reset to now
    stamp = (root / f"{keys['future']}.json").stat().st_mtime
    assert abs(stamp - time.time()) < 60
    later = time.time() - 2 * 86400  # two days pass without a use
    os.utime(root / f"{keys['future']}.json", (later, later))
    code, out = run_cli("--root", str(root), "prune", "--older-than", "1d", "--json")
    assert [a["key"] for a in json.loads(out)["plan"]["actions"]] == [keys["future"]]
    code, out = run_cli("--root", str(root), "prune", "--max-size", "1B", "--yes", "--json")
    assert code == 0 and json.loads(out)["plan"]["kept_entries"] == 0


def test_a_future_stamp_ages_from_when_prune_first_sees_it(root):
    """An entry stamped a year ahead by a host with a wrong clock, never read again: it should
    age from the day prune first saw it, not be kept for a year by --older-than (nor be kept
    over recently used entries by --max-size)."""
    art = put(root, "future", size=1000)
    ahead = time.time() + 365 * 86400
    os.utime(root / f"{art.key}.json", (ahead, ahead))
    run_cli("--root", str(root), "prune", "--older-than", "1d")
    stamp = (root / f"{art.key}.json").stat().st_mtime
    assert stamp <= time.time() + 300  # reset like a hit would


# -- full disk --------------------------------------------------------------------------------
@pytest.mark.skipif(not CAN_UNSHARE, reason="needs a private mount namespace (unshare -rm)")
def test_import_into_a_full_disk_publishes_nothing_and_leaves_nothing_in_the_way(tmp_path):
    """12 entries of 40 KB into a 256 KiB filesystem: the import fails with a clear error and
    removes the entries it had published (all or nothing); a bundle that fits then imports."""
    source = tmp_path / "source"
    for i in range(12):
        put(source, f"k{i}", size=40_000)
    bundle_path = tmp_path / "b.tar"
    small_path = tmp_path / "small.tar"
    code, out = run_cli("--root", str(source), "export", str(bundle_path), "--json")
    assert code == 0, out
    code, out = run_cli(
        "--root", str(source), "export", str(small_path), "--kernel", "k0", "--kernel", "k1"
    )
    assert code == 0, out
    root = tmp_path / "small"
    root.mkdir()
    proc = run_in_namespace(
        f"mount -t tmpfs -o size=256k tmpfs {root}",
        f"""
        import json, os, sys
        sys.path.insert(0, {str(HELPERS)!r})
        from reliability_support import run_cli
        root = {str(root)!r}
        code, out = run_cli("--root", root, "import", {str(bundle_path)!r}, "--json")
        print("FIRST", code, json.loads(out).get("error", ""))
        code, out = run_cli("--root", root, "verify", "--json")
        doc = json.loads(out)
        print("VERIFY", code, doc["entries_ok"], doc["problems"])
        print("TMP", os.listdir(os.path.join(root, ".tmp")))
        code, out = run_cli("--root", root, "import", {str(bundle_path)!r}, "--json", "--dry-run")
        print("DRY", code, json.loads(out)["imported"])
        code, out = run_cli("--root", root, "import", {str(small_path)!r}, "--json")
        print("SMALL", code, json.loads(out)["imported"])
        """,
    )
    first = proc.stdout.split("FIRST ", 1)[1].splitlines()[0]
    assert first.startswith("2 ") and "No space left" in first and "prune" in first  # nothing done
    assert "nothing was imported" in first
    verify = proc.stdout.split("VERIFY ", 1)[1].splitlines()[0]
    assert verify == "0 0 []", verify  # the entries that had fitted were removed again
    assert "TMP []" in proc.stdout
    assert "DRY 0 12" in proc.stdout
    assert "SMALL 0 2" in proc.stdout
