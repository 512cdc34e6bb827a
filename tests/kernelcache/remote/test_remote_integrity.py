"""The Redis tier against a real redis-server: every value is checked against the metadata
schema and the entry digest, ``get`` never raises, build locks always expire (and a lock found
without expiry is broken at once), and with a signing key values are authenticated."""

from __future__ import annotations

import hashlib
import json
import logging
import math
import struct
import time
from typing import Any

import pytest
from artifact_images import elf_image, launch
from redis_server import REDIS_SERVER, SKIP_REASON, RedisServer
from support import run_py

import bridge.entries.metadata  # noqa: F401 -- its launch fields (num_warps, ...) are covered by the digest
import kernelcache
from kernelcache import stats
from kernelcache.remote import MAGIC, open_remote
from kernelcache.remote.codec import inflate_value
from kernelcache.schema import check_signature, encode_metadata, entry_digest
from kernelcache.store import make_metadata

pytestmark = pytest.mark.skipif(REDIS_SERVER is None, reason=SKIP_REASON)

KEY_A = "a1" * 32
KEY_B = "b2" * 32
META = launch()  # the launch metadata a cubin must hold
DATA = elf_image(b"cubin" * 800)  # a whole cubin

ODD_VALUES: dict[str, tuple[str, Any]] = {
    "created-400-digits": ("created", 10**400),
    "created-infinity": ("created", math.inf),
    "created-nan": ("created", math.nan),
    "name-lone-surrogate": ("name", "\ud800"),
    "name-list": ("name", [1, 2]),
    "producer-int": ("producer", 5),
    "producer-str": ("producer", "abc"),
}


@pytest.fixture
def warnings(caplog):
    caplog.set_level(logging.WARNING, logger="kernelcache")

    def matching(text: str) -> list[str]:
        return [
            r.getMessage()
            for r in caplog.records
            if r.levelno == logging.WARNING and text in r.getMessage()
        ]

    return matching


def _raw_value(doc: dict[str, Any], data: bytes) -> bytes:
    """A value in the tier's layout with ``doc`` as it is (NaN, huge integers and lone
    surrogates included), as a buggy or hostile client could store it."""
    meta = json.dumps(doc, sort_keys=True).encode()
    return MAGIC + struct.pack(">I", len(meta)) + meta + data


def _url(server: RedisServer, query: str = "") -> str:
    """``server``'s URL with ``query`` and a socket timeout a loaded machine keeps: these
    tests are about what values hold, and a healthy server answering late under load (the
    default timeout is 0.5 s) is a miss, not what they check."""
    return f"{server.url}?timeout=10s" + (f"&{query}" if query else "")


def _cache(root, url: str, **kw: Any) -> kernelcache.Cache:
    return kernelcache.Cache(root, readonly_roots=(), remote=url, **kw)


@pytest.mark.parametrize("case", sorted(ODD_VALUES))
def test_a_value_with_odd_metadata_is_a_miss_never_an_exception(server, tmp_path, case):
    field, value = ODD_VALUES[case]
    tier = open_remote(_url(server))
    doc = {**make_metadata(KEY_A, "cubin", DATA, META), field: value}
    server.client().set(tier.name(KEY_A), _raw_value(doc, DATA))
    cache = _cache(tmp_path / "root", _url(server))
    assert cache.get(KEY_A, "cubin") is None
    assert server.client().exists(tier.name(KEY_A)) == 0  # the bad value is removed
    art = cache.get_or_create(KEY_A, "cubin", lambda: (DATA, META))
    assert art.source == "local" and art.data == DATA
    assert _cache(tmp_path / "other", _url(server)).get(KEY_A, "cubin").source == "remote"


def test_a_value_whose_launch_metadata_was_changed_is_rejected(server, tmp_path, warnings):
    """num_warps changed in Redis (artifact and its digest untouched): the entry digest no
    longer matches, the value is rejected and counted."""
    writer = _cache(tmp_path / "w", _url(server))
    writer.put(KEY_A, "cubin", DATA, META)
    r = server.client()
    name = writer.remote.name(KEY_A)
    raw = _plain(r.get(name))
    edited = raw.replace(b'"num_warps":4', b'"num_warps":8')
    assert edited != raw and len(edited) == len(raw)
    r.set(name, edited)
    reader = _cache(tmp_path / "r", _url(server))
    before = stats.process_stats()["remote_errors"]
    assert reader.get(KEY_A, "cubin") is None
    assert stats.process_stats()["remote_errors"] > before
    assert reader.remote.counters["rejected"] == 1
    assert any("digest" in m for m in warnings("rejected a bad entry"))


