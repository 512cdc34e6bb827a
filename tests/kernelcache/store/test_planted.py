"""What anyone who writes a shared root may plant under the names of its state (the breakers,
the statistics logs, the lock files, the check records, the scan index, JAX's cache): a FIFO
never blocks a process, a hard link never has it change a file elsewhere, a directory never
fails it, and a file of many tiny JSON values never takes many times its size in memory; a
file another process replaces as it is opened is no planted link, and is opened again."""

from __future__ import annotations

import json
import os
import stat
import threading

from support import key_of, run_py

import kernelcache
from bridge.jax_cache.directory import plan_jax_prune, prune_jax_cache, scan_jax_cache
from kernelcache import fsio, stats
from kernelcache.remote.breakers import BREAKER_DIR, SharedBreakers
from kernelcache.stats.summary import fold_logs
from kernelcache.store import Store
from kernelcache.store.layout import CHECKED_DIR, LOCK_DIR, STATS_DIR, check_recorded, record_check


def _ends(work, seconds: float = 10.0) -> list:
    """``[work()]`` if it returns within ``seconds``, else [] (left blocked in its thread)."""
    done: list = []
    thread = threading.Thread(target=lambda: done.append(work()), daemon=True)
    thread.start()
    thread.join(seconds)
    return done


def _release(fifo: str) -> None:
    """Let a writer blocked opening ``fifo`` go (a reader opens it)."""
    os.close(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK))


def test_a_fifo_planted_as_a_breaker_file_blocks_no_trip(tmp_path):
    """trip() opened the breaker's file for writing, blocking: every job whose tier failed
    hung there, even with a tier that worked (its .alive file)."""
    breakers = SharedBreakers(str(tmp_path), "redis://x")
    (tmp_path / BREAKER_DIR).mkdir()
    fifo = str(tmp_path / BREAKER_DIR / breakers._name(""))
    os.mkfifo(fifo)
    os.mkfifo(fifo + ".alive")
    try:
        assert _ends(lambda: breakers.trip("", 5.0)) == [False]  # not shared: not a file
        assert _ends(lambda: breakers.end_probe("", answered=True)) == [None]
    finally:
        _release(fifo)
        _release(fifo + ".alive")
    assert breakers.until("", 60.0) == 0.0


def test_a_hard_link_planted_as_a_breaker_file_changes_no_file_elsewhere(tmp_path):
    breakers = SharedBreakers(str(tmp_path / "root"), "redis://x")
    (tmp_path / "root" / BREAKER_DIR).mkdir(parents=True)
    elsewhere = tmp_path / "notes.txt"
    elsewhere.write_text("mine")
    os.utime(elsewhere, (1000, 1000))
    os.link(elsewhere, tmp_path / "root" / BREAKER_DIR / breakers._name(""))
    assert breakers.trip("", 5.0) is False
    assert elsewhere.stat().st_mtime == 1000


def test_a_fifo_swapped_for_a_processs_log_blocks_no_flush(tmp_path):
    """A process's log, swapped for a FIFO after its first flush, blocked the next flush (at
    exit, after a build) for ever."""
    root = str(tmp_path)
    stats.enable_log(root)
    stats.count(root, hits=1)
    stats.flush()
    log = tmp_path / STATS_DIR / stats.log_name()
    assert log.is_file()
    log.unlink()
    os.mkfifo(log)
    stats.count(root, hits=1)
    try:
        assert _ends(stats.flush) == [None]
    finally:
        _release(str(log))


def test_a_hard_link_planted_as_a_lock_file_keeps_its_mode(tmp_path):
    """The lock's trust policy set the mode of a file outside the root (0666 -> 0660)."""
    root = tmp_path / "root"
    (root / LOCK_DIR).mkdir(parents=True)
    elsewhere = tmp_path / "notes.txt"
    elsewhere.write_text("mine")
    elsewhere.chmod(0o666)
    key = key_of(1)
    os.link(elsewhere, root / LOCK_DIR / f"{key}.lock")
    kernelcache.Cache(str(root), (), None).put(key, "bin", b"data", {"name": "k"})
    assert stat.S_IMODE(elsewhere.stat().st_mode) == 0o666


