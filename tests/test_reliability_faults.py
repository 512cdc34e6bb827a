"""Faults in the environment: locks left by killed processes, permissions that really stop
the process (another user via setpriv, or a private mount namespace: tests run as root in CI,
where permission bits alone stop nothing), full disks, clock skew.

The job never fails and gets the right kernel; nothing partial or corrupt is left or served.
"""

from __future__ import annotations

import json
import os
import time

import pytest
from conftest import key_of
from test_reliability_support import run_cli

from kernelcache.locks import Locker
from kernelcache.store import Store


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
