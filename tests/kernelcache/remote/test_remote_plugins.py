"""Remote tiers by URL scheme: a tier from an installed package (entry-point group
``kernelcache.remotes``) is opened, written and read like the Redis tier; an unknown scheme is a
clear error; a broken plugin costs the job its remote tier, never the job."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest
from cli_support import kc_json
from support import REPO, key_of, run_py

import kernelcache
from kernelcache.errors import ConfigError
from kernelcache.remote import GROUP, MAGIC, check_url, make_value, open_remote
from kernelcache.remote.codec import inflate_value

# A tier that keeps each value in a file of a directory: fake:///path/to/dir. It stores and
# checks values with the codec every tier shares, and logs how it was made.
FAKE_TIER = """
import json
from pathlib import Path
from urllib.parse import urlsplit

from kernelcache.errors import ConfigError
from kernelcache.problem import Problem
from kernelcache.remote import authenticate, decode_value, make_value


class DirTier:
    def __init__(self, url, *, stats_root=None, signing_key=None):
        self.dir = Path(urlsplit(url).path)
        if not self.dir.is_dir():
            raise ConfigError(f"fake URL {url!r}: no such directory")
        self.signing_key = signing_key
        made = {"stats_root": stats_root, "signed": signing_key is not None}
        with open(self.dir / "made.jsonl", "a") as log:
            log.write(json.dumps(made) + "\\n")

    def get(self, key, ext):
        try:
            raw = (self.dir / key).read_bytes()
        except FileNotFoundError:
            return None
        found = decode_value(raw, key)
        if isinstance(found, Problem) or found[1]["ext"] != ext:
            return None
        if self.signing_key is not None and authenticate(key, *found, self.signing_key):
            return None
        return found

    def put(self, key, ext, data, meta):
        (self.dir / key).write_bytes(make_value(key, ext, data, meta, self.signing_key))
        return True

    def acquire(self, key, timeout):
        return lambda: None
"""


def install(site: Path, name: str, scheme: str, module: str, source: str, attr: str) -> None:
    """An installed distribution on ``site`` whose entry point adds the remote ``scheme``."""
    info = site / f"{name}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[{GROUP}]\n{scheme} = {module}:{attr}\n")
    (site / f"{module}.py").write_text(source)


@pytest.fixture
def site(tmp_path: Path) -> Path:
    """A site directory with two plugins: fake:// (a working tier) and broken:// (its module
    fails to import)."""
    site = tmp_path / "site"
    install(site, "fake-remote", "fake", "fake_remote", FAKE_TIER, "DirTier")
    install(site, "broken-remote", "broken", "broken_remote", "raise RuntimeError('boom')\n", "T")
    return site


def with_site(site: Path, **env: str) -> dict[str, str]:
    """Variables for a child process that sees the plugins on ``site``."""
    return {"PYTHONPATH": os.pathsep.join([str(site), str(REPO)]), **env}


SHARE = """
import json, sys
import kernelcache
key, unsigned, a_root, b_root = sys.argv[1:5]
data = b"\\x7fELF" + bytes(range(256))
a = kernelcache.Cache(a_root, readonly_roots=[])
a.put(key, "bin", data, {"name": "add_kernel", "target": "cuda:90", "num_warps": 4})
b = kernelcache.Cache(b_root, readonly_roots=[])
got = b.get(key, "bin")
print(json.dumps({
    "tier": type(a.remote).__name__,
    "roots": [a.root, b.root],
    "source": got.source,
    "same": got.data == data,
    "unsigned": b.get(unsigned, "bin") is not None,
    "stats": kernelcache.process_stats(),
}))
"""


def test_a_scheme_from_an_installed_package_is_a_remote_tier(tmp_path, site):
    values = tmp_path / "values"
    values.mkdir()
    key, unsigned = key_of("shared"), key_of("unsigned")
    data = b"unsigned bytes"
    (values / unsigned).write_bytes(make_value(unsigned, "bin", data, {"name": "k"}, None))
    env = with_site(
        site,
        KERNELCACHE_REMOTE=f"fake://{values}",
        KERNELCACHE_SIGNING_KEY="team-a-signing-key-0123456789",
    )
    a_root, b_root = tmp_path / "a", tmp_path / "b"
    proc = run_py(SHARE, key, unsigned, str(a_root), str(b_root), **env)
    out = json.loads(proc.stdout)
    assert out["tier"] == "DirTier"
    # the put reached the tier, as a value of the shared format, signed
    stored = inflate_value((values / key).read_bytes())  # (compressed where that is smaller)
    assert isinstance(stored, bytes) and stored.startswith(MAGIC)
    assert b'"hmac":"hmac-sha256:' in stored
    # the second cache, on an empty root, got the entry from the tier and published it
    assert out["source"] == "remote" and out["same"]
    assert (b_root / f"{key}.bin").is_file()
    assert out["stats"]["remote_puts"] == 1 and out["stats"]["remote_hits"] == 1
    # a value not signed with the job's key is not served
    assert not out["unsigned"]
    # each cache made its tier with its own root for the counters, and the signing key
    made = [json.loads(line) for line in (values / "made.jsonl").read_text().splitlines()]
    assert made == [{"stats_root": root, "signed": True} for root in out["roots"]]


def test_doctor_checks_a_plugin_url_through_the_registry(tmp_path, site):
    values = tmp_path / "values"
    values.mkdir()
    cases = {
        f"fake://{values}": "ok",
        f"fake://{tmp_path / 'absent'}": "no such directory",
        "broken://x": "boom",
        "nope://h": "unsupported scheme 'nope'",
    }
    for url, expected in cases.items():
        env = with_site(site, KERNELCACHE_REMOTE=url)
        doc = kc_json(tmp_path / "cache", "doctor", code=0 if expected == "ok" else 1, env=env)
        (check,) = [c for c in doc["checks"] if c["name"] == "KERNELCACHE_REMOTE"]
        assert check["status"] == ("ok" if expected == "ok" else "fail"), check
        assert expected == "ok" or expected in check["detail"], check


def test_an_unknown_scheme_names_the_known_ones_and_the_entry_point_group(tmp_path):
    with pytest.raises(ConfigError) as info:
        kernelcache.Cache(tmp_path, readonly_roots=[], remote="nope://:pw@h/x")
    message = str(info.value)
    assert "unsupported scheme 'nope'" in message
    assert "known schemes: redis, rediss, unix" in message and GROUP in message
    assert "pw" not in message
    with pytest.raises(ConfigError, match="unsupported scheme 'nope'"):
        check_url("nope://h/x")


def test_installed_schemes_are_listed_in_the_error(tmp_path, site):
    code = """
    from kernelcache.remote import open_remote
    try:
        open_remote("nope://h")
    except ValueError as e:
        print(e)
    """
    proc = run_py(code, **with_site(site))
    known = "redis, rediss, unix, redis+cluster, rediss+cluster, s3, gs, broken, fake "
    assert f"known schemes: {known}" in proc.stdout


BROKEN = """
import sys
import kernelcache
caches = [kernelcache.Cache(root, readonly_roots=[]) for root in sys.argv[1:3]]
assert all(cache.remote is None for cache in caches)
for cache in caches:
    art = cache.get_or_create(sys.argv[3], "bin", lambda: (b"bin", {"name": "k"}))
    assert art.data == b"bin" and art.path is not None
