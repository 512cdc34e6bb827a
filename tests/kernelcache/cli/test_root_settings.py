"""A root's own configuration file, as ccache's: ``kernelcache -M SIZE`` and ``-o key=value``
write it (``config --set``), jobs and commands read it under the environment (which wins), and
``-p`` prints every setting with where it comes from. What the file holds that cannot be used
is said and left out; a file the trust policy does not accept is not used."""

from __future__ import annotations

import json
import logging
import os

import pytest
from cli_support import files_under, kc, kc_json, put

from kernelcache import Cache
from kernelcache.store.settings_file import NAME


def _setting(doc: dict, key: str) -> dict:
    return next(row for row in doc["settings"] if row["key"] == key)


def test_M_writes_the_roots_file_which_p_stats_and_jobs_read(tmp_path):
    root = tmp_path / "cache"
    done = kc(None, "-d", str(root), "-M", "5G")
    assert done.returncode == 0, done.stderr
    assert f"max_size = 5G in {root / NAME}" in done.stdout
    assert "max_size = 5G" in (root / NAME).read_text().splitlines()
    shown = kc(root, "-p")
    assert f"({root / NAME}) max_size = 5G" in shown.stdout.splitlines()
    assert "(default) lock_timeout = 120" in shown.stdout.splitlines()
    assert f"(--root) dir = {root}" in shown.stdout.splitlines()
    doc = kc_json(root, "-p")
    assert _setting(doc, "max_size") == {
        "key": "max_size",
        "variable": "KERNELCACHE_MAX_SIZE",
        "value": "5G",
        "default": "0",
        "origin": str(root / NAME),
        "in_file": True,
        "error": None,
    }
    stats = kc_json(root, "stats")
    assert stats["max_size"] == 5 << 30 and stats["max_size_from"] == str(root / NAME)
    assert f"max_size in {root / NAME}" in kc(root, "stats").stdout
    cache = Cache(root=root)  # a job
    assert cache.capacity is not None and cache.capacity.max_size == 5 << 30


