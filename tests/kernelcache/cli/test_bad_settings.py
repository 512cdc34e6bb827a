"""A setting of the jobs that cannot be used costs only the commands that use it: every command
says it (naming the variable, its value and what is accepted), and only a command that works by
it refuses to run (exit 2); ``ls`` and ``stats`` never do."""

from __future__ import annotations

import pytest
from cli_support import kc, kc_json, put

BAD = {
    "KERNELCACHE_MAX_SIZE": ("5Q", "invalid size '5Q'"),
    "KERNELCACHE_LOCK_TIMEOUT": ("abc", "invalid duration 'abc'"),
    "KERNELCACHE_DISABLE": ("maybe", "invalid boolean 'maybe'"),
    "KERNELCACHE_TRUST": ("bogus", "not one of group, owner, any"),
    "KERNELCACHE_LOCK_MODE": ("nfs", "not one of auto, flock, soft"),
    "KERNELCACHE_COMPRESSION": ("gzip", "not one of none, zstd"),
}


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("bad-settings") / "cache"
    put(root, "matmul", size=400)
    return root


@pytest.mark.parametrize("name", sorted(BAD))
@pytest.mark.parametrize("command", [["ls"], ["stats"], ["show", "matmul"], ["dir"]])
def test_ls_and_stats_say_a_bad_setting_and_run(root, name, command):
    value, wrong = BAD[name]
    if command[0] == "show":
        command = ["show", kc_json(root, "ls")["entries"][0]["key"]]
    proc = kc(root, *command, env={name: value})
    assert proc.returncode == 0, proc.stderr
    assert f"{name}='{value}': {wrong}" in proc.stderr
    assert proc.stderr.count(f"{name}='{value}'") == 1  # said once


def test_what_ls_and_stats_do_instead_is_what_a_job_does(root):
    trusting = kc_json(root, "ls", env={"KERNELCACHE_TRUST": "bogus"})  # the strictest: owner
    assert trusting["count"] == 1  # (this user's entries)
    assert kc_json(root, "stats", env={"KERNELCACHE_MAX_SIZE": "5Q"})["max_size"] is None


@pytest.mark.parametrize(
    "name, command",
    [
        ("KERNELCACHE_TRUST", ["verify"]),
        ("KERNELCACHE_TRUST", ["prune", "--older-than", "30d", "--dry-run"]),
        ("KERNELCACHE_LOCK_MODE", ["clear", "--dry-run"]),
        ("KERNELCACHE_COMPRESSION", ["import", "nosuch.tar"]),
    ],
)
def test_a_command_that_works_by_a_bad_setting_refuses_to_run(root, name, command):
    value, wrong = BAD[name]
    proc = kc(root, *command, env={name: value})
    assert proc.returncode == 2
    assert f"error: {name}='{value}': {wrong}" in proc.stderr
    assert "(fix the environment variable)" in proc.stderr


def test_a_bad_setting_no_command_uses_never_stops_the_commands(root):
    env = {"KERNELCACHE_LOCK_TIMEOUT": "abc", "KERNELCACHE_EMBED": "bogus"}
    for command in (["verify"], ["prune", "--older-than", "30d", "--dry-run"], ["config"]):
        proc = kc(root, *command, env=env)
        assert proc.returncode == 0, (command, proc.stderr)
        assert "KERNELCACHE_LOCK_TIMEOUT='abc'" in proc.stderr
