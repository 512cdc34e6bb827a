"""A node that cannot write its local root (a full disk) still shares what it builds: its
entries go to the remote tier (a real redis-server) although the local put fails, and it serves
them from memory; the other nodes read them instead of building them again.

The full disk is a small tmpfs, filled, mounted on the node's root in a private mount namespace
(where the system allows one); the same path is also taken by a process whose files may not
grow past 1 KiB (``RLIMIT_FSIZE``: writes fail with EFBIG), which needs no privilege."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest
from redis_server import REDIS_SERVER, SKIP_REASON, RedisServer
from remote_job import run_job
from remote_workers import key_of
from support import CAN_UNSHARE

pytestmark = pytest.mark.skipif(REDIS_SERVER is None, reason=SKIP_REASON)

# Runs the rest of its command line with files limited to 1 KiB (SIGXFSZ ignored: a write past
# the limit fails with EFBIG instead of killing the process); the artifacts are 2 KiB.
SMALL_FILES = textwrap.dedent(
    """
    import os, resource, signal, sys
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1024, 1024))
    os.execv(sys.argv[1], sys.argv[1:])
    """
)


def full_disk(root: Path, how: str) -> list[str]:
    """A command line that runs the rest of it where ``root`` cannot be written."""
    root.mkdir(parents=True)
    if how == "tmpfs":
        fill = f"head -c 1048576 /dev/zero > {root}/filler 2>/dev/null"
        script = f'mount -t tmpfs -o size=64k tmpfs {root} && {{ {fill}; exec "$@"; }}'
        return ["unshare", "-rm", "sh", "-c", script, "sh"]
    return [sys.executable, "-c", SMALL_FILES]


@pytest.mark.parametrize(
    "how",
    [
        pytest.param(
            "tmpfs",
            marks=pytest.mark.skipif(
                not CAN_UNSHARE, reason="mounting a tmpfs needs a private mount namespace"
            ),
        ),
        "file-size-limit",
    ],
)
def test_a_node_that_cannot_write_locally_still_publishes_to_the_tier(tmp_path, how):
    """The local put raised before the remote put: the full node built keys and shared none,
    so the other nodes built them again."""
    keys = [key_of(700 + i) for i in range(6)]
    with RedisServer(tmp_path / "redis") as server:
        wrap = {0: full_disk(tmp_path / "job" / "node0", how)}
        job = run_job(server.url, tmp_path / "job", keys, nodes=3, per_node=1, wrap=wrap)
    assert job.builds == dict.fromkeys(keys, 1), job.builds
    full = next(r for r in job.results if r["node"] == 0)
    assert full["built"], "the full node built nothing: the test shows nothing"
    assert set(full["sources"].values()) <= {"memory", "remote"}, full["sources"]
    assert full["stats"]["remote_puts"] == len(full["built"]) and full["stats"]["errors"] > 0
    others = [r for r in job.results if r["node"] != 0]
    for key in full["built"]:
        assert {r["sources"][key] for r in others} == {"remote"}, key
    assert not list((tmp_path / "job" / "node0").glob("*.bin"))
