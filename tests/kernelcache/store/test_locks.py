"""Per-key locks with real processes: flock and soft (NFS) modes, stale locks, timeouts."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import filelock
import pytest
from support import child_env, key_of, run_py

import kernelcache
from kernelcache.errors import LockTimeout, LockUnavailable
from kernelcache.store.locks import Locker
from kernelcache.store.removal import repair

HOLD = """
import sys, time
from kernelcache.store.locks import Locker
root, name, mode, shared, seconds = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "1", float(sys.argv[5])
stale = float(sys.argv[6]) if len(sys.argv) > 6 else 300.0
held = Locker(root, mode=mode, stale_after=stale).acquire(name, shared=shared, timeout=10)
print("HELD", flush=True)
time.sleep(seconds)
held.release()
print("RELEASED", flush=True)
"""


def hold_in_child(
    root: Path,
    name: str,
    mode: str,
    *,
    shared: bool = False,
    seconds: float = 30,
    stale: float = 300,
) -> subprocess.Popen:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            HOLD,
            str(root),
            name,
            mode,
            "1" if shared else "0",
            str(seconds),
            str(stale),
        ],
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    line = proc.stdout.readline()
    assert line.strip() == "HELD", proc.stderr.read()
    return proc


def stop(proc: subprocess.Popen) -> None:
    proc.kill()
    proc.wait(timeout=10)
    proc.stdout.close()
    proc.stderr.close()


@pytest.fixture
def lockroot(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    root.mkdir()
    return root


@pytest.mark.parametrize("mode", ["flock", "soft"])
def test_exclusive_excludes_other_processes(lockroot, mode):
    name = key_of("ex", mode)
    child = hold_in_child(lockroot, name, mode)
    try:
        started = time.monotonic()
        with pytest.raises(LockTimeout):
            Locker(str(lockroot), mode=mode).acquire(name, shared=False, timeout=0.3)
        # waited its timeout; the bound is generous (a loaded machine), the holder never lets go
        assert 0.25 < time.monotonic() - started < 0.3 + 10
    finally:
        stop(child)


FILELOCK_HOLD = """
import sys, time, filelock
lock = filelock.FileLock(sys.argv[1])
lock.acquire(timeout=10)
print("HELD", flush=True)
time.sleep(30)
"""


def test_exclusive_flock_is_filelocks_lock(lockroot):
    """A process holding ``.locks/<key>.lock`` with filelock's FileLock excludes our writers and
    builders, and filelock cannot take a lock file we hold."""
    name = key_of("filelock")
    (lockroot / ".locks").mkdir()
    path = str(lockroot / ".locks" / f"{name}.lock")
    child = subprocess.Popen(
        [sys.executable, "-c", FILELOCK_HOLD, path],
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout.readline().strip() == "HELD", child.stderr.read()
        with pytest.raises(LockTimeout):
            Locker(str(lockroot), mode="flock").acquire(name, shared=False, timeout=0.3)
    finally:
        stop(child)
    held = Locker(str(lockroot), mode="flock").acquire(name, shared=False, timeout=5)
    try:
        with pytest.raises(filelock.Timeout):
            filelock.FileLock(path).acquire(timeout=0.2)
    finally:
        held.release()
    lock = filelock.FileLock(path)
    lock.acquire(timeout=5)
    lock.release()


OLD_FILELOCK = """
import logging, sys, types
logging.basicConfig(level=logging.WARNING)
sys.modules["filelock"] = types.ModuleType("filelock")  # a filelock without lock_descriptor
import kernelcache
root, key = sys.argv[1], sys.argv[2]
cache = kernelcache.Cache(root, readonly_roots=())
for _ in range(2):
    assert cache.get_or_create(key, "bin", lambda: (b"built", {})).data == b"built"
