"""The remote tier without a server: URL options, redaction, the value format, lazy import."""

from __future__ import annotations

import struct
import sys

import pytest

import kernelcache
from kernelcache.errors import ConfigError
from kernelcache.problem import Problem
from kernelcache.remote import (
    MAGIC,
    OPTIONS,
    RedisTier,
    decode_value,
    encode_value,
    open_remote,
    parse_url,
    redact,
)
from kernelcache.store import digest, make_metadata
from kernelcache.units import parse_duration, parse_size

KEY = "0123456789abcdef" * 2
SECRET = "hunter2-S3cr3t"


def entry(key: str = KEY, data: bytes = b"\x7fELF cubin bytes", ext: str = "bin") -> bytes:
    return encode_value(make_metadata(key, ext, data, {"name": "add_kernel"}), data)


def test_defaults() -> None:
    address, opts = parse_url("redis://cachehost:6379/2")
    assert address == "redis://cachehost:6379/2"
    assert (opts.timeout, opts.connect_timeout, opts.ttl) == (0.5, None, 0.0)
    assert (opts.namespace, opts.max_size, opts.breaker, opts.lock_ttl) == (
        "kc",
        64 << 20,
        30.0,
        120.0,
    )
    assert opts.prefix == "kc:v4:"


def test_options_are_parsed_and_stripped_from_the_address() -> None:
    address, opts = parse_url(
        "redis://:pw@h:1/0?timeout=250ms&connect_timeout=2&ttl=7d&namespace=job-42"
        "&max_size=512K&breaker=1m&lock_ttl=90s"
    )
    assert address == "redis://:pw@h:1/0"
    assert opts.timeout == 0.25 and opts.connect_timeout == 2.0
    assert opts.ttl == 7 * 86400 and opts.breaker == 60.0 and opts.lock_ttl == 90.0
    assert opts.namespace == "job-42" and opts.prefix == "job-42:v4:"
    assert opts.max_size == 512 * 1024


def test_tls_options_pass_through() -> None:
    address, opts = parse_url(
        "rediss://h:6380/0?ssl_ca_certs=/etc/ca.pem&ssl_cert_reqs=required&ssl_check_hostname=no"
    )
    assert address == "rediss://h:6380/0"
    assert dict(opts.client) == {
        "ssl_ca_certs": "/etc/ca.pem",
        "ssl_cert_reqs": "required",
        "ssl_check_hostname": False,
    }


def test_unix_socket_url() -> None:
    address, opts = parse_url("unix:///run/redis.sock?db=3&timeout=1")
    assert address == "unix:///run/redis.sock"
    assert dict(opts.client) == {"db": 3} and opts.timeout == 1.0


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("0.5", 0.5), ("500ms", 0.5), ("30s", 30), ("10m", 600), ("12h", 43200), ("2w", 1209600)],
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize(
    ("text", "size"), [("65536", 65536), ("512K", 512 << 10), ("64M", 64 << 20), ("1GiB", 1 << 30)]
)
def test_sizes(text: str, size: int) -> None:
    assert parse_size(text) == size


def test_unknown_option_lists_the_valid_ones_without_the_password() -> None:
    with pytest.raises(ConfigError) as info:
        parse_url(f"redis://:{SECRET}@h:6379/0?timeout=1&tiemout=2")
    message = str(info.value)
    assert "unknown option 'tiemout'" in message
    for name in [*OPTIONS, "ssl_ca_certs"]:
        assert name in message
    assert SECRET not in message and "***" in message


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("http://h:6379/0", "unsupported scheme 'http'"),
        ("redis://:6379/0", "names no host"),
        ("redis://h:6379/zero", "database number"),
        ("redis://h:port/0", "malformed"),
        ("redis://h/0?timeout=fast", "option timeout='fast'"),
        ("redis://h/0?timeout=0", "timeout must be more than 0"),
        ("redis://h/0?max_size=1T", "max_size must be"),
        ("redis://h/0?namespace=a%20b", "namespace must be"),
        ("redis://h/0?ttl=1&ttl=2", "sets option 'ttl' twice"),
        ("redis://h/0?ssl_ca_certs=/ca.pem", "ssl_* options need a rediss:// URL"),
        ("redis://h/0?db=1", "give the database as the path"),
        ("rediss://h/0?ssl_cert_reqs=maybe", "expected none, optional or required"),
    ],
)
def test_bad_urls_are_clear_config_errors(url: str, expected: str) -> None:
    with pytest.raises(ConfigError, match=None) as info:
        parse_url(url)
    assert expected in str(info.value)


def test_redaction_hides_passwords_and_secret_options() -> None:
    url = f"rediss://alice:{SECRET}@h:6380/0?ssl_password={SECRET}x&timeout=1"
    shown = redact(url)
    assert SECRET not in shown
    assert shown.startswith("rediss://alice:***@h:6380/0?")
    assert "ssl_password=***" in shown and "timeout=1" in shown
    tier = open_remote(url)
    assert SECRET not in repr(tier) and SECRET not in str(tier)
    with pytest.raises(ConfigError) as info:
        parse_url(f"rediss://:{SECRET}@h/0?ssl_password={SECRET}&ssl_cert_reqs=bad")
    assert SECRET not in str(info.value)