def test_a_check_record_planted_as_a_hard_link_vouches_for_nothing(tmp_path):
    """A file of this user that another may write, linked under a record's name, read as this
    user's record of a check it never made."""
    key, digest = key_of(2), "xxh3_128:" + "0" * 32
    record_check(str(tmp_path), "inflate", key, digest)
    assert check_recorded(str(tmp_path), "inflate", key, digest)
    (record,) = (tmp_path / CHECKED_DIR).iterdir()
    record.unlink()
    elsewhere = tmp_path / "group-writable.txt"
    elsewhere.write_text("")
    os.link(elsewhere, record)
    assert not check_recorded(str(tmp_path), "inflate", key, digest)


def test_a_directory_planted_as_a_stale_soft_lock_is_moved_aside(tmp_path, monkeypatch):
    """Breaking it raised IsADirectoryError into get_or_create."""
    monkeypatch.setenv("KERNELCACHE_LOCK_MODE", "soft")
    key = key_of(3)
    planted = tmp_path / LOCK_DIR / f"{key}.softlock"
    planted.mkdir(parents=True)
    os.utime(planted, (1, 1))
    cache = kernelcache.Cache(str(tmp_path), (), None)
    art = cache.get_or_create(key, "bin", lambda: (b"built", {"name": "k"}))
    assert art.data == b"built" and not planted.exists()


def test_a_directory_planted_as_a_folded_log_fails_no_fold(tmp_path):
    """Every fold (each prune's) failed with "Is a directory", and no log was folded again."""
    (tmp_path / STATS_DIR).mkdir()
    (tmp_path / STATS_DIR / "otherhost-1-abcdef01.jsonl.folding").mkdir()
    log = tmp_path / STATS_DIR / "otherhost-2-abcdef02.jsonl"
    log.write_text(json.dumps({"v": 1, "delta": {"hits": 3}}) + "\n")
    folded, error = fold_logs(Store(str(tmp_path)).locker, [log.name])
    assert (folded, error) == (1, None)
    assert stats.read_logs(str(tmp_path))[0]["hits"] == 3


def test_a_directory_planted_as_a_jax_atime_file_is_left_alone(tmp_path):
    """A prune removed the entry, then said "nothing was removed: Is a directory"."""
    (tmp_path / "a-cache").write_bytes(b"x" * 1000)
    (tmp_path / "a-atime").mkdir()
    (tmp_path / "b-atime").mkdir()  # not a stray -atime file either
    entries, stray = scan_jax_cache(tmp_path)
    assert [e.key for e in entries] == ["a"] and stray == []
    doomed = plan_jax_prune(entries, max_size=None, max_age=0.0, now=entries[0].last_used + 1)
    assert prune_jax_cache(tmp_path, doomed, stray) == (1, 1000)


_PEAK = """
import sys, kernelcache.cli
kernelcache.cli.main(["--root", sys.argv[1], "stats"])
status = open("/proc/self/status").read()
print(int(status.split("VmHWM:")[1].split()[0]) >> 10)
"""


def test_an_index_or_a_log_of_tiny_json_values_is_not_parsed_whole(tmp_path):
    """A 24 MiB index or log line of ``[{},{},...]`` took `stats` to 728 MiB (30 times it)."""
    tiny = b"[" + b"{}," * (8 << 20) + b"{}]\n"
    (tmp_path / STATS_DIR).mkdir()
    (tmp_path / STATS_DIR / "index.json").write_bytes(tiny + b"{}\n")
    (tmp_path / STATS_DIR / "otherhost-1-abcdef01.jsonl").write_bytes(tiny)
    peak = int(run_py(_PEAK, str(tmp_path)).stdout.split()[-1])
    assert peak < 256, f"{peak} MiB"


def test_a_file_replaced_between_the_open_and_the_check_is_opened_again(tmp_path, monkeypatch):
    """Its old inode has no link left, which was refused as "a hard link": a writer under a
    size cap stopped keeping its root under it for good, as four writers replaced the usage
    file (test_capacity's burst, under load)."""
    (tmp_path / "usage").write_bytes(b"old")
    real_open, opened = os.open, []

    def open_then_replaced(name, flags, mode=0o777, *, dir_fd=None):
        fd = real_open(name, flags, mode, dir_fd=dir_fd)
        opened.append(fd)
        if len(opened) == 1:  # another process replaces the file (os.replace) right after
            (tmp_path / "new").write_bytes(b"new")
            os.replace(tmp_path / "new", tmp_path / "usage")
        return fd

    monkeypatch.setattr(fsio.os, "open", open_then_replaced)
    fd = fsio.open_planted(str(tmp_path / "usage"), os.O_RDONLY)
    try:
        assert len(opened) == 2 and os.read(fd, 10) == b"new"
    finally:
        os.close(fd)