cache.put(key.replace("a", "b"), "bin", b"put", {})
print(cache.get(key, "bin").data.decode(), cache.get(key.replace("a", "b"), "bin").data.decode())
"""


def test_filelock_older_than_3_30_means_no_locks_and_a_clear_warning(lockroot):
    """Installed without its dependencies next to an old filelock, the cache still serves the
    job: it works without locks and says which filelock it needs."""
    proc = run_py(OLD_FILELOCK, str(lockroot), "a" * 64)
    assert proc.stdout.split() == ["built", "put"]
    assert "filelock 3.30 or later" in proc.stderr, proc.stderr
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("WARNING")]
    assert len(warnings) == len(set(warnings)) <= 2, warnings  # each kind of failure warned once


def test_flock_shared_holders_coexist_and_block_writers(lockroot):
    name = key_of("shared")
    child = hold_in_child(lockroot, name, "flock", shared=True)
    try:
        locker = Locker(str(lockroot), mode="flock")
        held = locker.acquire(name, shared=True, timeout=0.5)
        held.release()
        with pytest.raises(LockTimeout):
            locker.acquire(name, shared=False, timeout=0.2)
    finally:
        stop(child)


def test_flock_released_when_holder_is_killed(lockroot):
    name = key_of("killed-flock")
    child = hold_in_child(lockroot, name, "flock")
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=10)
    held = Locker(str(lockroot), mode="flock").acquire(name, shared=False, timeout=5)
    held.release()
    stop(child)


def test_soft_lock_of_killed_process_on_this_host_is_broken(lockroot, caplog_warnings):
    name = key_of("killed-soft")
    child = hold_in_child(lockroot, name, "soft")
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=10)
    record = json.loads((lockroot / ".locks" / f"{name}.softlock").read_text())
    assert record["pid"] == child.pid and record["host"]
    started = time.monotonic()
    held = Locker(str(lockroot), mode="soft").acquire(name, shared=False, timeout=5)
    assert time.monotonic() - started < 4, "waited out the timeout: the lock was not broken"
    held.release()
    assert not (lockroot / ".locks" / f"{name}.softlock").exists()
    assert any("broke stale lock" in r.getMessage() for r in caplog_warnings.records)
    stop(child)


def _plant_soft_lock(root: Path, name: str, host: str, pid: int, age: float) -> Path:
    (root / ".locks").mkdir(exist_ok=True)
    path = root / ".locks" / f"{name}.softlock"
    path.write_text(json.dumps({"host": host, "pid": pid, "time": time.time() - age, "token": "t"}))
    os.utime(path, (time.time() - age, time.time() - age))
    return path


def test_soft_lock_of_another_host_is_broken_only_when_old(lockroot):
    name = key_of("other-host")
    locker = Locker(str(lockroot), mode="soft", stale_after=60)
    _plant_soft_lock(lockroot, name, "some-other-host", os.getpid(), age=5)
    with pytest.raises(LockTimeout):
        locker.acquire(name, shared=False, timeout=0.3)
    _plant_soft_lock(lockroot, name, "some-other-host", os.getpid(), age=120)
    held = locker.acquire(name, shared=False, timeout=2)
    record = json.loads((lockroot / ".locks" / f"{name}.softlock").read_text())
    assert record["token"] == held.token
    held.release()


def test_soft_lock_garbage_record_is_stale_by_age(lockroot):
    name = key_of("garbage-soft")
    path = _plant_soft_lock(lockroot, name, "x", 1, age=0)
    path.write_bytes(b"\x00garbage")
    locker = Locker(str(lockroot), mode="soft", stale_after=1.0)
    with pytest.raises(LockTimeout):
        locker.acquire(name, shared=False, timeout=0.2)
    old = time.time() - 10
    os.utime(path, (old, old))
    locker.acquire(name, shared=False, timeout=2).release()


def test_soft_lock_heartbeat_keeps_a_long_holder_alive(lockroot):
    """A holder that keeps its lock longer than stale_after refreshes it, so nobody breaks it."""
    name = key_of("heartbeat")
    # the child pretends to live on another host by having its pid checked: same host, alive
    child = hold_in_child(lockroot, name, "soft", seconds=30, stale=0.6)
    try:
        time.sleep(1.5)  # well past stale_after: only the heartbeat keeps the mtime fresh
        with pytest.raises(LockTimeout):
            Locker(str(lockroot), mode="soft", stale_after=0.6).acquire(
                name, shared=False, timeout=0.5
            )
    finally:
        stop(child)


def test_exclusive_lock_survives_unlink_of_its_file(lockroot):
    """A waiter on a lock file that a prune unlinks must not end up alone on a dead inode."""
    name = key_of("unlinked")
    locker = Locker(str(lockroot), mode="flock")
    first = locker.acquire(name, shared=False, timeout=1)
    waiter = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(lockroot), name, "flock", "0", "30"],
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        time.sleep(0.5)  # the waiter has opened the old lock file and is polling it
        first.release(remove=True)
        assert waiter.stdout.readline().strip() == "HELD"
        with pytest.raises(LockTimeout):
            locker.acquire(name, shared=False, timeout=0.3)
    finally:
        stop(waiter)


def test_probe_picks_flock_on_a_local_filesystem(lockroot):
    assert Locker(str(lockroot)).mode == "flock"


def test_lock_directory_not_usable(lockroot):
    (lockroot / ".locks").write_text("a file where the lock directory should be")
    with pytest.raises(LockUnavailable, match="lock directory"):
        Locker(str(lockroot), mode="flock").acquire(key_of("x"), shared=False, timeout=0.1)


def test_cache_works_without_usable_locks(lockroot, caplog_warnings):
    (lockroot / ".locks").write_text("not a directory")
    cache = kernelcache.Cache(lockroot, readonly_roots=())
    key = key_of("no-locks")
    art = cache.get_or_create(key, "bin", lambda: (b"built", {}))
    assert art.data == b"built" and art.source == "local"
    assert cache.get(key, "bin").data == b"built"
    messages = [r.getMessage() for r in caplog_warnings.records]
    assert sum("without locks" in m or "without a lock" in m for m in messages) >= 1
    assert len(messages) == len(set(messages))  # each kind of failure warned once


@pytest.mark.parametrize("mode", ["flock", "soft"])
def test_builder_holding_lock_too_long_means_private_build(lockroot, mode, caplog_warnings):
    key = key_of("slow-builder", mode)
    child = hold_in_child(lockroot, key + ".build", mode)
    try:
        cache = kernelcache.Cache(lockroot, readonly_roots=(), lock_timeout=0.3, lock_mode=mode)
        started = time.monotonic()
        art = cache.get_or_create(key, "bin", lambda: (b"private", {}))
        assert time.monotonic() - started < 3
        assert art.data == b"private"
        art2 = cache.get_or_create(key, "bin", lambda: (b"second", {}))
        assert art2.data == b"private"  # the private build was still stored for later
        assert kernelcache.process_stats()["lock_timeouts"] >= 1
        assert sum("building privately" in r.getMessage() for r in caplog_warnings.records) == 1
    finally:
        stop(child)


@pytest.mark.parametrize("mode, fresh", [("flock", False), ("soft", False), ("auto", True)])
def test_single_flight_waiters_read_the_builders_result(lockroot, mode, fresh):
    """Processes started while a build runs wait for it and read its result, building nothing."""
    code = textwrap.dedent(
        """
        import sys, time, kernelcache
        root, key, mode, log = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
        def build():
            with open(log, "a") as f:
                f.write("build\\n")
            time.sleep(1.0)
            return b"result", {}
        c = kernelcache.Cache(root, readonly_roots=(), lock_mode=mode)
        art = c.get_or_create(key, "bin", build)
        assert art.data == b"result", art
        print(kernelcache.process_stats()["builds"])
        """
    )
    key = key_of("single-flight", mode)
    log = lockroot.parent / "builds.log"
    if fresh:  # nobody has created the root yet: the first lock creates it
        lockroot = lockroot.parent / "fresh-root"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(lockroot), key, mode, str(log)],
            env=child_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(6)
    ]
    outs = [p.communicate(timeout=60) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1] for o in outs]
    assert not any("without" in err for _, err in outs), [o[1] for o in outs]
    assert log.read_text().count("build") == 1
    assert sorted(int(o[0]) for o in outs) == [0, 0, 0, 0, 0, 1]


READER = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDONLY)
fcntl.flock(fd, fcntl.LOCK_SH)  # what Store.read holds while it reads an artifact
print("READING", flush=True)
time.sleep(float(sys.argv[2]))
"""


