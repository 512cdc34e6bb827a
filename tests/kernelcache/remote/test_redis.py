"""The Redis tier against a real redis-server: sharing, single flight, failures, limits, auth."""

from __future__ import annotations

import hashlib
import json
import logging
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path

import pytest
from redis_server import (
    REDIS_SERVER,
    SKIP_REASON,
    RedisServer,
    blackhole,
    free_port,
    make_tls_files,
)
from remote_workers import finish, key_of, start_workers
from support import child_env

import kernelcache
from kernelcache import stats
from kernelcache.problem import Problem
from kernelcache.remote import MAGIC, RedisTier, decode_value, encode_value, open_remote
from kernelcache.store import make_metadata

pytestmark = pytest.mark.skipif(REDIS_SERVER is None, reason=SKIP_REASON)

SECRET = "pa55-W0rd-never-logged"


def payload(key: str, size: int = 4096) -> bytes:
    """``size`` bytes of ``key``'s, which do not compress (sizes on the server stay theirs)."""
    return hashlib.shake_256(key.encode()).digest(size)


def builder(key: str, calls: list[str], size: int = 4096):
    def build() -> tuple[bytes, dict]:
        calls.append(key)
        return payload(key, size), {"name": "kernel", "target": "cuda:90"}

    return build


@pytest.fixture
def remote_log(caplog):
    caplog.set_level(logging.DEBUG, logger="kernelcache.remote")
    return caplog


def warnings_of(caplog, topic: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "kernelcache.remote" and r.levelno == logging.WARNING and topic in r.message
    ]


