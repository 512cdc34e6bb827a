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
from remote_job import companion_of, job_processes, run_job
from remote_job import finish as finish_job
from remote_workers import finish, key_of, start_workers

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


def test_a_killed_primary_fails_over_and_its_keys_are_served_again_within_two_seconds(tmp_path):
    """A cluster with a replica of each primary: a primary killed (kill -9) is replaced by its
    replica after the node timeout (2 s) and an election; the tier reads the slot map again
    while the shard is down, so every key is served again soon after, none lost, and no
    lookup waits longer than the tier's timeout meanwhile."""
    with RedisClusterServers(tmp_path / "cluster", replicas=1) as servers:
        tier = open_remote(servers.url + "?timeout=0.5")
        keys = [hashlib.sha256(f"kernel {i}".encode()).hexdigest() for i in range(30)]
        for key in keys:
            assert tier.put(key, "bin", key.encode(), META)
        client = servers.client()
        homes = {k: tier.name(k) for k in keys}  # (while its shard is down: a fallback)
        victim = servers.primary_of(client, homes[keys[0]])
        lost = [k for k in keys if servers.primary_of(client, homes[k]) is victim]
        time.sleep(1.0)  # the replicas have every write
        victim.kill()
        killed = time.monotonic()
        pending, longest, promoted, served = set(keys), 0.0, None, None
        # (until both are seen: the tier may find the new primary before the node asked here)
        while (pending or promoted is None) and time.monotonic() - killed < 30:
            for key in sorted(pending):
                start = time.monotonic()
                found = tier.get(key, "bin")
                longest = max(longest, time.monotonic() - start)
                if found is not None:
                    assert found[0] == key.encode()
                    pending.discard(key)
            if not pending and served is None:
                served = time.monotonic() - killed
            if promoted is None and all(
                servers.primary_of(client, homes[k]) is not victim for k in lost
            ):
                promoted = time.monotonic() - killed
            time.sleep(0.02)
    assert not pending, f"{len(pending)} keys never came back"
    assert lost and longest < 1.0, longest
    assert promoted is not None, "no node said the replica took the shard over"
    assert served is not None and served < promoted + 2.0, (promoted, served)


def test_a_request_that_finds_its_shard_down_goes_to_the_fallback_at_once(tmp_path):
    """The first lock, put or get of a key after its primary died (this process has not seen
    it fail yet) is not lost: the failure opens the shard's breaker and the same call is
    made where the group moved, so no node builds a key without the job-wide lock for it."""
    with RedisClusterServers(tmp_path / "cluster") as servers:
        url = servers.url + "?timeout=0.5&breaker=60"
        client = servers.client()
        keys = [hashlib.sha256(f"moving kernel {i}".encode()).hexdigest() for i in range(30)]
        locker, writer, reader = open_remote(url), open_remote(url), open_remote(url)
        homes = {k: locker.name(k) for k in keys}
        victim = servers.primary_of(client, homes[keys[0]])
        stranded = [k for k in keys if servers.primary_of(client, homes[k]) is victim]
        assert locker.get(key_of(14_000), "bin") is None  # each has read the slot map
        assert (
            writer.get(key_of(14_001), "bin") is None and reader.get(key_of(14_002), "bin") is None
        )
        victim.kill()
        release = locker.acquire(stranded[0], 1.0)
        assert release is not None, "the lock is taken at the fallback in the same call"
        assert writer.put(stranded[1], "bin", b"first put", META)
        found = reader.get(stranded[1], "bin")
        assert found is not None and found[0] == b"first put"
        assert open_remote(url).acquire(stranded[0], 0.0) is None, "one holder, job-wide"
        release()