def test_entry_is_never_deleted_under_a_reader(tmp_path):
    cache = kernelcache.Cache(tmp_path / "root", readonly_roots=())
    key = key_of("reader")
    art = cache.put(key, "bin", b"being read", {})
    reader = subprocess.Popen(
        [sys.executable, "-c", READER, art.path, "30"],
        env=child_env(),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert reader.stdout.readline().strip() == "READING"
        assert cache.store.delete(key, wait=0.2) is None  # in use: nothing deleted
        assert cache.get(key, "bin").data == b"being read"
        assert repair(cache.store, key, "bin").data == b"being read"
    finally:
        reader.kill()
        reader.wait(timeout=10)
        reader.stdout.close()
    assert cache.store.delete(key, wait=1) is True
    assert cache.get(key, "bin") is None
    assert not (tmp_path / "root" / f"{key}.bin").exists()


def test_republished_entry_is_read_fresh(tmp_path):
    """A reader that remembered an entry's metadata sees a new entry published under its key."""
    root = tmp_path / "root"
    reader = kernelcache.Cache(root, readonly_roots=())
    corrupt_before = kernelcache.process_stats()["corrupt"]
    key = key_of("republish")
    reader.put(key, "bin", b"first version", {"v": 1})
    assert reader.get(key, "bin").meta["v"] == 1
    other = kernelcache.Store(root)  # another process would have its own memory
    assert other.delete(key) is True
    other.put(key, "bin", b"second", {"v": 2})
    art = reader.get(key, "bin")
    assert art.data == b"second" and art.meta["v"] == 2
    assert kernelcache.process_stats()["corrupt"] == corrupt_before


def test_a_fifo_with_a_writer_planted_as_a_soft_lock_is_broken_once_stale(lockroot):
    """Reading its record neither blocks nor raises; it has no holder record, so it is stale
    after UNWRITTEN_STALE and replaced by a real lock."""
    from kernelcache.store.locks import UNWRITTEN_STALE

    name = key_of("fifo-soft")
    (lockroot / ".locks").mkdir(exist_ok=True)
    path = lockroot / ".locks" / f"{name}.softlock"
    os.mkfifo(path)
    reader = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    writer = os.open(path, os.O_WRONLY | os.O_NONBLOCK)  # a live writer: reads would block
    try:
        old = time.time() - UNWRITTEN_STALE - 10
        os.utime(path, (old, old))
        held = Locker(str(lockroot), mode="soft", stale_after=60).acquire(
            name, shared=False, timeout=2
        )
        assert path.is_file() and json.loads(path.read_text())["token"] == held.token
        held.release()
    finally:
        os.close(writer)
        os.close(reader)


@pytest.mark.parametrize("pid", [10**20, -1, 0, 2**63], ids=["huge", "negative", "zero", "2**63"])
def test_a_soft_lock_record_with_an_impossible_pid_of_this_host_is_broken(lockroot, pid):
    """The record is untrusted: a pid no process can have means its holder is gone (and must
    never raise out of a lock attempt, which would fail the job)."""
    from kernelcache.process import HOST

    name = key_of(f"pid-{pid}")
    _plant_soft_lock(lockroot, name, HOST, pid, age=1)
    held = Locker(str(lockroot), mode="soft", stale_after=60).acquire(name, shared=False, timeout=2)
    held.release()


# Takes a soft lock while stalling (longer than UNWRITTEN_STALE) just before it writes the
# holder record, as a process paused by the scheduler or swapped out may; holds it 1 s.
STALLED_TAKER = """
import os, sys, time
from kernelcache.store.locks import UNWRITTEN_STALE, Locker
real_write = os.write
def stalled(fd, data):
    if b'"token"' in bytes(data):
        time.sleep(UNWRITTEN_STALE + 1.5)
    return real_write(fd, data)
os.write = stalled
print("TAKING", flush=True)
held = Locker(sys.argv[1], mode="soft", stale_after=60).acquire(sys.argv[2], shared=False, timeout=30)
taken = time.time()
time.sleep(1)
held.release()
print(taken, time.time(), flush=True)
"""


def test_a_soft_lock_taker_that_stalls_is_never_overlapped(lockroot):
    """The lock file appears with its holder record in it, so no one can find it without one
    and break it as a dead taker's while the taker goes on to hold it."""
    name = key_of("stalled")
    proc = subprocess.Popen(
        [sys.executable, "-c", STALLED_TAKER, str(lockroot), name],
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout.readline().strip() == "TAKING", proc.stderr.read()
    time.sleep(0.2)
    held = Locker(str(lockroot), mode="soft", stale_after=60).acquire(
        name, shared=False, timeout=30
    )
    mine = time.time()
    time.sleep(3)
    held.release()
    released = time.time()
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    taken, let_go = map(float, out.split())
    assert released <= taken or let_go <= mine, (mine, released, taken, let_go)
    assert sorted(os.listdir(lockroot / ".locks")) == []


def test_a_broken_soft_lock_s_holder_never_refreshes_the_next_holder_s_lock(lockroot):
    """A holder refreshes its own lock file, not whatever takes the name after its lock was
    broken: a dead next holder's lock still goes stale."""
    name = key_of("refresh")
    held = Locker(str(lockroot), mode="soft", stale_after=0.2).acquire(
        name, shared=False, timeout=2
    )
    path = lockroot / ".locks" / f"{name}.softlock"
    os.rename(path, path.with_name(path.name + ".broken-0"))  # broken by someone
    _plant_soft_lock(lockroot, name, "elsewhere", 1, age=100)  # and taken by another host
    planted = path.stat().st_mtime
    time.sleep(0.5)  # ten refresh intervals of the first holder
    assert path.stat().st_mtime == planted
    held.release()
    assert path.exists()  # the next holder's lock is not the first holder's to remove