def test_two_machines_share_through_redis(server, tmp_path) -> None:
    key = key_of(1)
    put = textwrap.dedent(
        """
        import sys, kernelcache
        c = kernelcache.Cache(sys.argv[2], readonly_roots=[], remote=sys.argv[1])
        c.put(sys.argv[3], "bin", b"machine-a" * 1000, {"name": "add", "num_warps": 4})
        """
    )
    get = textwrap.dedent(
        """
        import json, sys, kernelcache
        c = kernelcache.Cache(sys.argv[2], readonly_roots=[], remote=sys.argv[1])
        first, second = c.get(sys.argv[3], "bin"), c.get(sys.argv[3], "bin")
        print(json.dumps([first.source, second.source, first.path, first.data.decode()[:9],
                          first.meta["num_warps"], kernelcache.process_stats()]))
        """
    )
    a, b = tmp_path / "machine-a", tmp_path / "machine-b"
    subprocess.run(
        [sys.executable, "-c", put, server.url, str(a), key], env=child_env(), check=True
    )
    out = subprocess.run(
        [sys.executable, "-c", get, server.url, str(b), key],
        env=child_env(),
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    first, second, path, text, warps, counts = json.loads(out)
    assert (first, second) == ("remote", "local")
    assert path == str(b / f"{key}.bin") and Path(path).read_bytes() == b"machine-a" * 1000
    assert (text, warps) == ("machine-a", 4)
    assert counts["remote_hits"] == 1 and counts["hits"] == 2 and counts["remote_errors"] == 0


def test_eight_cold_processes_build_each_key_once(server, tmp_path) -> None:
    keys = [key_of(100 + i) for i in range(6)]
    orders = [keys[i % 6 :] + keys[: i % 6] for i in range(8)]
    procs, builds = start_workers(server.url, tmp_path, orders, build_s=0.15)
    results = finish(procs)
    built = Counter(line.split()[0] for line in builds.read_text().splitlines())
    assert built == dict.fromkeys(keys, 1), built
    assert sum(r["stats"]["builds"] for r, _ in results) == len(keys)
    sources = Counter(s for r, _ in results for s in r["sources"].values())
    assert sources["remote"] == 8 * 6 - len(keys)
    assert all(r["stats"]["remote_errors"] == 0 for r, _ in results)


def test_server_killed_mid_run_the_job_completes(server, tmp_path) -> None:
    keys = [key_of(200 + i) for i in range(30)]
    orders = [keys[i * 7 :] + keys[: i * 7] for i in range(4)]
    started = time.monotonic()
    procs, builds = start_workers(server.url, tmp_path, orders, build_s=0.03)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if builds.exists() and len(builds.read_text().splitlines()) >= 6:
            break
        time.sleep(0.01)
    server.kill()
    results = finish(procs)
    assert time.monotonic() - started < 10  # well under the 20 s lock timeout of the workers
    for result, err in results:
        assert len(result["sources"]) == 30
        assert result["tier"]["breaker_trips"] == 1
        assert err.count("unavailable") == 1, err
    built = Counter(line.split()[0] for line in builds.read_text().splitlines())
    assert set(built) == set(keys)


def test_hung_server_costs_one_timeout_then_the_breaker_skips_it(server, tmp_path) -> None:
    timeout = 1.0  # (a healthy server answers well within it, even on a loaded machine)
    cache = kernelcache.Cache(
        tmp_path / "root", readonly_roots=[], remote=server.url + f"?timeout={timeout:g}"
    )
    calls: list[str] = []
    for i in range(5):
        cache.get_or_create(key_of(300 + i), "bin", builder(key_of(300 + i), calls))
    assert cache.remote.counters.get("breaker_trips", 0) == 0, "the server answered until now"
    server.process.send_signal(signal.SIGSTOP)  # alive, connections open, never answers
    try:
        started = time.monotonic()
        for i in range(5, 25):
            art = cache.get_or_create(key_of(300 + i), "bin", builder(key_of(300 + i), calls))
            assert art.data == payload(key_of(300 + i)) and art.source == "local"
        elapsed = time.monotonic() - started
    finally:
        server.process.send_signal(signal.SIGCONT)
    assert len(calls) == 25
    assert timeout - 0.05 < elapsed < timeout + 1.0, elapsed
    assert cache.remote.counters["breaker_trips"] == 1


@pytest.mark.parametrize("kind", ["refused", "hung"])
def test_unreachable_url_costs_at_most_the_timeout_once(tmp_path, remote_log, kind) -> None:
    with blackhole() as hung_port:
        port = free_port() if kind == "refused" else hung_port
        url = f"redis://:{SECRET}@127.0.0.1:{port}/0?timeout=0.3"
        cache = kernelcache.Cache(tmp_path, readonly_roots=[], remote=url)
        calls: list[str] = []
        started = time.monotonic()
        for i in range(40):
            key = key_of(400 + i)
            assert cache.get(key, "bin") is None
            assert cache.get_or_create(key, "bin", builder(key, calls)).source == "local"
            cache.remote.put(key, "bin", b"x", {})
            assert cache.remote.acquire(key, 5.0) is None
        elapsed = time.monotonic() - started
    assert elapsed < 10 * 0.3, elapsed  # the timeout once (40 times would be 12 s), under load
    assert len(calls) == 40
    tier = cache.remote.counters
    assert tier["breaker_trips"] == 1 and tier["gets"] == 1
    assert len(warnings_of(remote_log, "unavailable")) == 1
    assert SECRET not in remote_log.text and "***" in remote_log.text
    assert kernelcache.process_stats()["remote_errors"] >= 1


@pytest.mark.parametrize(
    "reply",
    [b"HTTP/1.1 400 Bad Request\r\n\r\n", b":12x\r\n" * 4, b"$900\r\ntruncated", b"\xff" * 64],
)
def test_a_server_speaking_garbage_is_skipped(tmp_path, reply) -> None:
    with blackhole(reply) as port:
        cache = kernelcache.Cache(
            tmp_path, readonly_roots=[], remote=f"redis://127.0.0.1:{port}/0?timeout=0.3"
        )
        calls: list[str] = []
        started = time.monotonic()
        for i in range(10):
            key = key_of(450 + i)
            assert cache.get_or_create(key, "bin", builder(key, calls)).data == payload(key)
        elapsed = time.monotonic() - started
    assert len(calls) == 10 and elapsed < 8 * 0.3, elapsed  # the timeout once, not 10 times
    assert cache.remote.counters["breaker_trips"] == 1


def test_breaker_reopens_after_its_period(tmp_path) -> None:
    port = free_port()
    tier = open_remote(f"redis://127.0.0.1:{port}/0?breaker=0.5&timeout=0.3")
    key = key_of(500)
    assert tier.get(key, "bin") is None
    with RedisServer(tmp_path / "redis", port=port) as srv:
        tier.put(key, "bin", b"late", {})
        assert srv.client().exists(tier.name(key)) == 0  # breaker still open: not asked
        time.sleep(0.55)
        tier.put(key, "bin", b"late", {})
        found = tier.get(key, "bin")
    assert found is not None and found[0] == b"late"
    assert tier.counters["breaker_trips"] == 1 and tier.counters["skipped"] >= 1


def test_corrupt_value_is_rejected_deleted_and_rebuilt(server, tmp_path, remote_log) -> None:
    key = key_of(600)
    calls: list[str] = []
    a = kernelcache.Cache(tmp_path / "a", readonly_roots=[], remote=server.url)
    a.get_or_create(key, "bin", builder(key, calls))
    r = server.client()
    name = a.remote.name(key)
    good = r.get(name)
    r.set(name, good[:-10] + bytes(b ^ 0xFF for b in good[-10:]))
    b = kernelcache.Cache(tmp_path / "b", readonly_roots=[], remote=server.url)
    before = kernelcache.process_stats()["remote_errors"]
    art = b.get_or_create(key, "bin", builder(key, calls))
    assert art.data == payload(key) and art.source == "local"
    assert calls == [key, key]
    assert b.remote.counters["rejected"] == 1
    assert kernelcache.process_stats()["remote_errors"] > before
    assert len(warnings_of(remote_log, "rejected")) == 1
    # the rebuilt entry replaced the bad value
    assert not isinstance(decode_value(r.get(name), key), Problem)
    c = kernelcache.Cache(tmp_path / "c", readonly_roots=[], remote=server.url)
    assert c.get(key, "bin").source == "remote"


def test_garbage_values_are_misses_and_the_tier_keeps_working(server) -> None:
    tier = open_remote(server.url)
    r = server.client()
    data = b"bin" * 100
    good = encode_value(make_metadata(key_of(700), "bin", data, {}), data)
    garbage = {
        key_of(701): b"",
        key_of(702): b"not a kernelcache value",
        key_of(703): MAGIC + b"\xff\xff\xff\xff" + good[8:],
        key_of(704): good[: len(good) // 2],
        key_of(705): good,  # metadata names key 700: a value under the wrong key
        key_of(706): good[:-1] + b"!",
    }
    for key, value in garbage.items():
        r.set(tier.name(key), value)
    r.hset(tier.name(key_of(707)), "a", "b")  # the wrong type: WRONGTYPE from GET
    for key in [*garbage, key_of(707)]:
        assert tier.get(key, "bin") is None
    assert tier.counters["rejected"] == len(garbage)
    assert all(r.exists(tier.name(key)) == 0 for key in garbage)  # bad values deleted
    assert "breaker_trips" not in tier.counters
    tier.put(key_of(708), "bin", data, {"name": "k"})
    found = tier.get(key_of(708), "bin")
    assert found is not None and found[0] == data and found[1]["name"] == "k"


def test_a_value_with_another_ext_is_a_plain_miss(server) -> None:
    tier = open_remote(server.url)
    tier.put(key_of(750), "obj", b"amd", {})
    assert tier.get(key_of(750), "bin") is None
    assert tier.get(key_of(750), "obj") is not None
    assert "rejected" not in tier.counters


def test_ttl_is_applied(server) -> None:
    r = server.client()
    forever, week, short = (open_remote(server.url + q) for q in ("", "?ttl=7d", "?ttl=300ms"))
    forever.put(key_of(800), "bin", b"a", {})
    week.put(key_of(801), "bin", b"b", {})
    short.put(key_of(802), "bin", b"c", {})
    assert r.pttl(forever.name(key_of(800))) == -1
    assert 7 * 86400 * 1000 - 60_000 < r.pttl(week.name(key_of(801))) <= 7 * 86400 * 1000
    assert short.get(key_of(802), "bin") is not None
    time.sleep(0.4)
    assert short.get(key_of(802), "bin") is None


def test_oversized_entries_are_not_sent(server, remote_log) -> None:
    tier = open_remote(server.url + "?max_size=4K")
    tier.put(key_of(900), "bin", payload("s", 1000), {})
    tier.put(key_of(901), "bin", payload("L", 5000), {})
    tier.put(key_of(902), "bin", payload("L", 6000), {})
    r = server.client()
    assert r.exists(tier.name(key_of(900))) == 1
    assert r.exists(tier.name(key_of(901)), tier.name(key_of(902))) == 0
    assert tier.counters["oversize"] == 2
    assert len(warnings_of(remote_log, "max_size")) == 1


def test_namespaces_do_not_see_each_other(server) -> None:
    a, b = open_remote(server.url + "?namespace=jobA"), open_remote(server.url + "?namespace=jobB")
    a.put(key_of(950), "bin", b"a", {})
    assert b.get(key_of(950), "bin") is None and a.get(key_of(950), "bin") is not None
    assert server.client().exists(f"jobA:v4:{key_of(950)}") == 1


def test_full_server_stops_puts_but_reads_go_on(tmp_path, remote_log) -> None:
    args = ["--maxmemory", "3mb", "--maxmemory-policy", "noeviction"]
    with RedisServer(tmp_path / "redis", args=args) as srv:
        cache = kernelcache.Cache(tmp_path / "root", readonly_roots=[], remote=srv.url)
        for i in range(80):
            cache.put(key_of(1000 + i), "bin", payload(key_of(1000 + i), 65536), {})
        tier = cache.remote.counters
        assert tier["full"] == 1 and tier["puts"] >= 1 and tier["skipped"] >= 1
        assert "breaker_trips" not in tier
        assert len(warnings_of(remote_log, "refuses writes")) == 1
        other = kernelcache.Cache(tmp_path / "other", readonly_roots=[], remote=srv.url)
        assert other.get(key_of(1000), "bin").source == "remote"


def test_evicting_server_turns_into_misses(tmp_path) -> None:
    args = ["--maxmemory", "3mb", "--maxmemory-policy", "allkeys-lru"]
    with RedisServer(tmp_path / "redis", args=args) as srv:
        tier = open_remote(srv.url)
        for i in range(80):
            tier.put(key_of(1100 + i), "bin", payload(key_of(1100 + i), 65536), {})
        hits = [tier.get(key_of(1100 + i), "bin") is not None for i in range(80)]
    assert tier.counters["puts"] == 80
    assert not all(hits) and any(hits)
    assert "errors" not in tier.counters


def test_password_auth_works_and_is_never_shown(tmp_path, remote_log) -> None:
    with RedisServer(tmp_path / "redis", password=SECRET) as srv:
        for url in (srv.url, f"redis://default:{SECRET}@127.0.0.1:{srv.port}/0"):
            cache = kernelcache.Cache(tmp_path / "root", readonly_roots=[], remote=url)
            cache.put(key_of(1200), "bin", b"secret kernel", {})
            assert open_remote(url).get(key_of(1200), "bin") is not None
            assert SECRET not in repr(cache) and SECRET not in str(cache.remote)
        wrong = open_remote(f"redis://:wrong-{SECRET}@127.0.0.1:{srv.port}/0")
        nopass = open_remote(f"redis://127.0.0.1:{srv.port}/0")
        assert wrong.get(key_of(1200), "bin") is None
        assert nopass.get(key_of(1200), "bin") is None
        assert wrong.counters["breaker_trips"] == 1
    messages = warnings_of(remote_log, "unavailable")
    assert len(messages) == 2  # one per server URL
    assert SECRET not in remote_log.text


def test_tls_with_a_ca_file(tmp_path) -> None:
    try:
        tls = make_tls_files(tmp_path)
    except RuntimeError as e:
        pytest.skip(f"cannot make a TLS certificate: {e}")
    with RedisServer(tmp_path / "redis", tls=tls, password=SECRET) as srv:
        assert srv.url.startswith("rediss://")
        trusted = open_remote(f"{srv.url}?ssl_ca_certs={tls.cert}")
        trusted.put(key_of(1300), "bin", b"over tls", {})
        assert trusted.get(key_of(1300), "bin")[0] == b"over tls"
        untrusted = open_remote(srv.url + "?timeout=1")
        assert untrusted.get(key_of(1300), "bin") is None
        assert untrusted.counters["breaker_trips"] == 1


# -- the job-wide build lock ----------------------------------------------------------------
def test_lock_is_exclusive_and_a_waiter_gives_up_in_time(server) -> None:
    a, b = open_remote(server.url), open_remote(server.url)
    release = a.acquire(key_of(1400), 5)
    assert release is not None
    started = time.monotonic()
    assert b.acquire(key_of(1400), 0.3) is None
    assert 0.3 <= time.monotonic() - started < 4.0  # gave up, not waiting for the holder (5 s)
    release()
    again = b.acquire(key_of(1400), 0)
    assert again is not None
    again()
    assert b.counters["lock_timeouts"] == 1 and b.counters["locks"] == 1


def test_waiter_stops_as_soon_as_the_entry_appears(server) -> None:
    a, b = open_remote(server.url), open_remote(server.url)
    release = a.acquire(key_of(1500), 5)
    a.put(key_of(1500), "bin", b"built by a", {})
    started = time.monotonic()
    ready = b.acquire(key_of(1500), 10)
    assert ready is not None and time.monotonic() - started < 5.0  # not its timeout (10 s)
    ready()  # releases nothing
    assert server.client().get(a.name(key_of(1500)) + ":lock") is not None
    release()
    assert b.counters["lock_ready"] == 1


def test_a_dead_builders_lock_expires(server) -> None:
    code = textwrap.dedent(
        """
        import os, sys
        from kernelcache.remote import open_remote
        assert open_remote(sys.argv[1]).acquire(sys.argv[2], 1) is not None
        os._exit(0)  # dies holding the lock
        """
    )
    url = server.url + "?lock_ttl=600ms"
    subprocess.run([sys.executable, "-c", code, url, key_of(1600)], env=child_env(), check=True)
    started = time.monotonic()
    release = open_remote(url).acquire(key_of(1600), 5)
    assert release is not None
    assert time.monotonic() - started < 4.0  # the lock expired (600 ms): not the timeout (5 s)
    release()


def test_release_only_removes_the_owners_lock(server) -> None:
    a = open_remote(server.url + "?lock_ttl=200ms")
    b = open_remote(server.url + "?lock_ttl=10s")
    release_a = a.acquire(key_of(1700), 0)
    time.sleep(0.3)  # a's lock expired
    release_b = b.acquire(key_of(1700), 0)
    assert release_a is not None and release_b is not None
    release_a()
    lock = a.name(key_of(1700)) + ":lock"
    assert server.client().pttl(lock) > 1000  # b still holds it (a's lasted 200 ms at most)
    assert a.counters["locks_lost"] == 1
    release_b()
    assert server.client().exists(lock) == 0


def test_build_errors_do_not_leave_a_lock(server, tmp_path) -> None:
    cache = kernelcache.Cache(tmp_path, readonly_roots=[], remote=server.url)

    def fail() -> tuple[bytes, dict]:
        raise RuntimeError("compiler crashed")

    with pytest.raises(RuntimeError, match="compiler crashed"):
        cache.get_or_create(key_of(1800), "bin", fail)
    assert server.client().exists(cache.remote.name(key_of(1800)) + ":lock") == 0


def test_tier_counts_errors_under_the_given_root(tmp_path) -> None:
    tier = RedisTier(f"redis://127.0.0.1:{free_port()}/0", stats_root=str(tmp_path))
    tier.get(key_of(1900), "bin")
    stats.enable_log(str(tmp_path))
    stats.flush()
    assert stats.read_logs(str(tmp_path))[0]["remote_errors"] == 1


def test_stats_remote_shows_the_tiers_entries_and_bytes_bounded(server, tmp_path):
    """``kernelcache stats --remote`` counts the namespace's entries and bytes (SCAN and STRLEN,
    lock keys left out, other namespaces not counted), and a scan of a big server stops at its
    limit, saying so."""
    from cli_support import kc

    url = server.url + "?namespace=team-a"
    cache = kernelcache.Cache(tmp_path / "root", readonly_roots=(), remote=url)
    for i in range(3):
        cache.put(f"{i:064x}", "bin", payload(str(i), 1000), {"name": "k", "target": "cuda:90"})
    client = server.client()
    client.set(cache.remote.name("f" * 64) + ":lock", b"token")  # a build lock: not an entry
    client.set("kc:v4:team-b:" + "e" * 64, b"y" * 50_000)  # another namespace
    doc = json.loads(
        kc(tmp_path / "root", "stats", "--remote", "--json", env={"KERNELCACHE_REMOTE": url}).stdout
    )
    (probe,) = doc["remote"]
    usage = probe["usage"]
    assert (usage["entries"], usage["complete"], usage["server_keys"]) == (3, True, 5)
    assert 3000 < usage["bytes"] < 5000
    text = kc(tmp_path / "root", "stats", "--remote", env={"KERNELCACHE_REMOTE": url}).stdout
    assert "  3 entries, " in text and "holds 5 keys" in text

    pipe = client.pipeline(transaction=False)
    for i in range(2500):
        pipe.set(cache.remote.name(f"{i + 100:064x}"), b"z")
    pipe.execute()
    bounded = cache.remote.usage(limit=1000)
    assert bounded["complete"] is False and 1000 <= bounded["entries"] < 2503
    assert cache.remote.usage()["entries"] == 2503