def test_a_remote_tier_returning_garbage_is_a_miss(tmp_path):
    """Any RemoteTier implementation: what it returns is checked like a Redis value, and an
    exception from it is a miss."""

    class Lying:
        def __init__(self, found: Any) -> None:
            self.found = found

        def get(self, key: str, ext: str) -> Any:
            if isinstance(self.found, Exception):
                raise self.found
            return self.found

        def put(self, key: str, ext: str, data: bytes, meta: Any) -> bool:
            return False

        def acquire(self, key: str, timeout: float) -> None:
            return None

    good = make_metadata(KEY_A, "cubin", DATA, META)
    for found in (
        (DATA, {**good, "producer": 5}),
        (DATA, {**good, "num_warps": 8}),
        (DATA, {**good, "created": math.nan}),
        (DATA, "not a mapping"),
        (b"other bytes", good),
        ("not bytes", good),
        None,
        42,
        RuntimeError("the tier is broken"),
    ):
        cache = kernelcache.Cache(tmp_path / "root", readonly_roots=(), remote=Lying(found))
        assert cache.get(KEY_A, "cubin") is None, found
    cache = kernelcache.Cache(tmp_path / "root", readonly_roots=(), remote=Lying((DATA, good)))
    assert cache.get(KEY_A, "cubin").data == DATA


# -- build locks always expire ---------------------------------------------------------------
@pytest.mark.parametrize("expiry", [None, 86_400_000], ids=["no-expiry", "one-day"])
def test_a_lock_without_expiry_is_broken_with_one_warning(server, tmp_path, warnings, expiry):
    """A lock key left without expiry (or with one far longer than lock_ttl), e.g. by a crashed
    client or by anyone: get_or_create breaks it at once instead of waiting its lock timeout."""
    tier = open_remote(_url(server))
    r = server.client()
    for key in (KEY_A, KEY_B):
        r.set(tier.name(key) + ":lock", "left by someone", px=expiry)
    cache = _cache(tmp_path / "root", _url(server), lock_timeout=20)
    started = time.monotonic()
    for key in (KEY_A, KEY_B):
        art = cache.get_or_create(key, "cubin", lambda: (DATA, META))
        assert art.path is not None
    assert time.monotonic() - started < 5
    assert len(warnings("build lock")) == 1
    assert cache.remote.counters["locks_broken"] == 2
    for key in (KEY_A, KEY_B):
        assert r.exists(tier.name(key) + ":lock") == 0
        assert r.exists(tier.name(key)) == 1


def test_every_build_lock_carries_an_expiry(server):
    tier = open_remote(_url(server, "lock_ttl=30s"))
    release = tier.acquire(KEY_A, 1)
    assert release is not None
    ttl = server.client().pttl(tier.name(KEY_A) + ":lock")
    assert 0 < ttl <= 30_000
    release()


def test_a_lock_older_than_this_clients_lock_ttl_is_broken(server):
    """A peer configured with a longer lock_ttl holds the lock: this client waits for it only
    as long as its own lock_ttl, then takes it over. (Each request may take seconds on a
    loaded machine: what is measured is the lock's age, never a request's speed.)"""
    long_holder = open_remote(_url(server, "lock_ttl=60s"))
    short = open_remote(_url(server, "lock_ttl=500ms"))
    assert long_holder.acquire(KEY_A, 10) is not None
    started = time.monotonic()
    release = short.acquire(KEY_A, 30)
    assert release is not None
    assert 0.4 < time.monotonic() - started < 30  # far sooner than the holder's 60s
    assert short.counters["locks_broken"] == 1
    release()


def test_a_held_lock_within_its_ttl_is_respected(server):
    a, b = open_remote(_url(server, "lock_ttl=10s")), open_remote(_url(server, "lock_ttl=10s"))
    release = a.acquire(KEY_A, 1)
    assert release is not None
    assert b.acquire(KEY_A, 0.5) is None
    assert b.counters.get("locks_broken", 0) == 0
    release()


# -- signed values -------------------------------------------------------------------------------
SECRET_1 = "k1-" + "0123456789abcdef" * 2
SECRET_2 = "k2-" + "fedcba9876543210" * 2


