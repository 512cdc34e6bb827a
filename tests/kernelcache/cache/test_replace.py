"""Replacing an entry: ``Cache.replace`` puts an entry in place of the writable root's, atomically
for readers in other processes; ``Cache.rebuild`` does it once across processes for an entry its
callers refuse; the remote tier keeps its value, and says so."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from redis_server import REDIS_SERVER, SKIP_REASON, RedisServer
from support import child_env, key_of

import kernelcache

KEY = key_of("replaced")
OLD, NEW = b"old" * 1000, b"new" * 3000  # of other sizes: a torn read would show


def test_replace_puts_an_entry_in_place_of_the_first_writers(tmp_path):
    cache = kernelcache.Cache(tmp_path / "root", readonly_roots=(), remote="")
    cache.put(KEY, "bin", OLD, {"name": "k"})
    assert cache.put(KEY, "bin", NEW, {"name": "k"}).data == OLD  # the first writer wins
    assert cache.replace(KEY, "bin", NEW, {"name": "k"}).data == NEW
    assert cache.get(KEY, "bin").data == NEW
    fresh = kernelcache.Cache(tmp_path / "root", readonly_roots=(), remote="")
    assert fresh.get(KEY, "bin").data == NEW
    assert not (tmp_path / "root" / ".quarantine").exists()
    with pytest.raises(ValueError, match=r"holds a \.bin"):
        cache.replace(KEY, "other", NEW, {"name": "k"})  # another kind of entry stays


def test_replace_in_front_of_a_read_only_layer(tmp_path):
    image = kernelcache.Cache(tmp_path / "image", readonly_roots=(), remote="")
    image.put(KEY, "bin", OLD, {"name": "k"})
    layered = kernelcache.Cache(tmp_path / "root", readonly_roots=(image.root,), remote="")
    assert layered.get(KEY, "bin").data == OLD
    layered.replace(KEY, "bin", NEW, {"name": "k"})
    assert layered.get(KEY, "bin").data == NEW
    assert image.get(KEY, "bin").data == OLD  # never written


READER = """
import json, sys, kernelcache
root, key, old, new, rounds = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
cache = kernelcache.Cache(root, readonly_roots=(), remote="")
seen = {"old": 0, "new": 0}
for _ in range(rounds):
    art = cache.get(key, "bin")
    assert art is not None, "a read found no entry"
    if art.data == bytes.fromhex(old):
        seen["old"] += 1
    else:
        assert art.data == bytes.fromhex(new), "a read returned other bytes"
        seen["new"] += 1
print(json.dumps({**seen, "corrupt": kernelcache.process_stats()["corrupt"]}))
"""

WRITER = """
import sys, kernelcache
root, key, old, new, rounds = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
cache = kernelcache.Cache(root, readonly_roots=(), remote="")
for i in range(rounds):
    cache.replace(key, "bin", bytes.fromhex(new if i % 2 == 0 else old), {"name": "k"})
"""


def _start(code: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_readers_get_one_whole_entry_or_the_other_while_it_is_replaced(tmp_path):
    root = tmp_path / "root"
    kernelcache.Cache(root, readonly_roots=(), remote="").put(KEY, "bin", OLD, {"name": "k"})
    args = (str(root), KEY, OLD.hex(), NEW.hex())
    readers = [_start(READER, *args, "3000") for _ in range(2)]
    writer = _start(WRITER, *args, "400")
    out, err = writer.communicate(timeout=240)
    assert writer.returncode == 0, err[-3000:]
    for reader in readers:
        out, err = reader.communicate(timeout=240)
        assert reader.returncode == 0, err[-3000:]
        seen = json.loads(out)
        assert seen["corrupt"] == 0 and seen["old"] + seen["new"] == 3000
    assert not (root / ".quarantine").exists()  # nothing was taken for corrupt


def test_rebuild_returns_what_another_process_put_in_place_of_the_stale_entry(tmp_path):
    cache = kernelcache.Cache(tmp_path / "root", readonly_roots=(), remote="")
    stale = cache.put(KEY, "bin", OLD, {"name": "k"})
    builds: list[int] = []

    def build() -> tuple[bytes, dict[str, str]]:
        builds.append(1)
        return NEW, {"name": "k"}

    assert cache.rebuild(KEY, "bin", build, stale=stale).data == NEW
    assert builds == [1] and cache.get(KEY, "bin").data == NEW
    # a caller that read the stale entry before it was rebuilt gets the new one, unbuilt
    assert cache.rebuild(KEY, "bin", build, stale=stale).data == NEW
    assert builds == [1]


REBUILDER = """
import json, os, sys, time, kernelcache
root, key, log = sys.argv[1], sys.argv[2], sys.argv[3]
cache = kernelcache.Cache(root, readonly_roots=(), remote="")
stale = cache.get(key, "bin")
assert stale is not None and stale.data == b"old"
while not os.path.exists(log + ".go"):
    time.sleep(0.01)

def build():
    with open(log, "a") as f:
        f.write(f"{os.getpid()}\\n")
    time.sleep(1.0)
    return b"new", {"name": "k"}

print(json.dumps(cache.rebuild(key, "bin", build, stale=stale).data.decode()))
"""


def test_rebuild_builds_once_across_processes(tmp_path):
    root, log = tmp_path / "root", tmp_path / "builds"
    kernelcache.Cache(root, readonly_roots=(), remote="").put(KEY, "bin", b"old", {"name": "k"})
    procs = [_start(REBUILDER, str(root), KEY, str(log)) for _ in range(4)]
    Path(str(log) + ".go").touch()
    for proc in procs:
        out, err = proc.communicate(timeout=240)
        assert proc.returncode == 0, err[-3000:]
        assert json.loads(out) == "new"
    assert len(log.read_text().split()) == 1, "one process built"


@pytest.mark.skipif(REDIS_SERVER is None, reason=SKIP_REASON)
def test_the_remote_tier_keeps_its_value_and_a_replace_says_so(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="kernelcache")
    with RedisServer(tmp_path / "redis") as server:
        first = kernelcache.Cache(tmp_path / "one", readonly_roots=(), remote=server.url)
        first.put(KEY, "bin", OLD, {"name": "k"})
        first.replace(KEY, "bin", NEW, {"name": "k"})
        (said,) = [r.getMessage() for r in caplog.records if "remote tier" in r.getMessage()]
        assert KEY in said and "keeps its earlier value" in said
        assert first.get(KEY, "bin").data == NEW  # the writable root is read first
        other = kernelcache.Cache(tmp_path / "two", readonly_roots=(), remote=server.url)
        assert other.get(KEY, "bin").data == OLD  # as the warning said
        caplog.clear()
        other.replace(KEY, "bin", OLD, {"name": "k"})  # the tier's value: nothing to say
        assert not [r for r in caplog.records if "remote tier" in r.getMessage()]
