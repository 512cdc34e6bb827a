"""What a job asks of its tier grows with its nodes, not with its processes: of the processes
sharing a cache root (a node), one asks the tier for a key, under the key's build lock in the
root, and the others wait for the root; and a node waiting for another's build reads the
entry with its last try at the key's lock. Counted where the requests arrive: the server's
own MONITOR stream (redis-cli, a real process) of real worker processes' requests to a real
redis-server."""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from redis_server import REDIS_SERVER, SKIP_REASON, RedisServer
from remote_workers import WORKER, key_of
from support import child_env

import kernelcache
from kernelcache.remote.redis.scripts import SHAS

pytestmark = pytest.mark.skipif(
    REDIS_SERVER is None or shutil.which("redis-cli") is None, reason=SKIP_REASON
)


@contextlib.contextmanager
def monitored(server: RedisServer, into: Path) -> Iterator[list[str]]:
    """The commands ``server`` runs while the block runs, as its MONITOR stream shows them
    (filled in when the block ends)."""
    seen: list[str] = []
    with into.open("w") as out:
        watcher = subprocess.Popen(
            ["redis-cli", "-p", str(server.port), "monitor"], stdout=out, text=True
        )
        time.sleep(0.3)  # (MONITOR is on before the first request)
        try:
            yield seen
        finally:
            time.sleep(0.3)
            watcher.terminate()
            watcher.wait(timeout=10)
    seen += into.read_text().splitlines()


def reads(lines: list[str]) -> int:
    """The tier's reads among ``lines`` (its read script, which :func:`loaded` loaded)."""
    return sum(f'"EVALSHA" "{SHAS["get"]}"' in line for line in lines)


def loaded(server: RedisServer, tmp_path: Path) -> kernelcache.Cache:
    """A cache on ``server`` whose read has loaded the tier's read script there (a first read
    is otherwise two requests: EVALSHA, refused, then EVAL)."""
    cache = kernelcache.Cache(tmp_path / "filler", (), server.url)
    assert cache.get(key_of(-1), "bin") is None
    return cache


def run(url: str, roots: list[Path], keys: list[str], builds: Path, build_s: float) -> list:
    """Worker processes (one per entry of ``roots``, several may share one) that
    get_or_create ``keys`` together; what each reported."""
    tail = [str(build_s), str(time.time() + 1.0), json.dumps(keys)]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, url, str(root), str(builds), *tail],
            env=child_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for root in roots
    ]
    done = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        done.append(json.loads(out.strip().splitlines()[-1]))
    return done


def test_the_processes_of_a_node_ask_the_tier_once_for_a_key(tmp_path):
    """Three processes on one root, every key in the tier: each key read once (before, each
    process that looked a key up before another had published it read it too: 7 reads
    here)."""
    keys = [key_of(900 + i) for i in range(6)]
    with RedisServer(tmp_path / "redis") as server:
        filler = loaded(server, tmp_path)
        for key in keys:
            filler.put(key, "bin", key.encode() * 2048, {"name": "k"})
        with monitored(server, tmp_path / "monitor.txt") as seen:
            done = run(server.url, [tmp_path / "node"] * 3, keys, tmp_path / "builds", 0.1)
    assert not (tmp_path / "builds").exists()  # nothing built
    assert all(set(d["sources"].values()) <= {"remote", "local"} for d in done)
    assert reads(seen) == len(keys), [line for line in seen if "EVAL" in line]


def test_a_node_waiting_for_another_reads_the_entry_with_its_last_try_at_the_lock(tmp_path):
    """Two nodes, three keys missing: each key is built once, and read at most three times in
    all (the builder's first read and its read under the lock; the waiter's first read): the
    waiter's last try at the lock brings the entry (it read it once more before: 4 a key)."""
    keys = [key_of(950 + i) for i in range(3)]
    builds = tmp_path / "builds"
    with RedisServer(tmp_path / "redis") as server:
        loaded(server, tmp_path)
        with monitored(server, tmp_path / "monitor.txt") as seen:
            run(server.url, [tmp_path / "a", tmp_path / "b"], keys, builds, 0.5)
    built = builds.read_text().split()[::2]
    assert sorted(built) == sorted(keys), built  # once each
    assert reads(seen) <= 3 * len(keys), [line for line in seen if "EVAL" in line]
