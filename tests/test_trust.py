"""The trust policy: an artifact is code for the GPU; only trusted users' files are served."""

from __future__ import annotations

import os

import pytest
from conftest import IS_ROOT, key_of

import kernelcache
from kernelcache.store import Problem, Store

NOBODY = 65534

pytestmark = pytest.mark.skipif(not IS_ROOT, reason="needs root to create files of another user")


def _entry_owned_by(root, key: str, uid: int, gid: int) -> None:
    Store(root).put(key, "bin", b"someone else's code", {})
    for name in (f"{key}.bin", f"{key}.json"):
        os.chown(root / name, uid, gid)


@pytest.fixture
def shared_root(tmp_path):
    root = tmp_path / "shared"
    root.mkdir()
    os.chown(root, 0, 0)  # owner root, group root: user 65534 is neither
    return root


def test_untrusted_user_is_refused_and_replaced(shared_root, caplog_warnings):
    key = key_of("untrusted")
    _entry_owned_by(shared_root, key, NOBODY, NOBODY)
    cache = kernelcache.Cache(shared_root, readonly_roots=())
    before = kernelcache.process_stats()
    assert cache.get(key, "bin") is None
    result = cache.store.read(key, "bin")
    assert isinstance(result, Problem) and result.untrusted and not result.corrupt
    messages = [r.getMessage() for r in caplog_warnings.records]
    assert sum("refusing artifacts" in m and str(NOBODY) in m for m in messages) == 1
    art = cache.get_or_create(key, "bin", lambda: (b"our build", {}))
    assert art.data == b"our build" and os.stat(art.path).st_uid == os.geteuid()
    after = kernelcache.process_stats()
    # the get, then get_or_create's lookup and its re-check under the build lock
    assert after["untrusted"] - before["untrusted"] == 3
    assert after["corrupt"] == before["corrupt"]


def test_group_member_is_trusted_under_group_policy(shared_root):
    os.chown(shared_root, 0, NOBODY)  # the root directory's group is user 65534's primary group
    key = key_of("group-member")
    _entry_owned_by(shared_root, key, NOBODY, NOBODY)
    assert (
        kernelcache.Cache(shared_root, readonly_roots=()).get(key, "bin").data
        == b"someone else's code"
    )


def test_owner_policy_refuses_group_members(shared_root, monkeypatch):
    os.chown(shared_root, 0, NOBODY)
    monkeypatch.setenv("KERNELCACHE_TRUST", "owner")
    key = key_of("owner-policy")
    _entry_owned_by(shared_root, key, NOBODY, NOBODY)
    assert kernelcache.Cache(shared_root, readonly_roots=()).get(key, "bin") is None


def test_root_directory_owner_is_trusted(shared_root, monkeypatch):
    os.chown(shared_root, NOBODY, 0)
    monkeypatch.setenv("KERNELCACHE_TRUST", "owner")
    key = key_of("dir-owner")
    _entry_owned_by(shared_root, key, NOBODY, NOBODY)
    assert kernelcache.Cache(shared_root, readonly_roots=()).get(key, "bin") is not None


def test_any_policy_serves_everyone(shared_root, monkeypatch):
    monkeypatch.setenv("KERNELCACHE_TRUST", "any")
    key = key_of("any")
    _entry_owned_by(shared_root, key, NOBODY, NOBODY)
    assert kernelcache.Cache(shared_root, readonly_roots=()).get(key, "bin") is not None


def test_untrusted_entry_in_readonly_root_is_skipped(tmp_path):
    image = tmp_path / "image"
    image.mkdir()
    key = key_of("ro-untrusted")
    _entry_owned_by(image, key, NOBODY, NOBODY)
    cache = kernelcache.Cache(tmp_path / "local", readonly_roots=[image])
    assert cache.get(key, "bin") is None
    assert (image / f"{key}.bin").stat().st_uid == NOBODY  # left alone


def test_bad_policy_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("KERNELCACHE_TRUST", "everyone")
    with pytest.raises(kernelcache.ConfigError, match="KERNELCACHE_TRUST"):
        kernelcache.Cache(tmp_path)