def test_signed_values_between_peers(server, tmp_path, monkeypatch, warnings):
    monkeypatch.setenv("KERNELCACHE_SIGNING_KEY", SECRET_1)
    writer = _cache(tmp_path / "w", _url(server))
    writer.put(KEY_A, "cubin", DATA, META)
    raw = _plain(server.client().get(writer.remote.name(KEY_A)))
    assert b'"hmac":"hmac-sha256:' in raw and SECRET_1.encode() not in raw
    assert _cache(tmp_path / "same-key", _url(server)).get(KEY_A, "cubin").source == "remote"

    monkeypatch.setenv("KERNELCACHE_SIGNING_KEY", SECRET_2)
    other = _cache(tmp_path / "other-key", _url(server))
    before = stats.process_stats()
    assert other.get(KEY_A, "cubin") is None
    assert other.get(KEY_A, "cubin") is None
    after = stats.process_stats()
    assert after["unauthenticated"] == before["unauthenticated"] + 2
    assert len(warnings("signature")) == 1
    assert server.client().exists(writer.remote.name(KEY_A)) == 1  # left for its owners


def test_unsigned_values_are_refused_when_a_key_is_set(server, tmp_path, monkeypatch):
    unsigned = _cache(tmp_path / "u", _url(server))
    unsigned.put(KEY_B, "cubin", DATA, META)
    name = unsigned.remote.name(KEY_B)
    monkeypatch.setenv("KERNELCACHE_SIGNING_KEY", SECRET_1)
    signed = _cache(tmp_path / "s", _url(server))
    before = stats.process_stats()["unauthenticated"]
    assert signed.get(KEY_B, "cubin") is None
    assert stats.process_stats()["unauthenticated"] == before + 1
    art = signed.get_or_create(KEY_B, "cubin", lambda: (DATA, META))
    assert art.source == "local"
    # the rebuild left the unsigned value in place (it cannot verify it) ...
    assert b'"hmac"' not in _plain(server.client().get(name))
    assert signed.remote.counters["kept_unverified"] == 1
    # ... unless told to replace such values
    monkeypatch.setenv("KERNELCACHE_REMOTE_OVERWRITE", "1")
    replacing = _cache(tmp_path / "r", _url(server))
    replacing.get_or_create(KEY_B, "cubin", lambda: (DATA, META))
    assert replacing.remote.counters["overwritten"] == 1
    assert _cache(tmp_path / "s2", _url(server)).get(KEY_B, "cubin").source == "remote"


def _signed_value(server: RedisServer, tmp_path: Any, ext: str) -> tuple[Any, str, dict, bytes]:
    """(a client, the name, the metadata and the artifact) of a value that a writer of this
    process (the bridge's fields declared) signed with SECRET_1 (set in the environment)."""
    writer = _cache(tmp_path / "w", _url(server))
    writer.put(KEY_A, ext, DATA, META)
    name = writer.remote.name(KEY_A)
    doc, data = _split_value(server.client().get(name))
    return server.client(), name, doc, data


def _plain(raw: bytes) -> bytes:
    """A stored value as its plain form (compressed values are inflated; readers take both)."""
    plain = inflate_value(raw)
    assert isinstance(plain, bytes), plain
    return plain


def _split_value(raw: bytes) -> tuple[dict[str, Any], bytes]:
    raw = _plain(raw)
    """(metadata, artifact) of a value in the tier's layout."""
    (length,) = struct.unpack(">I", raw[4:8])
    return json.loads(raw[8 : 8 + length]), raw[8 + length :]


def test_a_value_resigned_with_other_bytes_is_refused(server, tmp_path, monkeypatch):
    """The signature covers the artifact bytes themselves, not only their (non-cryptographic)
    digest: a value whose bytes and digests were replaced is refused."""
    monkeypatch.setenv("KERNELCACHE_SIGNING_KEY", SECRET_1)
    r, name, doc, _ = _signed_value(server, tmp_path, "cubin")
    evil = b"\x7fELF EVIL" * 400
    forged = {**make_metadata(KEY_A, "cubin", evil, META), "hmac": doc["hmac"]}
    r.set(name, _raw_value(forged, evil))
    assert _cache(tmp_path / "r", _url(server)).get(KEY_A, "cubin") is None


def test_the_signing_key_never_appears_in_messages(server, tmp_path, monkeypatch, caplog):
    caplog.set_level(logging.DEBUG, logger="kernelcache")
    monkeypatch.setenv("KERNELCACHE_SIGNING_KEY", SECRET_1)
    cache = _cache(tmp_path / "w", _url(server))
    cache.put(KEY_A, "cubin", DATA, META)
    monkeypatch.setenv("KERNELCACHE_SIGNING_KEY", SECRET_2)
    _cache(tmp_path / "r", _url(server)).get(KEY_A, "cubin")
    text = caplog.text + repr(cache) + repr(cache.remote) + repr(kernelcache.config.settings())
    assert SECRET_1 not in text and SECRET_2 not in text