def test_cache_reads_the_url_from_the_environment(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("KERNELCACHE_REMOTE", f"redis://:{SECRET}@127.0.0.1:1/0?timeout=0.2")
    cache = kernelcache.Cache(tmp_path, readonly_roots=[])
    assert isinstance(cache.remote, RedisTier)
    assert cache.remote.options.timeout == 0.2
    assert SECRET not in repr(cache)


def test_missing_redis_client_says_what_to_install(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "redis", None)
    with pytest.raises(ConfigError, match=r"pip install 'kernelcache\[redis\]'"):
        open_remote("redis://127.0.0.1:6379/0")


def test_value_round_trip() -> None:
    data = bytes(range(256)) * 10
    found = decode_value(entry(data=data), KEY)
    assert not isinstance(found, Problem)
    got, meta = found
    assert got == data
    assert meta["key"] == KEY and meta["ext"] == "bin" and meta["name"] == "add_kernel"
    assert meta["size"] == len(data) and meta["digest"] == digest(data)


def _with_meta(doc: dict, data: bytes) -> bytes:
    return encode_value(doc, data)


def _garbage() -> dict[str, bytes]:
    good = entry()
    data = b"\x7fELF cubin bytes"
    doc = make_metadata(KEY, "bin", data, {})
    (meta_len,) = struct.unpack_from(">I", good, 4)
    return {
        "empty": b"",
        "short header": MAGIC[:3],
        "wrong magic": b"KCR9" + good[4:],
        "text": b"hello world, not an entry",
        "metadata length past the end": good[:4] + struct.pack(">I", len(good)) + good[8:],
        "truncated artifact": good[:-1],
        "extra bytes": good + b"\0",
        "flipped artifact byte": good[:-1] + bytes([good[-1] ^ 1]),
        "metadata not json": good[:8] + b"{" * meta_len + good[8 + meta_len :],
        "metadata of another key": _with_meta({**doc, "key": "f" * 32}, data),
        "unknown format": _with_meta({**doc, "format": 99}, data),
        "wrong digest": _with_meta({**doc, "digest": digest(b"other")}, data),
        "bad ext": _with_meta({**doc, "ext": "../x"}, data),
    }


@pytest.mark.parametrize("name", sorted(_garbage()))
def test_garbage_values_are_rejected(name: str) -> None:
    assert isinstance(decode_value(_garbage()[name], KEY), Problem)


@pytest.mark.parametrize("call", ["get", "put", "acquire"])
def test_malformed_keys_are_value_errors_before_any_connection(call: str) -> None:
    tier = open_remote("redis://127.0.0.1:1/0")
    args = {"get": ("../x", "bin"), "put": ("../x", "bin", b"", {}), "acquire": ("KEY", 1)}
    with pytest.raises(ValueError, match="invalid cache key"):
        getattr(tier, call)(*args[call])
    with pytest.raises(ValueError, match="invalid artifact extension"):
        tier.get(KEY, ".bin")
    assert tier.counters == {}


class _Tier:
    """A tier object of a test: misses, stores nothing, has no locks."""

    def get(self, key, ext):
        return None

    def put(self, key, ext, data, meta):
        return False

    def acquire(self, key, timeout):
        return lambda: None


def test_a_list_of_urls_and_tiers_is_one_layered_tier(tmp_path, monkeypatch):
    from kernelcache.remote import LayeredTier, ObjectStoreTier, check_url

    pytest.importorskip("obstore")
    mine = _Tier()
    cache = kernelcache.Cache(tmp_path, (), ["redis://127.0.0.1:1/0", mine])
    assert isinstance(cache.remote, LayeredTier) and cache.remote.tiers[1] is mine
    spec = f"redis://:{SECRET}@127.0.0.1:1/0 \n\t s3://bucket/kc?read_only=1"
    monkeypatch.setenv("KERNELCACHE_REMOTE", spec)
    layered = kernelcache.Cache(tmp_path).remote
    assert [type(t) for t in layered.tiers] == [RedisTier, ObjectStoreTier]
    assert layered.tiers[1].read_only and SECRET not in repr(layered)
    check_url(spec)
    with pytest.raises(ConfigError, match="unknown option 'nope'"):
        check_url(f"{spec} s3://b/p?nope=1")
    assert kernelcache.Cache(tmp_path, (), "  ").remote is None


def test_doctor_shows_every_url_of_the_list_without_passwords(monkeypatch):
    from kernelcache.doctor import setting_checks

    spec = f"redis://:{SECRET}@h:6379/0 redis+cluster://:{SECRET}@a:7000,b:7001"
    monkeypatch.setenv("KERNELCACHE_REMOTE", spec)
    checks, _ = setting_checks()
    remote = next(c for c in checks if c.name == "KERNELCACHE_REMOTE")
    assert remote.status == "ok", remote
    assert SECRET not in remote.detail and "redis+cluster://:***@a:7000,b:7001" in remote.detail
