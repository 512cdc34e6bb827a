"""Every command on a root that cannot be written: a read-only bind mount (which stops root
too), and a root owned by another user for an unprivileged user. Reading commands work; writing
commands fail with a clear message and change nothing. A root this user cannot read is an
error naming it, never an empty cache."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_support import KERNELCACHE, backdate, files_under, put
from support import CAN_DROP_PRIVILEGES, CAN_UNSHARE, child_env, other_users_env


def _populate(root: Path) -> dict[str, str]:
    good = put(root, "good", "cuda:90", size=500, last_used=40 * 86400)
    put(root, "other", "hip:gfx942", "hsaco", size=700)
    bad = put(root, "bad", size=300)
    Path(bad.path).write_bytes(b"\0" * 300)  # same size, wrong digest
    (root / ".tmp").mkdir(exist_ok=True)
    (root / ".tmp" / "dead.tmp").write_bytes(b"x")
    backdate(root / ".tmp" / "dead.tmp", time.time() - 7200)
    return {"good": good.key, "bad": bad.key}


def _ro_run(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run the console script with ``root`` bind-mounted read-only (a private mount namespace)."""
    assert KERNELCACHE is not None, "the kernelcache console script is not installed"
    script = (
        'set -e; mount --bind "$R" "$R"; mount -o remount,ro,bind "$R" "$R"; '
        'exec "$KC" --root "$R" "$@"'
    )
    return subprocess.run(
        ["unshare", "-rm", "sh", "-c", script, "sh", *args],
        env=child_env(R=str(root), KC=KERNELCACHE),
        capture_output=True,
        text=True,
        timeout=120,
    )


needs_unshare = pytest.mark.skipif(
    not CAN_UNSHARE, reason="needs a private mount namespace (unshare -rm) for a read-only mount"
)


@needs_unshare
def test_reading_commands_work_on_a_read_only_mount(tmp_path):
    root = tmp_path / "ro"
    keys = _populate(root)
    before = files_under(root)
    stats = _ro_run(root, "stats", "--json")
    assert stats.returncode == 0, stats.stderr
    doc = json.loads(stats.stdout)
    assert doc["entries"] == 3 and doc["by_target"]["hip:gfx942"]["entries"] == 1
    ls = _ro_run(root, "ls", "--sort", "last-used", "--json")
    assert json.loads(ls.stdout)["entries"][0]["key"] == keys["good"]
    show = _ro_run(root, "show", keys["good"])
    assert show.returncode == 0 and "status:     ok" in show.stdout
    verify = _ro_run(root, "verify", "--json")
    assert verify.returncode == 1
    kinds = {(p["kind"], p["key"]) for p in json.loads(verify.stdout)["problems"]}
    assert ("corrupt", keys["bad"]) in kinds and ("stale-temp", None) in kinds
    plan = _ro_run(root, "prune", "--dry-run", "--older-than", "30d", "--json")
    assert plan.returncode == 0, plan.stderr
    assert json.loads(plan.stdout)["plan"]["summary"]["delete-entry"]["count"] == 1
    out = tmp_path / "bundle.tar"
    export = _ro_run(root, "export", str(out), "--json")
    assert export.returncode == 1  # the corrupt entry is skipped and reported
    doc = json.loads(export.stdout)
    assert doc["entries"] == 2 and doc["skipped"][0]["key"] == keys["bad"]
    doctor = _ro_run(root, "doctor", "--json")
    assert doctor.returncode == 1
    checks = {c["name"]: c for c in json.loads(doctor.stdout)["checks"]}
    assert checks["writable"]["status"] == "fail"
    assert "Read-only file system" in checks["writable"]["detail"]
    assert files_under(root) == before  # not even a scan index was written


@needs_unshare
@pytest.mark.parametrize(
    "args",
    [["verify", "--repair"], ["prune", "--older-than", "1d"], ["prune"]],
    ids=lambda a: " ".join(a),
)
def test_writing_commands_fail_cleanly_on_a_read_only_mount(tmp_path, args):
    root = tmp_path / "ro"
    _populate(root)
    before = files_under(root)
    proc = _ro_run(root, *args)
    assert proc.returncode == 2  # nothing done: a root this user cannot write
    assert "not writable" in proc.stderr and "nothing was changed" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert files_under(root) == before


@needs_unshare
def test_import_into_a_read_only_mount_writes_nothing(tmp_path):
    source = tmp_path / "src"
    put(source, "shipped", size=323)
    bundle = tmp_path / "b.tar"
    assert (
        subprocess.run(
            [str(KERNELCACHE), "--root", str(source), "export", str(bundle)],
            env=child_env(),
            capture_output=True,
            timeout=60,
        ).returncode
        == 0
    )
    root = tmp_path / "ro"
    _populate(root)
    before = files_under(root)
    proc = _ro_run(root, "import", str(bundle))
    assert proc.returncode == 2 and "not writable" in proc.stderr
    assert files_under(root) == before
    check = _ro_run(root, "import", str(bundle), "--dry-run", "--json")
    assert check.returncode == 0 and json.loads(check.stdout)["imported"] == 1