# -- what a value covers -------------------------------------------------------------------------
#: a process that puts an entry as an earlier version did (a kernelcache that knew no launch
#: fields, without the bridge): its digest covers name and target only
WRITER_WITHOUT_THE_BRIDGE = """
import json, sys
import kernelcache
from kernelcache.schema import fields
fields.COVERED.intersection_update({"name", "target"})  # what such a writer covered
url, root, key, data, meta = sys.argv[1:]
cache = kernelcache.Cache(root, readonly_roots=(), remote=url)
cache.put(key, "bin", bytes.fromhex(data), json.loads(meta))
assert "bridge" not in sys.modules
"""


def _write_without_the_bridge(url: str, root: Any, key: str, meta: dict[str, Any]) -> None:
    run_py(
        WRITER_WITHOUT_THE_BRIDGE,
        url,
        str(root),
        key,
        DATA.hex(),
        json.dumps(meta),
        KERNELCACHE_SIGNING_KEY=SECRET_1,
    )


def test_a_launch_field_its_writer_did_not_cover_is_a_miss_never_resigned(
    server, tmp_path, monkeypatch
):
    """num_warps 4 -> 32 and shared 0 -> 200000 in a value signed by a writer that did not
    cover them: the signature still holds, but a reader that requires launch fields covered
    refuses the value instead of covering them itself; nothing is published locally or
    re-signed into the tier above, and the reader's rebuild is what the tiers then hold."""
    monkeypatch.setenv("KERNELCACHE_SIGNING_KEY", SECRET_1)
    _write_without_the_bridge(_url(server), tmp_path / "w", KEY_A, META)
    r = server.client()
    name = open_remote(_url(server)).name(KEY_A)
    doc, data = _split_value(r.get(name))
    assert doc["covers"] == ["name", "target"] and doc["hmac"]
    forged = {**doc, "num_warps": 32, "shared": 200_000}
    assert check_signature(forged, hashlib.sha256(data).digest(), SECRET_1.encode()) is None
    r.set(name, _raw_value(forged, data))

    reader = _cache(tmp_path / "r", f"{_url(server, 'namespace=top')} {_url(server)}")
    assert reader.get(KEY_A, "bin") is None
    reader.remote.flush()
    assert r.keys("top:*") == [] and list((tmp_path / "r").glob("*.json")) == []
    art = reader.get_or_create(KEY_A, "bin", lambda: (data, META))
    assert art.meta["num_warps"] == 4 and {"num_warps", "shared"} <= set(art.meta["covers"])
    reader.remote.flush()  # (the tiers below the first are written in the background)
    held, _ = _split_value(r.get(name))
    assert held["num_warps"] == 4 and held["covers"] == art.meta["covers"]


def test_a_value_travels_as_written_through_a_hit_and_a_backfill(server, tmp_path, monkeypatch):
    """A value of a writer that covers less than the reader declares (and holds none of the
    fields it did not cover): served; the tier above gets the same bytes, the local root the
    same document less its signature; neither covers more than its writer did."""
    monkeypatch.setenv("KERNELCACHE_SIGNING_KEY", SECRET_1)
    low, top = _url(server, "namespace=low"), _url(server, "namespace=top")
    _write_without_the_bridge(low, tmp_path / "w", KEY_B, {"name": "k", "target": "cuda:90"})
    r = server.client()
    raw = r.get(open_remote(low).name(KEY_B))
    doc, _ = _split_value(raw)
    assert doc["covers"] == ["name", "target"]

    reader = _cache(tmp_path / "r", f"{top} {low}")
    art = reader.get(KEY_B, "bin")
    assert art is not None and art.source == "remote" and art.meta["covers"] == ["name", "target"]
    reader.remote.flush()
    assert r.get(open_remote(top).name(KEY_B)) == raw
    as_written = {name: value for name, value in doc.items() if name != "hmac"}
    assert (tmp_path / "r" / f"{KEY_B}.json").read_bytes() == encode_metadata(as_written)


