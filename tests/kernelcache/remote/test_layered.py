"""Tiers in layers (a Redis server or cluster, then a bucket): read-through, backfill upward,
read-only tiers, one warning per broken tier, a cluster's failed primary covered by the bucket
(its keys' locks and entries), per-tier counters in `kernelcache stats`, and bundles to and
from a bucket (`export --to`, `import --from`)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from object_store import S3_ENV, moto_available, s3_env
from redis_server import (
    REDIS_SERVER,
    SKIP_REASON,
    RedisClusterServers,
    blackhole,
    free_port,
)
from remote_job import run_job
from remote_workers import key_of
from support import REPO

import kernelcache
from kernelcache import stats
from kernelcache.remote import LayeredTier, ObjectStoreTier, RedisTier, open_remote
from kernelcache.remote.codec import decode_value, make_value

pytestmark = [
    pytest.mark.skipif(REDIS_SERVER is None, reason=SKIP_REASON),
    pytest.mark.skipif(not moto_available(), reason="needs moto and obstore (test extra)"),
]

META = {"name": "kernel", "target": "cuda:90"}


@pytest.fixture
def layers(s3, server, request):
    bucket = s3.bucket("kc-" + request.node.name.lower().replace("_", "-")[:40].strip("-"))
    return f"{server.url} {bucket}"


def test_a_hit_below_is_copied_up_and_the_next_node_reads_the_top(layers, server, tmp_path):
    key = key_of(1)
    writer = kernelcache.Cache(tmp_path / "a", (), layers)
    assert isinstance(writer.remote, LayeredTier)
    redis_tier, bucket_tier = writer.remote.tiers
    assert isinstance(redis_tier, RedisTier) and isinstance(bucket_tier, ObjectStoreTier)
    writer.put(key, "bin", b"layered" * 100, META)
    assert writer.remote.flush(10)  # the put below the first tier is made in the background
    assert server.client().exists(redis_tier.name(key)) == 1  # puts reach every tier
    server.client().flushall()  # Redis restarted or evicted: the bucket still has it

    reader = kernelcache.Cache(tmp_path / "b", (), layers)
    art = reader.get(key, "bin")
    assert art.source == "remote" and art.data == b"layered" * 100
    assert reader.remote.flush(10)  # the copy up is made in the background
    assert server.client().exists(redis_tier.name(key)) == 1
    third = open_remote(layers)
    assert third.tiers[0].get(key, "bin")[0] == b"layered" * 100  # now a Redis hit
    counts = stats.tier_stats()
    assert counts[redis_tier.label]["backfills"] >= 1
    assert counts[bucket_tier.label]["hits"] >= 1


def test_a_read_only_tier_is_read_and_never_written(s3, server, tmp_path):
    bucket = s3.bucket("kc-read-only-layer") + "&read_only=1"
    seeded = ObjectStoreTier(bucket.replace("&read_only=1", ""))
    key = key_of(2)
    assert seeded.put(key, "bin", b"seed", META)
    cache = kernelcache.Cache(tmp_path, (), f"{server.url} {bucket}")
    assert cache.get(key, "bin").data == b"seed"  # read through the read-only tier
    assert cache.remote.flush(10)
    assert cache.remote.tiers[0].get(key, "bin")[0] == b"seed"  # backfilled into Redis
    other = key_of(3)
    cache.put(other, "bin", b"new", META)
    assert seeded.get(other, "bin") is None  # never written
    assert cache.remote.tiers[1].counters.get("puts", 0) == 0


def test_a_broken_tier_in_front_warns_once_and_the_next_one_serves(s3, tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="kernelcache.remote")
    bucket = s3.bucket("kc-behind-a-broken-tier")
    key = key_of(4)
    ObjectStoreTier(bucket).put(key, "bin", b"behind", META)
    down = f"redis://127.0.0.1:{free_port()}/0?timeout=0.3"
    cache = kernelcache.Cache(tmp_path, (), f"{down}\n{bucket}")  # any whitespace separates
    started = time.monotonic()
    assert cache.get(key, "bin").data == b"behind"
    for i in range(5):
        k = key_of(10 + i)
        assert cache.get_or_create(k, "bin", lambda k=k: (k.encode(), META)).key == k
    assert time.monotonic() - started < 3.0
    warned = [r.getMessage() for r in caplog.records if "unavailable" in r.getMessage()]
    assert [m for m in warned if down in m] == [warned[0]], warned  # one, and the first
    assert ObjectStoreTier(bucket).get(key_of(10), "bin") is not None  # the bucket got puts


def test_a_killed_primary_in_front_of_a_bucket_costs_no_extra_builds(s3, tmp_path):
    """2 nodes x 2 processes on a Redis Cluster (one of 3 primaries killed) in front of a
    bucket: the dead shard's keys take their build locks in the bucket, so every key is built
    once; the next job, on fresh roots, reads them all (the dead shard's from the bucket)."""
    bucket = s3.bucket("kc-killed-primary") + "&timeout=1s"
    with RedisClusterServers(tmp_path / "cluster") as servers:
        layers = f"{servers.url}?timeout=0.5 {bucket}"
        servers.nodes[1].kill()
        keys = [key_of(40 + i) for i in range(9)]
        first = run_job(layers, tmp_path / "first", keys, build_s=0.3, env=S3_ENV)
        second = run_job(layers, tmp_path / "second", keys, build_s=0.3, env=S3_ENV)
    assert first.builds == dict.fromkeys(keys, 1), first.builds
    assert second.builds == {}, second.builds
    assert {s for r in second.results for s in r["sources"].values()} <= {"remote", "local"}
    assert first.seconds < 9 * 0.3 + 4.0 and second.seconds < 4.0


def _run_cli(*args: str, root: Path, extra: dict[str, str] | None = None):
    env = {k: v for k, v in os.environ.items() if not k.startswith("KERNELCACHE_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.update(extra or {})
    return subprocess.run(
        [sys.executable, "-m", "kernelcache.cli", "--root", str(root), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def test_stats_shows_counters_per_tier_and_asks_each_tier(layers, tmp_path):
    root = tmp_path / "root"
    cache = kernelcache.Cache(root, (), layers)
    for i in range(3):
        cache.put(key_of(20 + i), "bin", os.urandom(1000), META)  # (no compression)
    other = kernelcache.Cache(tmp_path / "other", (), layers)
    stats.enable_log(str(other.root))
    for i in range(4):
        other.get(key_of(20 + i), "bin")  # 3 hits and 1 miss in Redis, 1 miss in the bucket
    stats.flush()
    redis_label, bucket_label = (t.label for t in other.remote.tiers)

    doc = json.loads(_run_cli("stats", "--json", root=other.root).stdout)
    tiers = doc["remote_tiers"]
    assert tiers[redis_label]["hits"] == 3 and tiers[redis_label]["misses"] == 1
    assert tiers[bucket_label]["misses"] == 1 and tiers[redis_label]["bytes_read"] > 3000

    text = _run_cli("stats", "--format", "prometheus", root=other.root).stdout
    assert (
        f'kernelcache_remote_tier_hits_total{{root="{other.root}",tier="{redis_label}"}} 3' in text
    )

    env = {"KERNELCACHE_REMOTE": f"{layers} redis://127.0.0.1:{free_port()}/0", **_s3_env()}
    proc = _run_cli("stats", "--remote", "--json", root=other.root, extra=env)
    probes = json.loads(proc.stdout)["remote"]
    assert [p["up"] for p in probes] == [True, True, False], probes
    assert proc.returncode == 1, "a tier that does not answer is a problem found"
    assert "Connection" in probes[2]["error"]
    human = _run_cli("stats", "--remote", root=other.root, extra=env).stdout
    assert f"Remote {redis_label}: answers" in human and "does not answer" in human


def _s3_env() -> dict[str, str]:
    from object_store import S3_ENV

    return dict(S3_ENV)


def test_bundles_go_to_and_come_from_a_bucket(s3, tmp_path):
    bucket = s3.bucket("kc-bundles")
    base, query = "s3://kc-bundles", bucket.split("?", 1)[1]
    url = f"{base}/releases/kernels.tar?{query}"
    source = kernelcache.Cache(tmp_path / "src", (), "")
    for i in range(5):
        source.put(key_of(30 + i), "bin", bytes([i]) * 2000, META)
    proc = _run_cli("export", "--to", url, "--json", root=source.root, extra=_s3_env())
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["entries"] == 5 and doc["file"].startswith(f"{base}/releases/kernels.tar")

    again = _run_cli("export", "--to", url, root=source.root, extra=_s3_env())
    assert again.returncode == 2 and "exists" in again.stderr  # first writer wins: nothing done

    dest = tmp_path / "dest"
    proc = _run_cli("import", "--from", url, "--json", root=dest, extra=_s3_env())
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["imported"] == 5
    assert kernelcache.Cache(dest, (), "").get(key_of(32), "bin").data == bytes([2]) * 2000

    missing = _run_cli(
        "import", "--from", url.replace("kernels", "nope"), root=dest, extra=_s3_env()
    )
    assert missing.returncode == 2 and "no object" in missing.stderr  # as a missing file
    both = _run_cli("import", "x.tar", "--from", url, root=dest, extra=_s3_env())
    assert both.returncode == 2 and "either FILE or --from" in both.stderr


def test_a_hung_bucket_below_a_healthy_redis_costs_sparse_lookups_a_quarter_second(
    server, tmp_path
):
    """Decisions, remembered failures and memos are usually absent: a miss of one in Redis
    does not wait for a bucket that stopped answering (timeout 3 s): 0.25 s at most, and
    none at all once the bucket's breaker opened; a kernel lookup still waits for the bucket,
    for the answer of the first request to it (a sparse lookup's, still in flight) at most
    FIRST_ANSWER_WAIT, not for a timeout of its own."""
    from bridge.entries.kinds import declared_kinds
    from kernelcache.remote.contact import FIRST_ANSWER_WAIT
    from kernelcache.remote.layered import SPARSE_WAIT

    declared_kinds()  # declares the bridge's usually absent kinds

    with s3_env(), blackhole() as port:
        bucket = f"s3://hung/kc?endpoint=http://127.0.0.1:{port}&region=us-east-1&timeout=3s"
        cache = kernelcache.Cache(tmp_path / "root", (), f"{server.url} {bucket}")
        took = []
        began = time.monotonic()
        for i, ext in enumerate(("decision", "failure", "ident", "sample")):
            start = time.monotonic()
            assert cache.get(key_of(600 + i), ext, counted=False) is None
            took.append(time.monotonic() - start)
        assert all(t < SPARSE_WAIT + 0.2 for t in took), took
        start = time.monotonic()
        assert cache.get(key_of(610), "bin") is None  # a kernel: waits for the bucket's answer
        assert FIRST_ANSWER_WAIT - 0.1 < time.monotonic() - start < 2.5
        time.sleep(max(0.0, began + 3.5 - time.monotonic()))  # the first request timed out
        for key, ext in ((key_of(611), "decision"), (key_of(612), "bin")):
            start = time.monotonic()
            assert cache.get(key, ext, counted=False) is None
            assert time.monotonic() - start < 0.1, "the bucket's breaker is open: not asked"
        assert cache.remote.counters[cache.remote.tiers[1].label]["breaker_trips"] == 1


def test_a_late_answer_of_a_sparse_lookup_is_copied_up(server, tmp_path):
    """A bucket slower than the wait still answers: the entry it had is copied to Redis, so
    the next lookup finds it there."""

    class Slow:
        read_only = True

        def __init__(self, found):
            self.found = found

        def get(self, key, ext):
            time.sleep(0.6)
            return self.found

        def put(self, key, ext, data, meta):
            return False

        def acquire(self, key, timeout):
            return None

    from bridge.entries.kinds import declared_kinds

    declared_kinds()  # declares the bridge's usually absent kinds

    key = key_of(620)
    value = make_value(key, "decision", b'{"x": 1}', {"kind": "decision"}, None)
    entry = decode_value(value, key)
    assert isinstance(entry, tuple)
    redis_tier = open_remote(server.url)
    layered = LayeredTier([redis_tier, Slow(entry)])

    assert layered.get(key, "decision") is None  # not waited for
    deadline = time.monotonic() + 5
    while redis_tier.get(key, "decision") is None:
        assert time.monotonic() < deadline, "the late answer was not copied up"
        time.sleep(0.05)
    assert layered.get(key, "decision")[0] == b'{"x": 1}'
