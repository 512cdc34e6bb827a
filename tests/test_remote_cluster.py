"""The Redis tier on a real Redis Cluster (3 local primaries): entries and locks across shards,
a job of many processes sharing it, and faults of one primary (killed, stopped): each costs the
keys of its own shard only (one failure and one warning per process, naming it), the other
shards keep single flight and sharing, and a builder whose companion entry lives on the failed
shard still publishes its entry and releases its lock."""

from __future__ import annotations

import hashlib
import time
from collections import Counter

import pytest
from redis_server import REDIS_SERVER, SKIP_REASON, RedisClusterServers
from remote_job import companion_of, run_job
from test_remote import finish, key_of, start_workers

import kernelcache
from kernelcache.errors import ConfigError
from kernelcache.keys import group_of
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
        assert tier.put(key, "bin", key.encode() * 10, META)
    for key in keys:
        found = tier.get(key, "bin")
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


def test_a_key_and_the_companions_derived_from_it_share_one_slot(cluster):
    """The bridge derives a kernel's companions (its PTX, a failure, a decision's samples)
    from its key: they keep its group, so one shard holds a kernel and all of its companions."""
    from bridge.entries.kinds import derived_key

    tier = open_remote(cluster.url)
    client = cluster.client()
    slots = set()
    for i in range(100):
        key = hashlib.sha256(f"kernel {i}".encode()).hexdigest()
        slot = client.keyslot(tier.name(key))
        slots.add(slot)
        for role in ("ptx", "failure", "variants", "sample:3"):
            companion = derived_key(key, role)
            assert companion != key and group_of(companion) == group_of(key)
            assert client.keyslot(tier.name(companion)) == slot
            assert client.keyslot(tier.name(companion) + ":lock") == slot
    assert len(slots) > 90, "groups spread over the slots as keys do"


def test_a_killed_primary_takes_kernels_with_their_companions_or_neither(tmp_path):
    from bridge.entries.kinds import derived_key

    with RedisClusterServers(tmp_path / "cluster") as servers:
        tier = open_remote(servers.url + "?timeout=0.5&breaker=60")
        keys = [hashlib.sha256(f"kernel {i}".encode()).hexdigest() for i in range(30)]
        for key in keys:
            assert tier.put(key, "bin", b"k" * 64, META)
            assert tier.put(derived_key(key, "ptx"), "bin", b"p" * 64, META)
        servers.nodes[0].kill()
        reader = open_remote(servers.url + "?timeout=0.5&breaker=60")
        found = {key: reader.get(key, "bin") is not None for key in keys}
        assert 0 < sum(found.values()) < len(keys), found  # one shard of three is gone
        for key in keys:
            assert (reader.get(derived_key(key, "ptx"), "bin") is not None) == found[key]


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
    assert tier.get(key, "bin") is None
    assert tier.counters["oversize"] == 1 and tier.counters.get("errors", 0) == 0


def test_a_cluster_url_is_checked():
    address, options = parse_url("redis+cluster://:pw@10.0.0.1:7000,10.0.0.2:7001?timeout=1")
    assert address == "redis+cluster://:pw@10.0.0.1:7000,10.0.0.2:7001" and options.timeout == 1
    with pytest.raises(ConfigError, match="not a node"):
        parse_url("redis+cluster://10.0.0.1:7000,10.0.0.2:nope")
    with pytest.raises(ConfigError, match="only database 0"):
        parse_url("redis+cluster://10.0.0.1:7000/3")


def shard_of(servers: RedisClusterServers, tier: RedisTier, key: str) -> str:
    """The primary ("host:port") whose slots hold ``key``'s entry."""
    return servers.client().get_node_from_key(tier.name(key)).name


def keys_by_shard(servers: RedisClusterServers, url: str, per_shard: int, first: int):
    """``per_shard`` keys for each primary, by its "host:port"."""
    tier = RedisTier(url)
    found: dict[str, list[str]] = {f"127.0.0.1:{node.port}": [] for node in servers.nodes}
    i = first
    while any(len(keys) < per_shard for keys in found.values()):
        key, i = key_of(i), i + 1
        keys = found[shard_of(servers, tier, key)]
        if len(keys) < per_shard:
            keys.append(key)
    return found


def test_a_killed_primary_costs_one_failure_and_the_other_shards_serve(tmp_path):
    """A shard that failed opened the breaker of the whole tier: every key was rebuilt."""
    with RedisClusterServers(tmp_path / "cluster") as servers:
        url = servers.url + "?timeout=0.5&breaker=30"
        by_shard = keys_by_shard(servers, url, 4, 13_000)
        writer = kernelcache.Cache(tmp_path / "a", (), url)
        for keys in by_shard.values():
            for key in keys:
                writer.put(key, "bin", key.encode(), META)
        dead = f"127.0.0.1:{servers.nodes[1].port}"
        servers.nodes[1].kill()
        reader = kernelcache.Cache(tmp_path / "b", (), url)
        started = time.monotonic()
        sources = {}
        for keys in by_shard.values():
            for key in keys:
                art = reader.get_or_create(key, "bin", lambda key=key: (key.encode(), META))
                assert art.data == key.encode()
                sources[key] = art.source
        elapsed = time.monotonic() - started
    assert reader.remote.counters["breaker_trips"] == 1
    for shard, keys in by_shard.items():
        assert {sources[k] for k in keys} == {"local" if shard == dead else "remote"}, shard
    assert elapsed < 3.0, elapsed


