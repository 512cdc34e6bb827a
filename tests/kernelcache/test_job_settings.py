"""Settings in a user's job: a variable that cannot be used costs only itself (said once,
naming it), and a ``KERNELCACHE_*`` name nothing declares is said once too."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from support import run_py

import kernelcache
from kernelcache.config import job_settings


def _said(caplog, name: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if name in r.getMessage()]


def test_a_bad_size_cap_costs_only_the_cap(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="kernelcache")
    env = {
        "KERNELCACHE_DIR": str(tmp_path / "root"),
        "KERNELCACHE_MAX_SIZE": "banana",
        "KERNELCACHE_LOCK_MODE": "soft",
        "KERNELCACHE_LOCK_TIMEOUT": "7",
    }
    for _ in range(2):
        cfg = job_settings(env)
    assert cfg.root == tmp_path / "root" and cfg.lock_mode == "soft" and cfg.lock_timeout == 7
    assert cfg.max_size == 0 and cfg.disable is False  # no cap, and the cache on
    (said,) = _said(caplog, "KERNELCACHE_MAX_SIZE")
    assert "'banana'" in said and "its default (0) is used" in said and "doctor" in said


def test_a_job_with_a_bad_cap_still_caches(monkeypatch, tmp_path):
    monkeypatch.setenv("KERNELCACHE_MAX_SIZE", "banana")
    cache = kernelcache.Cache(tmp_path / "root")
    art = cache.get_or_create("ab" * 32, "bin", lambda: (b"built", {}))
    assert art.path is not None and Path(art.path).read_bytes() == b"built"
    assert kernelcache.Cache(tmp_path / "root").get("ab" * 32, "bin") is not None


@pytest.mark.parametrize(
    "name, value, field, instead, said",
    [
        ("KERNELCACHE_DIR", "~no-such-user-here/kc", "disable", True, "the cache is off"),
        ("KERNELCACHE_DISABLE", "perhaps", "disable", True, "the cache is off"),
        ("KERNELCACHE_TRUST", "everyone", "trust", "owner", "the strictest policy, owner"),
        ("KERNELCACHE_SIGNING_KEY", "  ", "remote", None, "the remote tier is off"),
        ("KERNELCACHE_SIGNING_KEY_FILE", " ", "remote", None, "the remote tier is off"),
    ],
)
def test_what_a_job_does_instead_is_never_less_safe(name, value, field, instead, said, caplog):
    """A root, a switch, a policy or a key that cannot be read: the cache off, the strictest
    policy, or no remote tier (never unsigned values); the other settings stay."""
    caplog.set_level(logging.WARNING, logger="kernelcache")
    env = {name: value, "KERNELCACHE_REMOTE": "redis://h:1/0", "KERNELCACHE_LOCK_MODE": "soft"}
    cfg = job_settings(env)
    assert getattr(cfg, field) == instead and cfg.lock_mode == "soft"
    if field != "remote":
        assert cfg.remote == "redis://h:1/0"
    (message,) = _said(caplog, name)
    assert said in message


def test_a_misspelt_variable_is_said_once_in_a_job(tmp_path):
    """KERNELCACHE_DIRR would leave the root at its default without a word; a bridge variable
    is known even in a job that never imported the bridge."""
    code = """
        import kernelcache
        for _ in range(3):
            kernelcache.Cache(None).get("ab" * 32, "bin")
        print("ok")
    """
    out = run_py(
        code,
        KERNELCACHE_DIRR=str(tmp_path / "x"),
        KERNELCACHE_DIR=str(tmp_path / "root"),
        KERNELCACHE_EMBED="ptx",
        KERNELCACHE_RECORD=str(tmp_path / "m.jsonl"),
    )
    said = [line for line in out.stderr.splitlines() if "not a kernelcache variable" in line]
    assert said == [
        "kernelcache: KERNELCACHE_DIRR is not a kernelcache variable: ignored "
        "(did you mean KERNELCACHE_DIR?)"
    ], out.stderr


def test_a_job_with_every_variable_known_says_nothing(tmp_path):
    out = run_py(
        "import kernelcache; kernelcache.Cache(None); print('ok')",
        KERNELCACHE_DIR=str(tmp_path / "root"),
        KERNELCACHE_TARGET="cuda:90",
    )
    assert "kernelcache" not in out.stderr, out.stderr