def test_what_was_published_while_a_primary_was_down_is_found_after_its_failover(tmp_path):
    """Keys whose home shard is down are published in their group's fallback; once a replica
    has taken the shard's slots over, a fresh process finds them there (home misses: one more
    lookup) and copies each home, so the next job builds none of them again."""
    with RedisClusterServers(tmp_path / "cluster", replicas=1) as servers:
        url = servers.url + "?timeout=0.5"
        writer = open_remote(url)
        client = servers.client()
        keys = [hashlib.sha256(f"outage kernel {i}".encode()).hexdigest() for i in range(30)]
        homes = {k: writer.name(k) for k in keys}
        victim = servers.primary_of(client, homes[keys[0]])
        stranded = [k for k in keys if servers.primary_of(client, homes[k]) is victim]
        victim.kill()
        for key in stranded:  # the first lookup finds the shard down; the rest skip it
            assert writer.get(key, "bin") is None
            assert writer.put(key, "bin", key.encode(), META)
        assert all(writer.name(k) != homes[k] for k in stranded), "published in a fallback"
        deadline = time.monotonic() + 30
        # every node knows the new primary (a fresh process may read its slot map from any)
        while len(said := servers.primaries_of(client, homes[keys[0]])) != 1 or victim in said:
            assert time.monotonic() < deadline, "no failover"
            time.sleep(0.05)
        reader = open_remote(url)
        for key in stranded:
            found = reader.get(key, "bin")
            assert found is not None and found[0] == key.encode(), key
        assert reader.counters["fallback_hits"] == len(stranded)
        again = open_remote(url)
        assert all(again.get(k, "bin") is not None for k in stranded)
        assert again.counters.get("fallback_hits", 0) == 0, "copied home by the first reader"
        missing = open_remote(url)
        assert missing.get(key_of(13_000), "bin") is None
        assert missing.counters.get("errors", 0) == 0


def test_a_job_whose_primary_is_killed_midway_fails_over_with_few_extra_builds(tmp_path):
    """2 nodes x 2 processes build 24 keys on a cluster with replicas; once 6 are published,
    the primary of the most keys still to build is killed. The job completes, every key
    built, with at most 1.5x the ideal builds (a build cut off by the failover may be made
    again once), and every process's result served."""
    with RedisClusterServers(tmp_path / "cluster", replicas=1) as servers:
        url = servers.url + "?timeout=0.5"
        keys = [hashlib.sha256(f"job kernel {i}".encode()).hexdigest() for i in range(24)]
        tier = open_remote(url)
        client = servers.client()
        procs, logs = job_processes(url, tmp_path, keys, nodes=2, per_node=2, build_s=0.3)
        deadline = time.monotonic() + 120
        while sum(len(f.read_text().splitlines()) for f in logs.glob("*.log")) < 6:
            assert time.monotonic() < deadline and all(p.poll() is None for p in procs)
            time.sleep(0.02)
        built = {line.split()[0] for f in logs.glob("*.log") for line in f.read_text().splitlines()}
        owners = Counter(servers.primary_of(client, tier.name(k)) for k in keys if k not in built)
        victim = owners.most_common(1)[0][0]
        victim.kill()
        job = finish_job(procs, logs)
    assert set(job.builds) == set(keys)
    assert sum(job.builds.values()) <= 1.5 * len(keys), job.builds
    assert len(job.results) == 4


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
    # one failure; the other lost keys are looked for in their groups' fallback slots
    assert reader.counters["breaker_trips"] == 1 and reader.counters["errors"] == 1


def test_a_job_with_a_killed_primary_builds_the_other_shards_keys_once(tmp_path):
    """2 nodes x 2 processes, one of 3 primaries killed (kill -9) before the job: every key is
    built once for the job, the dead shard's through their groups' fallback slots on the
    live ones; each process warns once, naming the dead shard."""
    with RedisClusterServers(tmp_path / "cluster") as servers:
        url = servers.url + "?timeout=0.5"
        by_shard = keys_by_shard(servers, url, 2, 14_000)
        dead = f"127.0.0.1:{servers.nodes[1].port}"
        servers.nodes[1].kill()
        keys = [key for keys in by_shard.values() for key in keys]
        job = run_job(url, tmp_path, keys, nodes=2, per_node=2, build_s=0.2)
    for shard_keys in by_shard.values():  # the dead shard's too: through fallback slots
        assert {k: job.builds[k] for k in shard_keys} == dict.fromkeys(shard_keys, 1)
    warned = job.warnings("unavailable")
    assert warned and all(f"shard {dead}" in w for w in warned), warned
    assert all(len([w for w in r["warnings"] if "unavailable" in w]) <= 1 for r in job.results)
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
        # the stopped shard's keys: built once for the job, through their fallback slots
        built = dict.fromkeys(shard_keys, 1 if shard == stopped else 0)
        assert {k: job.builds[k] for k in shard_keys} == built, shard
        sources = {r["sources"][k] for r in job.results for k in shard_keys}
        assert sources == ({"local", "remote"} if shard == stopped else {"remote"}), shard
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
