"""A root named in ``KERNELCACHE_READONLY_DIRS`` (a layer baked into an image) is never removed
from, even by a user who could write it: every command that deletes (``prune``, ``clear``,
``verify --repair``, ``stats --zero``; ``jax-cache`` in the bridge's tests) refuses it, naming
it, and changes nothing; looking (``--dry-run``) is no deleting."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from cli_support import backdate, files_under, kc, kc_json, put


def _layer(root: Path) -> None:
    """Fourteen entries (one corrupt), a stale staging file, an old quarantined file and a
    statistics summary: something for each deleting command to remove."""
    for i in range(13):
        put(root, "filler", size=1000 + i)
    bad = put(root, "bad", size=300)
    Path(bad.path).write_bytes(b"\0" * 300)  # same size, wrong digest
    for directory, name in ((".tmp", "dead.tmp"), (".quarantine", "old.cubin")):
        (root / directory).mkdir(exist_ok=True)
        (root / directory / name).write_bytes(b"x")
        backdate(root / directory / name, time.time() - 30 * 86400)
    (root / ".stats").mkdir(exist_ok=True)
    (root / ".stats" / "summary.json").write_text("{}")


@pytest.mark.parametrize(
    "args",
    [
        ["prune", "--max-size", "10K"],
        ["prune", "--older-than", "0s", "--yes"],
        ["prune", "--quarantine-age", "0s"],
        ["verify", "--repair"],
        ["stats", "--zero"],
        ["clear", "--yes"],
    ],
    ids=lambda a: " ".join(a),
)
def test_every_deleting_command_refuses_a_root_named_read_only(tmp_path, args):
    root = tmp_path / "image"
    _layer(root)
    kc_json(root, "ls")  # (a scan writes its index under .stats/ first)
    before = files_under(root)
    # named among others, with a trailing slash: the same directory
    env = {"KERNELCACHE_READONLY_DIRS": f"{tmp_path / 'other'}:{root}/"}
    proc = kc(root, *args, env=env)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    said = " ".join(proc.stderr.split())
    assert f"{root} is a read-only root (KERNELCACHE_READONLY_DIRS)" in said, said
    assert "nothing was changed" in said
    assert files_under(root) == before
    plan = kc_json(root, "prune", "--max-size", "10K", "--dry-run", env=env)
    assert plan["plan"]["summary"]["delete-entry"]["count"] >= 1
    assert files_under(root) == before