print(art.source)
"""


def test_a_broken_plugin_warns_once_and_the_job_goes_on_without_a_remote_tier(tmp_path, site):
    env = with_site(site, KERNELCACHE_REMOTE="broken://:hunter2@x")
    args = [str(tmp_path / "a"), str(tmp_path / "b"), key_of("broken")]
    proc = run_py(BROKEN, *args, **env)
    assert proc.stdout.split() == ["local"]
    assert proc.stderr.count("boom") == 1, proc.stderr
    assert "broken_remote:T" in proc.stderr and GROUP in proc.stderr
    assert "continuing without a remote tier" in proc.stderr
    assert "hunter2" not in proc.stderr


def test_the_cache_imports_the_interface_not_the_redis_tier(tmp_path):
    code = """
    import sys
    import kernelcache
    kernelcache.Cache(sys.argv[1], readonly_roots=[], remote="")
    assert "kernelcache.remote.redis" not in sys.modules and "redis" not in sys.modules
    import kernelcache.remote
    assert kernelcache.RemoteTier is kernelcache.remote.RemoteTier
    assert kernelcache.remote.RedisTier.__module__ == "kernelcache.remote.redis"
    print("ok")
    """
    assert run_py(code, str(tmp_path / "cache")).stdout.split() == ["ok"]


def test_redis_schemes_are_built_in(tmp_path):
    for url in ("redis://h:6379/0", "rediss://h/0", "unix:///run/redis.sock?db=1"):
        check_url(url)
        assert type(open_remote(url)).__name__ == "RedisTier"


def test_a_factory_works_as_a_class_and_what_it_makes_must_be_a_tier(
    tmp_path, site, monkeypatch, caplog
):
    """A factory function works as a class does; what it makes must have get, put and
    acquire; a URL the plugin refuses is the plugin's ConfigError."""
    install(
        site,
        "hollow-remote",
        "hollow",
        "hollow_remote",
        "from fake_remote import DirTier\n"
        "def make(url, *, stats_root=None, signing_key=None):\n"
        "    return DirTier(url) if 'good' in url else object()\n",
        "make",
    )
    monkeypatch.syspath_prepend(str(site))
    (tmp_path / "good").mkdir()
    tier = open_remote(f"hollow://{tmp_path / 'good'}")
    assert type(tier).__name__ == "DirTier"
    caplog.set_level(logging.WARNING, logger="kernelcache.remote")
    assert open_remote("hollow://x") is None and open_remote("hollow://y") is None
    warned = [r.getMessage() for r in caplog.records if "hollow" in r.getMessage()]
    assert len(warned) == 1 and "lacks get, put or acquire" in warned[0], warned
    with pytest.raises(ConfigError, match="no such directory"):
        kernelcache.Cache(tmp_path / "cache", readonly_roots=[], remote=f"fake://{tmp_path}/no")


def test_a_plugin_is_imported_only_when_its_scheme_is_used(tmp_path, site):
    code = """
    import sys
    import kernelcache
    kernelcache.Cache(sys.argv[1], readonly_roots=[], remote="redis://h:6379/0")
    assert "fake_remote" not in sys.modules and "broken_remote" not in sys.modules
    print("ok")
    """
    assert run_py(code, str(tmp_path / "cache"), **with_site(site)).stdout.split() == ["ok"]
