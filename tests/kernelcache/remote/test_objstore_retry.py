"""A bucket's one bad answer: a request the store answers with a server error is sent once
more (S3 asks clients to retry its sporadic 500 and 503), so one such answer neither misses an
entry nor trips the node's breaker; a write sent again after its first try landed finds its own
write (a build lock stays its taker's); a store that keeps failing costs two requests, then the
breaker (a proxy in front of moto's server makes the errors)."""

from __future__ import annotations

import time

import pytest
from object_store import flaky_proxy, moto_available
from remote_workers import key_of

from kernelcache.remote import ObjectStoreTier
from kernelcache.remote.tier import Busy

pytestmark = pytest.mark.skipif(not moto_available(), reason="needs moto and obstore (test extra)")

META = {"name": "kernel", "target": "cuda:90"}


def _through(proxy, bucket: str) -> ObjectStoreTier:
    """A tier of ``bucket`` (a moto URL) whose requests go through ``proxy``."""
    url = bucket.replace(bucket.split("endpoint=")[1].split("&")[0], proxy.endpoint)
    return ObjectStoreTier(url + "&breaker=60")


def _once(method: str, suffix: str, when: str):
    """A rule of flaky_proxy failing the first ``method`` request whose path ends in
    ``suffix``, ``when`` (before or after the server does it)."""
    done: list[bool] = []

    def fail(m: str, path: str) -> str | None:
        if m == method and path.split("?")[0].endswith(suffix) and not done:
            done.append(True)
            return when
        return None

    return fail


def test_one_server_error_on_a_read_is_ridden_over(s3):
    bucket = s3.bucket("kc-retry-read")
    key = key_of(901)
    assert ObjectStoreTier(bucket).put(key, "bin", b"entry" * 40, META)
    with flaky_proxy(s3.endpoint, _once("GET", key, "before")) as proxy:
        tier = _through(proxy, bucket)
        got = tier.get(key, "bin")
    assert got is not None and got[0] == b"entry" * 40
    assert [status for m, _, status in proxy.requests if m == "GET"] == [500, 200]
    counters = tier.counters
    assert counters.get("errors", 0) == 0 and counters.get("breaker_trips", 0) == 0, counters


def test_a_lock_whose_first_write_landed_unanswered_is_its_takers(s3):
    bucket = s3.bucket("kc-retry-lock")
    key = key_of(902)
    with flaky_proxy(s3.endpoint, _once("PUT", f"{key}.lock", "after")) as proxy:
        taker = _through(proxy, bucket)
        release = taker.try_acquire(key)
        assert callable(release), release
        puts = [status for m, path, status in proxy.requests if m == "PUT" and "lock" in path]
        assert puts == [500, 412], "the write landed, then was sent again and refused"
        other = ObjectStoreTier(bucket)
        busy = other.try_acquire(key)
        assert isinstance(busy, Busy), "held by its taker"
        assert busy.lock == other.name(key) + ".lock"  # (it named the key's group twice)
        release()
    assert callable(ObjectStoreTier(bucket).try_acquire(key)), "released"


def test_a_store_that_keeps_failing_costs_two_requests_then_the_breaker(s3):
    bucket = s3.bucket("kc-retry-down")
    with flaky_proxy(s3.endpoint, lambda m, path: "before") as proxy:
        tier = _through(proxy, bucket)
        start = time.monotonic()
        assert tier.get(key_of(903), "bin") is None
        took = time.monotonic() - start
        assert tier.get(key_of(904), "bin") is None
    assert len(proxy.requests) == 2, proxy.requests
    assert took < 2.0
    assert tier.counters["breaker_trips"] == 1, tier.counters
