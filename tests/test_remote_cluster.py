"""The Redis tier on a real Redis Cluster (3 local primaries): entries and locks across shards,
a job of many processes sharing it, and a shard going away."""

from __future__ import annotations

import time
from collections import Counter

import pytest
from redis_server import REDIS_SERVER, SKIP_REASON, RedisClusterServers
from test_remote import finish, key_of, start_workers

import kernelcache
from kernelcache.errors import ConfigError
from kernelcache.remote import RedisTier, open_remote, parse_url

pytestmark = pytest.mark.skipif(REDIS_SERVER is None, reason=SKIP_REASON)

META = {"name": "kernel", "target": "cuda:90"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with RedisClusterServers(tmp_path_factory.mktemp("cluster")) as servers:
        yield servers


def test_entries_spread_over_the_shards_and_each_lock_shares_its_entry_slot(cluster):
    tier = open_remote(cluster.url)
    assert isinstance(tier, RedisTier) and tier.cluster
    keys = [key_of(10_000 + i) for i in range(30)]
    for key in keys:
        assert tier.put(key, "cubin", key.encode() * 10, META)
    for key in keys:
        found = tier.get(key, "cubin")
        assert found is not None and found[0] == key.encode() * 10
    client = cluster.client()
    per_node = [n.redis_connection.dbsize() for n in client.get_primaries()]
    assert len(per_node) == 3 and all(n > 0 for n in per_node), per_node
    for key in keys:
        assert client.keyslot(tier.name(key)) == client.keyslot(tier.name(key) + ":lock")
    release = tier.acquire(key_of(10_100), 1.0)
    assert release is not None and client.exists(tier.name(key_of(10_100)) + ":lock") == 1
    release()
    assert client.exists(tier.name(key_of(10_100)) + ":lock") == 0
    assert tier.counters.get("errors", 0) == 0


def test_eight_processes_on_their_own_roots_build_each_key_once(cluster, tmp_path):
    keys = [key_of(11_000 + i) for i in range(6)]
    orders = [keys[i % 6 :] + keys[: i % 6] for i in range(8)]
    # 8 processes start at once on a small machine: a timeout that allows for it
    procs, builds = start_workers(cluster.url + "?timeout=2", tmp_path, orders, build_s=0.15)
    results = finish(procs)
    built = Counter(line.split()[0] for line in builds.read_text().splitlines())
    assert built == dict.fromkeys(keys, 1), built
    sources = Counter(s for r, _ in results for s in r["sources"].values())
    assert sources["remote"] == 8 * 6 - len(keys)
    assert all(r["stats"]["remote_errors"] == 0 for r, _ in results)


def test_a_value_larger_than_max_size_is_not_read_from_a_shard(cluster):
    tier = open_remote(cluster.url + "?max_size=4K")
    key = key_of(12_000)
    cluster.client().set(tier.name(key), b"\0" * 100_000)
    assert tier.get(key, "cubin") is None
    assert tier.counters["oversize"] == 1 and tier.counters.get("errors", 0) == 0


def test_a_cluster_url_is_checked():
    address, options = parse_url("redis+cluster://:pw@10.0.0.1:7000,10.0.0.2:7001?timeout=1")
    assert address == "redis+cluster://:pw@10.0.0.1:7000,10.0.0.2:7001" and options.timeout == 1
    with pytest.raises(ConfigError, match="not a node"):
        parse_url("redis+cluster://10.0.0.1:7000,10.0.0.2:nope")
    with pytest.raises(ConfigError, match="only database 0"):
        parse_url("redis+cluster://10.0.0.1:7000/3")


def test_a_shard_going_away_costs_one_timeout_and_the_job_goes_on(tmp_path):
    """A shard that fails opens the breaker of the whole tier: one failure per period."""
    with RedisClusterServers(tmp_path / "cluster") as servers:
        url = servers.url + "?timeout=0.5&breaker=30"
        writer = kernelcache.Cache(tmp_path / "a", (), url)
        keys = [key_of(13_000 + i) for i in range(12)]
        for key in keys:
            writer.put(key, "cubin", key.encode(), META)
        servers.nodes[1].kill()
        reader = kernelcache.Cache(tmp_path / "b", (), url)
        started = time.monotonic()
        for key in keys:
            art = reader.get_or_create(key, "cubin", lambda key=key: (key.encode(), META))
            assert art.data == key.encode()
        elapsed = time.monotonic() - started
    assert reader.remote.counters["breaker_trips"] == 1
    assert elapsed < 3.0, elapsed