@pytest.fixture
def shared_root(shared_tmp: Path) -> Path:
    """A root owned by root that other users can read but not write."""
    root = shared_tmp / "cache"
    root.mkdir()
    os.chmod(root, 0o755)
    return root


def _as_nobody(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``kernelcache --root ROOT ARGS`` run as user nobody (``root`` is in a shared_tmp)."""
    assert KERNELCACHE is not None
    nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    return subprocess.run(
        [*nobody, KERNELCACHE, "--root", str(root), *args],
        env=other_users_env(root.parent),
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.skipif(not CAN_DROP_PRIVILEGES, reason="needs root and setpriv to act as another user")
def test_a_root_another_user_owns(shared_root):
    keys = _populate(shared_root)
    for sub in (".tmp",):
        os.chmod(shared_root / sub, 0o755)
    before = files_under(shared_root)
    stats = _as_nobody(shared_root, "stats", "--json")
    assert stats.returncode == 0, stats.stderr
    assert json.loads(stats.stdout)["entries"] == 3
    verify = _as_nobody(shared_root, "verify", "--json")
    assert verify.returncode == 1
    assert keys["bad"] in verify.stdout
    for args in (["verify", "--repair"], ["prune", "--older-than", "1d"]):
        proc = _as_nobody(shared_root, *args)
        assert proc.returncode == 2, proc.stderr
        assert "not writable" in proc.stderr
    doctor = _as_nobody(shared_root, "doctor", "--json")
    checks = {c["name"]: c["status"] for c in json.loads(doctor.stdout)["checks"]}
    assert checks["writable"] == "fail"
    assert files_under(shared_root) == before


@pytest.mark.skipif(
    os.geteuid() == 0 or sys.platform != "linux", reason="permission bits do not stop root"
)
def test_unwritable_root_as_this_user(tmp_path):
    root = tmp_path / "cache"
    _populate(root)
    os.chmod(root, 0o555)
    try:
        before = files_under(root)
        proc = subprocess.run(
            [str(KERNELCACHE), "--root", str(root), "prune", "--older-than", "1d"],
            env=child_env(),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 2 and "not writable" in proc.stderr
        assert files_under(root) == before
    finally:
        os.chmod(root, 0o755)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act on another user's root")
def test_reading_commands_by_another_user_create_no_directories(tmp_path):
    root = tmp_path / "users-cache"
    put(root, "k", size=400)  # a whole cubin: verify finds it clean
    os.chown(root, 65534, 65534)  # the cache belongs to another user; we run as root
    before = files_under(root)

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(KERNELCACHE), "--root", str(root), *args],
            env=child_env(),
            capture_output=True,
            text=True,
            timeout=60,
        )

    assert json.loads(run("stats", "--json").stdout)["entries"] == 1
    assert run("ls").returncode == 0 and run("verify").returncode == 0
    doctor = json.loads(run("doctor", "--json").stdout)
    assert doctor["lock_mode"] == "flock" and doctor["permissions"]["writable"] is True
    # root-owned .stats/, .tmp/ or .locks/ would keep the owner's processes from writing
    assert files_under(root) == before


#: permission bits stop root too once it gives up the capabilities that override them
WITHOUT_OVERRIDE = ["setpriv", "--bounding-set=-dac_override,-dac_read_search"]
CAN_LOSE_OVERRIDE = os.geteuid() != 0 or (
    shutil.which("setpriv") is not None
    and subprocess.run([*WITHOUT_OVERRIDE, "true"], capture_output=True).returncode == 0
)


@pytest.mark.skipif(not CAN_LOSE_OVERRIDE, reason="needs setpriv to run root without overrides")
def test_a_root_this_user_cannot_read_is_said_by_every_command(tmp_path):
    root = tmp_path / "cache"
    keys = _populate(root)
    os.chmod(root, 0)
    prefix = WITHOUT_OVERRIDE if os.geteuid() == 0 else []

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        assert KERNELCACHE is not None
        return subprocess.run(
            [*prefix, KERNELCACHE, "--root", str(root), *args],
            env=child_env(),
            capture_output=True,
            text=True,
            timeout=120,
        )

    try:
        for args in (["stats"], ["ls"], ["show", keys["good"]], ["verify"], ["prune"]):
            proc = run(*args)
            assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
            assert f"cannot read the cache root {root}: Permission denied" in proc.stderr
            assert "run as a user who may read it" in proc.stderr
            assert proc.stdout == "", (args, proc.stdout)
        doctor = json.loads(run("doctor", "--json").stdout)
        checks = {c["name"]: c for c in doctor["checks"]}
        assert checks["readable"]["status"] == "fail"
        assert "read-only root" not in checks["writable"]["detail"]
    finally:
        os.chmod(root, 0o755)
