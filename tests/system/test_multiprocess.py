"""Many real processes on one root: no exception, no corrupt read, exactly one build per key."""

from __future__ import annotations

import collections
import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from support import child_env, metadata_keys

import kernelcache
from kernelcache.keys import split_entry_name
from kernelcache.store import Problem, Store

HAMMER = textwrap.dedent(
    """
    import hashlib, json, os, random, sys, kernelcache
    root, log, worker, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    rng = random.Random(worker)

    def key(i):
        return hashlib.sha256(b"key-%d" % i).hexdigest()

    def payload(i):
        # deterministic per key, sizes from a few bytes to ~200 KiB
        return hashlib.sha256(b"data-%d" % i).digest() * (1 + (i * 977) % 6000)

    def build(i):
        def run():
            with open(log, "a") as f:
                f.write(f"{i} {os.getpid()}\\n")
            return payload(i), {"name": f"k{i}", "worker": worker}
        return run

    cache = kernelcache.Cache(root, readonly_roots=(), lock_timeout=60)
    seen = 0
    for _ in range(rounds):
        i = rng.randrange(24)
        op = rng.random()
        if op < 0.5:
            art = cache.get_or_create(key(i), "bin", build(i))
        elif op < 0.8:
            art = cache.get(key(i), "bin")
        else:
            try:
                art = cache.put(key(i), "bin", payload(i), {"name": f"k{i}", "worker": worker})
            except kernelcache.CacheError as e:
                raise SystemExit(f"put failed: {e}")
        if art is not None:
            assert art.data == payload(i), f"wrong bytes for key {i}"
            with open(art.path, "rb") as f:
                assert f.read() == payload(i)
            seen += 1
    print(json.dumps({"seen": seen, "stats": kernelcache.process_stats()}))
    """
)


def test_hammer_overlapping_keys(tmp_path):
    root = tmp_path / "root"
    log = tmp_path / "builds.log"
    log.touch()
    workers = 10
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", HAMMER, str(root), str(log), str(w), "150"],
            env=child_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for w in range(workers)
    ]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        results.append(json.loads(out))
    assert sum(r["stats"]["corrupt"] for r in results) == 0
    assert sum(r["stats"]["errors"] for r in results) == 0
    # only get_or_create builds; puts of a present key keep the first entry
    builds = collections.Counter(line.split()[0] for line in log.read_text().splitlines())
    assert builds and max(builds.values()) == 1, builds
    store = Store(root)
    keys = set(metadata_keys(root))
    assert len(keys) == 24
    for k in keys:
        assert not isinstance(store.read(k, "bin"), Problem)
    assert os.listdir(root / ".tmp") == []


CRASHER = textwrap.dedent(
    """
    import hashlib, os, sys, kernelcache
    root, start = sys.argv[1], int(sys.argv[2])
    cache = kernelcache.Cache(root, readonly_roots=())
    i = start
    print("READY", flush=True)
    while True:
        j = i % 40
        k = hashlib.sha256(b"crash-%d" % j).hexdigest()
        data = hashlib.sha256(b"payload-%d" % j).digest() * (2000 + 3000 * (j % 7))
        cache.get_or_create(k, "bin", lambda: (data, {"i": j}))
        cache.store.delete(k, wait=0.0)  # keep writing: delete what was just published
        i += 1
    """
)


def _expected(i: int) -> bytes:
    import hashlib

    return hashlib.sha256(b"payload-%d" % i).digest() * (2000 + 3000 * (i % 7))


def test_kill_9_writers_never_leaves_a_servable_torn_entry(tmp_path):
    root = tmp_path / "root"
    rng = random.Random(1234)
    kills = 0
    for round_ in range(25):
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", CRASHER, str(root), str(rng.randrange(1000))],
                env=child_env(),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
            for _ in range(2)
        ]
        for p in procs:
            assert p.stdout.readline().strip() == b"READY"
        time.sleep(rng.uniform(0.01, 0.25))
        for p in procs:
            p.send_signal(signal.SIGKILL)
            p.wait(timeout=10)
            p.stdout.close()
            err = p.stderr.read()
            p.stderr.close()
            assert p.returncode == -signal.SIGKILL, err
            kills += 1
        # after every round: whatever get serves is exactly right
        cache = kernelcache.Cache(root, readonly_roots=())
        import hashlib

        for i in range(40):
            k = hashlib.sha256(b"crash-%d" % i).hexdigest()
            art = cache.get(k, "bin")
            assert art is None or art.data == _expected(i), (round_, i)
    assert kills == 50
    # every metadata file left behind describes a valid entry or is quarantined on read
    store = Store(root)
    served = 0
    for k in metadata_keys(root):
        result = store.get(k, "bin")
        if result is not None and not isinstance(result, Problem):
            served += 1
            assert result.data == _expected(result.meta["i"])
    # temp files of killed writers may remain in .tmp/ (swept by `kernelcache prune`), never in the root
    strays = [
        p.name for p in Path(root).iterdir() if p.is_file() and split_entry_name(p.name) is None
    ]
    assert strays == []