@pytest.mark.parametrize("entry_digest_too", [False, True], ids=["as-is", "digest-recomputed"])
def test_a_covers_list_edited_after_signing_is_refused(
    server, tmp_path, monkeypatch, entry_digest_too
):
    """Dropping from ``covers`` a launch field the value does not hold changes no covered
    value: the entry digest and the signature cover the list itself."""
    monkeypatch.setenv("KERNELCACHE_SIGNING_KEY", SECRET_1)
    r, name, doc, data = _signed_value(server, tmp_path, "bin")
    assert "tmem_size" in doc["covers"] and "tmem_size" not in doc
    forged = {**doc, "covers": [n for n in doc["covers"] if n != "tmem_size"]}
    if entry_digest_too:
        forged["entry_digest"] = entry_digest(forged)
    r.set(name, _raw_value(forged, data))
    reader = _cache(tmp_path / "r", _url(server))
    assert reader.get(KEY_A, "bin") is None
    refused = "unauthenticated" if entry_digest_too else "rejected"
    assert reader.remote.counters.get(refused) == 1, reader.remote.counters


def test_a_value_larger_once_re_encoded_is_a_hit_never_an_exception(server, tmp_path):
    """Metadata within the size limit as the value holds it (UTF-8), beyond it as a root
    writes it (ASCII escapes): served from memory, with one warning; never an exception."""
    doc = {**make_metadata(KEY_A, "bin", DATA, META), "note": "\u00e9" * 30_000}  # not covered
    raw = json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode()
    assert len(raw) < 64 << 10 < len(json.dumps(doc))
    server.client().set(
        open_remote(_url(server)).name(KEY_A), MAGIC + struct.pack(">I", len(raw)) + raw + DATA
    )
    art = _cache(tmp_path / "r", _url(server)).get(KEY_A, "bin")
    assert art is not None and art.data == DATA and art.path is None
    assert list((tmp_path / "r").glob("*.json")) == []


# Process of a job: fetches two kernels through the remote tier of $KERNELCACHE_REMOTE, building
# (with its own bytes) what it does not find, and reports what it built.
JOB = """
import json, os, sys
import kernelcache
cache = kernelcache.Cache(sys.argv[1])
built = []
for key in sys.argv[2:]:
    def build(key=key):
        built.append(key)
        return b"\\x7fELF " + os.environ["WHO"].encode() * 200, {"name": "k", "target": "cuda:90"}
    cache.get_or_create(key, "bin", build)
print(json.dumps({"built": built, "tier": cache.remote.counters}))
"""


def test_jobs_with_another_signing_key_leave_the_values_they_cannot_verify(server, tmp_path):
    """Two real processes with different (valid) keys: the second refuses the first's values,
    rebuilds, and does not overwrite them, so the first key's next job hits; with
    KERNELCACHE_REMOTE_OVERWRITE=1 it replaces them. Counted, warned once, shown by stats."""
    import subprocess
    import sys

    from cli_support import kc
    from support import child_env

    keys = [KEY_A, KEY_B]

    def job(name: str, secret: str, **env: str) -> tuple[dict[str, Any], str]:
        root = tmp_path / name
        proc = subprocess.run(
            [sys.executable, "-c", JOB, str(root), *keys],
            env=child_env(
                KERNELCACHE_REMOTE=_url(server),
                KERNELCACHE_SIGNING_KEY=secret,
                WHO=name,
                **env,
            ),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout), proc.stderr

    first, _ = job("first", SECRET_1)
    assert first["built"] == keys
    other, stderr = job("other", SECRET_2)
    assert other["built"] == keys  # it cannot use them: it builds its own
    assert other["tier"]["kept_unverified"] == 2 and other["tier"]["unauthenticated"] >= 2
    assert "puts" not in other["tier"]  # nothing of the first key's was overwritten
    assert stderr.count("cannot verify") == 1 and "KERNELCACHE_REMOTE_OVERWRITE=1" in stderr
    again, _ = job("again", SECRET_1)
    assert again["built"] == [] and again["tier"]["hits"] == 2  # the first key's values
    doc = json.loads(kc(tmp_path / "other", "stats", "--json").stdout)
    assert doc["counters"]["kept_unverified"] == 2 and doc["counters"]["unauthenticated"] >= 2

    told, _ = job("told", SECRET_2, KERNELCACHE_REMOTE_OVERWRITE="1")
    assert told["built"] == keys and told["tier"]["overwritten"] == 2 and told["tier"]["puts"] == 2
    last, _ = job("last", SECRET_1)
    assert last["built"] == keys and last["tier"]["unauthenticated"] >= 2