def test_the_environment_wins_over_the_roots_file(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    assert kc(root, "-o", "max_size=5G", "-o", "lock_mode=soft").returncode == 0
    env = {"KERNELCACHE_MAX_SIZE": "1G"}
    assert kc_json(root, "stats", env=env)["max_size"] == 1 << 30
    doc = kc_json(root, "-p", env=env)
    assert _setting(doc, "max_size")["origin"] == "environment"
    assert _setting(doc, "max_size")["value"] == "1G"
    assert _setting(doc, "lock_mode")["origin"] == str(root / NAME)
    again = kc(root, "-M", "7G", env=env)
    assert again.returncode == 0
    assert "the environment's KERNELCACHE_MAX_SIZE overrides it" in again.stdout
    monkeypatch.setenv("KERNELCACHE_MAX_SIZE", "1G")
    cache = Cache(root=root)
    assert cache.capacity is not None and cache.capacity.max_size == 1 << 30
    assert cache.store._lock_mode == "soft"  # (from the file: the environment leaves it)


def test_o_sets_several_removes_with_an_empty_value_and_keeps_other_lines(tmp_path):
    root = tmp_path / "cache"
    root.mkdir()
    (root / NAME).write_text("# mine\nlock_stale = 10m\n")
    done = kc(root, "-o", "max_size=2G", "-o", "stats_log=0", "-M", "3G")
    assert done.returncode == 0, done.stderr
    lines = (root / NAME).read_text().splitlines()
    assert lines == ["# mine", "lock_stale = 10m", "max_size = 3G", "stats_log = 0"]
    assert kc(root, "-o", "max_size=", "--json").returncode == 0
    assert (root / NAME).read_text().splitlines() == ["# mine", "lock_stale = 10m", "stats_log = 0"]
    assert kc(root, "config", "--unset", "KERNELCACHE_STATS_LOG").returncode == 0
    assert (root / NAME).read_text().splitlines() == ["# mine", "lock_stale = 10m"]


@pytest.mark.parametrize(
    "given, said",
    [
        (["-o", "trust=any"], "'trust' is not a setting of a root's file"),
        (["-o", "dir=/elsewhere"], "'dir' is not a setting of a root's file"),
        (["-o", "nonsense"], "'nonsense' is not KEY=VALUE"),
        (["-M", "5Q"], "max_size='5Q'"),
        (["-o", "lock_mode=sometimes"], "not one of auto, flock, soft"),
        (["-M"], "-M takes a value, e.g. -M 50G"),
    ],
)
def test_what_a_roots_file_cannot_hold_is_refused_and_nothing_is_written(tmp_path, given, said):
    root = tmp_path / "cache"
    proc = kc(root, *given)
    assert proc.returncode == 2 and said in proc.stderr, proc.stderr
    assert files_under(root) == set()


def test_what_a_file_holds_that_cannot_be_used_is_said_and_left_out(tmp_path, caplog_warnings):
    root = tmp_path / "cache"
    put(root, "k", size=400)
    (root / NAME).write_text("max_size = 5G\ntrust = any\nthis is no setting\nlock_timeout = x\n")
    cache = Cache(root=root)
    assert cache.capacity is not None and cache.capacity.max_size == 5 << 30
    assert cache.store.trust == "group"  # never from a root's file
    said = caplog_warnings.text
    assert f"{root / NAME}:2: 'trust' is not a setting of a root's file" in said
    assert f"{root / NAME}:3: 'this is no setting' is not KEY = VALUE" in said
    assert f"lock_timeout='x' in {root / NAME}: invalid duration" in said
    assert cache.lock_timeout == 120.0
    listed = kc(root, "ls")  # a command that does not use them: said, and it runs
    assert listed.returncode == 0 and "1 kernel" in listed.stdout
    assert f"{root / NAME}:2: 'trust' is not a setting" in listed.stderr
    doc = kc_json(root, "-p")
    assert _setting(doc, "lock_timeout")["error"].startswith("lock_timeout='x' in")
    assert len(doc["problems"]) == 2
    assert kc_json(root, "verify")["problems"] == []  # the file is the root's: not foreign


def test_a_file_the_trust_policy_refuses_is_not_used(tmp_path, caplog_warnings):
    root = tmp_path / "cache"
    root.mkdir()
    (root / NAME).write_text("max_size = 1K\n")
    os.chmod(root / NAME, 0o666)  # anyone may write it
    cache = Cache(root=root)
    assert cache.capacity is None
    assert (
        f"{root / NAME}: its owner (uid {os.getuid()}) or mode is not one" in caplog_warnings.text
    )
    os.chmod(root / NAME, 0o644)
    assert kc_json(root, "stats")["max_size"] == 1024


def test_a_root_file_that_is_a_link_or_too_large_is_not_read(tmp_path, caplog_warnings):
    root = tmp_path / "cache"
    root.mkdir()
    (tmp_path / "elsewhere").write_text("max_size = 1K\n")
    (root / NAME).symlink_to(tmp_path / "elsewhere")
    caplog_warnings.set_level(logging.WARNING)
    assert Cache(root=root).capacity is None
    (root / NAME).unlink()
    (root / NAME).write_text("max_size = 1K\n" + "#" * (64 << 10))
    assert Cache(root=root).capacity is None
    assert "is larger than 65,536 bytes: not used" in caplog_warnings.text


def test_doctor_checks_each_value_of_the_roots_file(tmp_path):
    """doctor says of the root's file what a job would do with it: each value usable or not
    (one the environment overrides, said so), each line it leaves out."""
    root = tmp_path / "cache"
    root.mkdir()
    (root / NAME).write_text("max_size = 5G\nlock_timeout = x\nthis is no setting\n")
    proc = kc(root, "doctor", "--json", env={"KERNELCACHE_MAX_SIZE": "1G"})
    assert proc.returncode == 1  # (a value that cannot be used fails)
    checks = {c["name"]: c for c in json.loads(proc.stdout)["checks"]}
    path = str(root / NAME)
    assert checks[f"max_size ({path})"] == {
        "name": f"max_size ({path})",
        "status": "ok",
        "detail": "5G: overridden by the environment's KERNELCACHE_MAX_SIZE",
    }
    timeout = checks[f"lock_timeout ({path})"]
    assert timeout["status"] == "fail" and "invalid duration 'x'" in timeout["detail"]
    assert "kernelcache -o lock_timeout=" in timeout["detail"]
    assert (
        checks[path]["status"] == "warn"
        and "'this is no setting' is not KEY = VALUE" in (checks[path]["detail"])
    )
    (root / NAME).write_text("max_size = 5G\n")
    checks = {c["name"]: c for c in json.loads(kc(root, "doctor", "--json").stdout)["checks"]}
    assert checks[f"max_size ({path})"]["detail"] == "5G"
