"""Job-wide build locks in the remote tiers (a Redis server, and a bucket on moto's S3 server),
held by real processes: a lock is a lease its holder renews, so a holder that stops (SIGSTOP)
or dies (kill -9) loses it within the lease while one that builds longer keeps it; a wait that
reaches the lock timeout is said (the lock, its holder, the tier); a process builds the other
keys while another machine holds one (work stealing across machines); a bucket alone builds
each key once for a job, and a bucket that stops answering ends the waits for its locks."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path

import pytest
from object_store import S3_ENV, MotoS3, moto_available, s3_env
from redis_server import REDIS_SERVER, SKIP_REASON, RedisServer
from remote_job import run_job
from remote_workers import key_of
from support import child_env

import kernelcache

META = {"name": "kernel", "target": "cuda:90"}
NO_MOTO = "needs moto and obstore (test extra)"
TIERS = [
    pytest.param("redis", marks=pytest.mark.skipif(REDIS_SERVER is None, reason=SKIP_REASON)),
    pytest.param("s3", marks=pytest.mark.skipif(not moto_available(), reason=NO_MOTO)),
]

# Takes the build lock of a key through the tier, says so, holds it (renewed) for a while,
# then stores the entry (if given) and releases it.
HOLDER = textwrap.dedent(
    """
    import sys, time
    from kernelcache.remote import open_remote
    url, key, hold, data = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
    tier = open_remote(url)
    release = tier.acquire(key, 5)
    assert release is not None and release.__name__ != "no_release", release
    print("held", flush=True)
    time.sleep(hold)
    if data:
        assert tier.put(key, "bin", data.encode(), {"name": "kernel", "target": "cuda:90"})
    release()
    """
)


@pytest.fixture(params=TIERS)
def url(request, tmp_path):
    """A tier with a short lease: a Redis server of its own (1 s), or a bucket of its own (2 s:
    moto's server answers a request in over half a second on a loaded machine, and a lease must
    be longer than a request's timeout)."""
    if request.param == "redis":
        with RedisServer(tmp_path / "redis") as server:
            yield server.url + "?timeout=0.3&lease=1s"
        return
    name = f"kc-locks-{uuid.uuid4().hex[:12]}"
    yield request.getfixturevalue("s3").bucket(name) + "&timeout=1.5s&lease=2s"


def start_holder(url: str, key: str, hold: float, data: str = "") -> subprocess.Popen[str]:
    """A process holding the build lock of ``key`` (once it said so)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, url, key, str(hold), data],
        env=child_env(**S3_ENV),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    line = proc.stdout.readline()
    assert line.strip() == "held", proc.communicate()[1]
    return proc


def end(proc: subprocess.Popen[str]) -> None:
    proc.kill()  # (a stopped process too)
    proc.wait(timeout=10)


def lease_of(url: str) -> float:
    """The lease (seconds) the tier ``url`` names."""
    return float(url.rpartition("lease=")[2].partition("&")[0].rstrip("s"))


def build_while_held(url: str, root: Path, key: str, lock_timeout: float, sig: int | None = None):
    """``get_or_create`` of ``key`` (built as ``b"built here"``) while another process holds
    its lock (sent ``sig`` first, if given): the artifact, the seconds it took, the holder's
    pid and the cache."""
    holder = start_holder(url, key, hold=60)
    try:
        if sig is not None:
            os.kill(holder.pid, sig)
        cache = kernelcache.Cache(root, (), url, lock_timeout=lock_timeout)
        started = time.monotonic()
        art = cache.get_or_create(key, "bin", lambda: (b"built here", META))
        return art, time.monotonic() - started, holder.pid, cache
    finally:
        end(holder)


@pytest.mark.parametrize("sig", [signal.SIGSTOP, signal.SIGKILL], ids=["stopped", "killed"])
def test_a_holder_that_stops_renewing_loses_its_lock_within_the_lease(url, tmp_path, sig):
    """A lock outlived its holder by lock_ttl (120 s), and a bucket had no locks at all."""
    art, elapsed, _, cache = build_while_held(url, tmp_path / "root", key_of(100), 20, sig)
    assert art.data == b"built here" and art.source == "local"
    lease = lease_of(url)
    assert elapsed < lease + 2.0, elapsed  # the lease, a poll, and room for a loaded machine
    if url.startswith("s3"):  # a bucket's lock is judged stale after a lease of watching it
        assert elapsed >= lease, elapsed
        assert cache.remote.counters["locks_broken"] == 1


def test_a_holder_building_longer_than_its_lease_keeps_its_lock(url, tmp_path):
    key = key_of(200)
    job = run_job(
        url, tmp_path, [key], nodes=2, per_node=1, build_s=lease_of(url) + 1.5, env=S3_ENV
    )
    assert job.builds == {key: 1}
    assert sorted(r["sources"][key] for r in job.results) == ["local", "remote"]


def test_a_wait_that_reaches_the_lock_timeout_is_said(url, tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="kernelcache")
    key = key_of(300)
    art, elapsed, pid, _ = build_while_held(url, tmp_path / "root", key, 1.0)
    assert art.data == b"built here"
    assert 1.0 <= elapsed < 3.0, elapsed
    said = [r.getMessage() for r in caplog.records if "still held by" in r.getMessage()]
    assert len(said) == 1, said
    tier = url.split("?", 1)[0]
    assert key in said[0] and f"pid {pid}" in said[0] and tier in said[0], said


def test_a_process_builds_other_keys_while_another_machine_holds_one(url, tmp_path):
    """A process waited for a key another machine was building before it built the keys
    nobody had claimed."""
    held, free = key_of(400), [key_of(401), key_of(402)]
    holder = start_holder(url, held, hold=2.0, data="built by the holder")
    try:
        cache = kernelcache.Cache(tmp_path / "root", (), url, lock_timeout=20)
        items = [
            kernelcache.BuildItem(k, "bin", lambda k=k: (time.sleep(0.2) or k.encode(), META))
            for k in (held, *free)
        ]
        started = time.monotonic()
        order, seen = [], {}
        for index, art in cache.get_or_create_each(items):
            order.append(items[index].key)
            seen[items[index].key] = (art.source, art.data, time.monotonic() - started)
        holder.wait(timeout=10)
    finally:
        end(holder)
    assert order == [*free, held], order
    assert seen[held][:2] == ("remote", b"built by the holder")
    assert all(seen[k][0] == "local" and seen[k][2] < 1.5 for k in free), seen
    assert seen[held][2] < 2.0 + 1.5, seen


@pytest.mark.skipif(not moto_available(), reason=NO_MOTO)
def test_a_job_on_a_bucket_alone_builds_each_key_once(s3, tmp_path):
    """A bucket had no build locks: each node built every key it missed."""
    url = s3.bucket("kc-a-job-on-a-bucket-alone") + "&timeout=1s"
    keys = [key_of(500 + i) for i in range(6)]
    job = run_job(url, tmp_path, keys, nodes=2, per_node=2, build_s=0.3, env=S3_ENV)
    assert job.builds == dict.fromkeys(keys, 1), job.builds
    assert all(r["stats"]["remote_errors"] == 0 for r in job.results)


@pytest.mark.skipif(not moto_available(), reason=NO_MOTO)
def test_a_bucket_that_stops_answering_ends_the_waits_for_its_locks(tmp_path, caplog):
    """While the bucket answers, a waiter waits for the holder of a key's lock; once it stops,
    the waiter's next try fails (one failure, one warning) and it builds at once."""
    caplog.set_level(logging.WARNING, logger="kernelcache")
    key = key_of(600)
    with s3_env():
        server = MotoS3().start()
        url = server.bucket("kc-stopped") + "&timeout=0.5s&lease=2s&breaker=30"
        holder = start_holder(url, key, hold=60)
        stopper = threading.Timer(1.0, server.stop)
        try:
            cache = kernelcache.Cache(tmp_path / "root", (), url, lock_timeout=30)
            started = time.monotonic()
            stopper.start()
            art = cache.get_or_create(key, "bin", lambda: (b"built after the stop", META))
            elapsed = time.monotonic() - started
        finally:
            stopper.join()
            end(holder)
    assert art.data == b"built after the stop"
    assert 1.0 <= elapsed < 1.0 + 0.5 + 1.5, elapsed  # waited, then a timeout at most
    assert len([r for r in caplog.records if "unavailable" in r.getMessage()]) == 1
