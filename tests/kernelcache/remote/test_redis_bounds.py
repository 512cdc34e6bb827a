"""A hostile or slow Redis: every wait has a total deadline per call, reads are bounded in time
and size, and a lock_ttl outside Redis's range is a configuration error."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from redis_server import REDIS_SERVER, SKIP_REASON, drip
from remote_workers import key_of
from support import REPO

import kernelcache
from kernelcache.errors import ConfigError
from kernelcache.remote import RedisTier, parse_url

pytestmark = pytest.mark.skipif(REDIS_SERVER is None, reason=SKIP_REASON)


def build_of(key: str):
    return lambda: (key.encode() * 64, {"name": "kernel", "target": "cuda:90"})


def test_locks_kept_fresh_by_a_hostile_client_cost_one_timeout_per_call(server, tmp_path):
    """A client that keeps every lock key fresh held 4 keys for 4 x the lock timeout; the
    call's remote lock waits now share one budget."""
    tier = RedisTier(server.url)
    keys = [key_of(i) for i in range(4)]
    stop = threading.Event()

    def hostile() -> None:
        r = server.client()
        while not stop.is_set():
            for key in keys:  # a fresh lock with a valid expiry: never broken as stale
                r.set(tier.name(key) + ":lock", "60000:hostile", px=60000)
            stop.wait(0.05)

    thread = threading.Thread(target=hostile, daemon=True)
    thread.start()
    try:
        time.sleep(0.2)
        cache = kernelcache.Cache(tmp_path / "root", (), server.url, lock_timeout=2.0)
        before = kernelcache.process_stats()["lock_timeouts"]
        started = time.monotonic()
        arts = cache.get_or_create_many(
            [kernelcache.BuildItem(k, "bin", build_of(k)) for k in keys]
        )
        elapsed = time.monotonic() - started
    finally:
        stop.set()
        thread.join()
    assert [a.key for a in arts] == keys
    # one lock timeout (2 s) for the call, not 4 x 2 s = 8 s (headroom for a loaded machine)
    assert 1.9 <= elapsed < 4.5, elapsed
    assert kernelcache.process_stats()["lock_timeouts"] - before == 4


def test_a_server_answering_one_byte_at_a_time_costs_one_timeout(tmp_path):
    """A byte every 0.3 s kept one get busy for 30 s at timeout=0.5; now the whole call is
    bounded, it counts as a timeout and the breaker opens."""
    with drip(interval=0.3) as port:
        tier = RedisTier(f"redis://127.0.0.1:{port}/0?timeout=0.5&breaker=30")
        started = time.monotonic()
        assert tier.get(key_of(1), "bin") is None
        first = time.monotonic() - started
        for i in range(10):
            assert tier.get(key_of(2 + i), "bin") is None
        total = time.monotonic() - started
    assert first < 1.5, first  # 0.5 s and a connect, with headroom
    assert total < 2.0, total  # the others are skipped by the breaker
    counters = tier.counters
    assert counters["timeouts"] == 1 and counters["breaker_trips"] == 1
    assert counters["skipped"] == 10


def test_a_slow_server_does_not_stall_a_job(tmp_path):
    with drip(interval=0.2) as port:
        cache = kernelcache.Cache(
            tmp_path, (), f"redis://127.0.0.1:{port}/0?timeout=0.4", lock_timeout=5.0
        )
        started = time.monotonic()
        for i in range(5):
            key = key_of(100 + i)
            assert cache.get_or_create(key, "bin", build_of(key)).key == key
        elapsed = time.monotonic() - started
    assert elapsed < 2.0, elapsed
    assert cache.remote.counters["breaker_trips"] == 1


# The peak RSS of one get, in a fresh process (ru_maxrss is a high-water mark).
_RSS_PROBE = """
import json, resource, sys, time
from kernelcache.remote import RedisTier
tier = RedisTier(sys.argv[1])
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
started = time.monotonic()
found = tier.get(sys.argv[2], "bin")
elapsed = time.monotonic() - started
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"found": found is not None, "grew_kib": after - before,
                  "elapsed": elapsed, "counters": tier.counters}))
"""


def _probe(url: str, key: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KERNELCACHE_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_RSS_PROBE), url, key],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=True,
    )
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_value_larger_than_max_size_is_refused_before_it_is_read(server):
    """A 512 MB value cost 1.5 GB of RSS per get; its length is now asked first."""
    tier = RedisTier(server.url)
    key = key_of(300)
    server.client().setrange(tier.name(key), (512 << 20) - 1, b"x")  # 512 MiB, made in Redis
    result = _probe(server.url + "?timeout=2", key)
    assert not result["found"]
    assert result["counters"]["oversize"] == 1 and result["counters"].get("errors", 0) == 0
    assert result["grew_kib"] < 32 << 10, result  # under 32 MiB (the value is 512 MiB)
    assert result["elapsed"] < 1.5, result


def test_a_server_flooding_a_reply_is_cut_at_max_size():
    """A server that claims a 512 MiB reply and streams it fast is cut after max_size."""
    with drip(head=b"$536870912\r\n", chunk=b"\0" * 65536, interval=0) as port:
        result = _probe(f"redis://127.0.0.1:{port}/0?timeout=5&max_size=1M", key_of(301))
    assert not result["found"]
    assert result["counters"]["oversize"] == 1 and result["counters"]["breaker_trips"] == 1
    assert result["grew_kib"] < 32 << 10, result
    assert result["elapsed"] < 3.0, result


@pytest.mark.parametrize(
    "option", ["lock_ttl=1000000w", "lock_ttl=0", "ttl=1000000w", "lock_ttl=0.0001"]
)
def test_an_expiry_outside_redis_range_is_a_config_error(option):
    with pytest.raises(ConfigError, match=option.split("=")[0] + " must be") as e:
        parse_url(f"redis://127.0.0.1:6379/0?{option}")
    assert "Redis's range" in str(e.value) or "1ms" in str(e.value)


def test_the_longest_expiry_works_on_a_real_server(server):
    tier = RedisTier(server.url + "?lock_ttl=156000w")  # about 3000 years
    release = tier.acquire(key_of(400), 1.0)
    assert release is not None and tier.counters.get("errors", 0) == 0
    release()
    assert tier.counters.get("locks_lost", 0) == 0