def test_slots_without_a_primary_cost_their_own_keys_only(tmp_path):
    """The slot map may give some slots no primary (Redis leaves out a failed one at times):
    a read of such a key was a failure of the whole tier."""
    with RedisClusterServers(tmp_path / "cluster") as servers:
        url = servers.url + "?timeout=0.5"
        by_shard = keys_by_shard(servers, url, 3, 17_000)
        writer = RedisTier(url)
        for keys in by_shard.values():
            for key in keys:
                assert writer.put(key, "bin", key.encode(), META)
        owner = servers.nodes[2]
        first, last = 2 * 16384 // 3, 16383  # its slots (RedisClusterServers.start)
        for node in servers.nodes:  # unassigned in every node's view
            node.client().execute_command("CLUSTER DELSLOTSRANGE", first, last)
        lost = by_shard[f"127.0.0.1:{owner.port}"]
        reader = RedisTier(url)
        keys = lost + [k for ks in by_shard.values() for k in ks if k not in lost]
        found = {key: reader.get(key, "bin") is not None for key in keys}  # lost ones first
    assert found == {key: key not in lost for key in keys}
    assert reader.counters["breaker_trips"] == 1 and reader.counters["skipped"] == len(lost) - 1


def test_a_job_with_a_killed_primary_builds_the_other_shards_keys_once(tmp_path):
    """2 nodes x 2 processes, one of 3 primaries killed (kill -9) before the job: the keys of
    the live shards are built once for the job, those of the dead shard once per node; each
    process warns once, naming the dead shard."""
    with RedisClusterServers(tmp_path / "cluster") as servers:
        url = servers.url + "?timeout=0.5"
        by_shard = keys_by_shard(servers, url, 2, 14_000)
        dead = f"127.0.0.1:{servers.nodes[1].port}"
        servers.nodes[1].kill()
        keys = [key for keys in by_shard.values() for key in keys]
        job = run_job(url, tmp_path, keys, nodes=2, per_node=2, build_s=0.2)
    for shard, shard_keys in by_shard.items():
        expected = 2 if shard == dead else 1
        assert {k: job.builds[k] for k in shard_keys} == dict.fromkeys(shard_keys, expected)
    warned = job.warnings("unavailable")
    assert warned and all(f"shard {dead}" in w for w in warned), warned
    assert all(len([w for w in r["warnings"] if "unavailable" in w]) <= 1 for r in job.results)
    # the processes of a node share the breaker: at most one per node found the shard down
    assert sum(r["tier"].get("breaker_trips", 0) for r in job.results) <= 2
    assert all(r["tier"].get("breaker_trips", 0) <= 1 for r in job.results)
    assert job.seconds < 5.0, job.seconds


def test_a_stopped_primary_costs_one_timeout_and_new_clients_read_the_other_shards(tmp_path):
    """A primary stopped (SIGSTOP: it accepts connections and never answers). Loading the
    tier's scripts touched every primary: a new client's read of a key on a live primary
    timed out and opened the breaker of the whole tier."""
    with RedisClusterServers(tmp_path / "cluster") as servers:
        url = servers.url + "?timeout=0.5"
        by_shard = keys_by_shard(servers, url, 2, 15_000)
        writer = kernelcache.Cache(tmp_path / "writer", (), url)
        keys = [key for keys in by_shard.values() for key in keys]
        for key in keys:
            writer.put(key, "bin", key.encode() * 64, META)
        stopped = f"127.0.0.1:{servers.nodes[2].port}"
        servers.nodes[2].pause()
        job = run_job(url, tmp_path, keys, nodes=2, per_node=1, build_s=0.1)
    for shard, shard_keys in by_shard.items():
        built = dict.fromkeys(shard_keys, 2 if shard == stopped else 0)
        assert {k: job.builds[k] for k in shard_keys} == built, shard
        sources = {r["sources"][k] for r in job.results for k in shard_keys}
        assert sources == {"local" if shard == stopped else "remote"}, shard
    assert all(r["tier"]["timeouts"] == 1 for r in job.results), job.results
    # a timeout for the stopped shard, and maybe one to read the slot map (a random node)
    assert job.seconds < 3.0, job.seconds


def test_a_builder_whose_companion_is_on_a_dead_primary_publishes_and_releases(tmp_path):
    """A build stores a companion entry (as the bridge stores a kernel's PTX) whose key is on a
    dead primary, before its own entry, which is on a live one. The failed companion put
    opened the breaker of the whole tier: the entry was not published and its lock not
    released, so the other node waited for the lock until it expired."""
    with RedisClusterServers(tmp_path / "cluster") as servers:
        url = servers.url + "?timeout=0.5"
        tier = RedisTier(url)
        dead = f"127.0.0.1:{servers.nodes[0].port}"
        keys: list[str] = []
        i = 16_000
        while len(keys) < 3:
            key, i = key_of(i), i + 1
            if shard_of(servers, tier, key) != dead == shard_of(servers, tier, companion_of(key)):
                keys.append(key)
        servers.nodes[0].kill()
        job = run_job(
            url, tmp_path, keys, nodes=2, per_node=1, build_s=1.0, companion=True, lock_timeout=60
        )
    assert job.builds == dict.fromkeys(keys, 1), job.builds
    assert {s for r in job.results for s in r["sources"].values()} == {"local", "remote"}
    assert job.seconds < 3 * 1.0 + 2.0, job.seconds  # the builds and a little: no lock wait
