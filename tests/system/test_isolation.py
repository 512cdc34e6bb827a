"""The tests touch nothing outside temporary directories: a process a test starts without a
cache root of its own (``KERNELCACHE_DIR`` is never passed on to children) writes its default
root, Triton its files and anything under ``~`` under the session's temporary directories,
never the user's own; and a session whose processes leave something in its own temporary
directories fails (tests/conftest.py), whatever other programs leave in the system's."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from support import REPO, child_env, run_py

CHILD = """
import json, os, platformdirs, kernelcache
cache = kernelcache.Cache(None, readonly_roots=(), remote="")
art = cache.put("ab" * 32, "bin", b"written by a test's child", {})
print(json.dumps({"root": cache.root, "path": art.path,
                  "cache_dir": platformdirs.user_cache_dir("kernelcache", appauthor=False),
                  "triton_home": os.environ.get("TRITON_HOME"),
                  "home": os.path.expanduser("~"), "temp": __import__("tempfile").gettempdir()}))
"""


def _under(path: str, directory: str) -> bool:
    return Path(os.path.realpath(path)).is_relative_to(os.path.realpath(directory))


def test_a_child_without_a_root_writes_under_the_sessions_temporary_directories():
    out = json.loads(run_py(CHILD).stdout.splitlines()[-1])
    temp = tempfile.gettempdir()
    users_home = pwd.getpwuid(os.getuid()).pw_dir
    for name in ("root", "path", "cache_dir", "triton_home", "home", "temp"):
        assert out[name] and _under(out[name], temp), (name, out[name])
        assert not _under(out[name], users_home), (name, out[name])


# A test that leaves a directory in its session's temporary directory (its TMPDIR), and one in
# what the session takes for the system's temp directory, as another program would.
LEAKS = """
import os, tempfile


def test_leaves_a_directory():
    tempfile.mkdtemp(prefix="kc-left-")
    tempfile.mkdtemp(prefix="kc-other-", dir=os.environ["SYSTEM_TEMP"])
"""


def test_a_session_that_leaves_something_in_the_temp_directory_fails(tmp_path):
    """A session (with an xdist worker) whose test leaves ``kc-left-*`` in its own temporary
    directory passes its tests but fails, naming what it left; what is left in the system's
    temp directory beside it is not the session's to judge."""
    suite, system_temp = tmp_path / "suite", tmp_path / "system-temp"
    suite.mkdir()
    system_temp.mkdir()
    shutil.copy(REPO / "tests" / "conftest.py", suite / "conftest.py")
    (suite / "test_leaves.py").write_text(LEAKS)
    env = child_env(TMPDIR=str(system_temp), SYSTEM_TEMP=str(system_temp))
    env["PYTHONPATH"] += os.pathsep + str(REPO / "tests" / "helpers")
    env.pop("KC_TESTS_SESSION", None)
    session = [
        "-n",
        "1",
        "-p",
        "no:cacheprovider",
        "-q",
        "-c",
        "/dev/null",
        "--rootdir",
        str(suite),
        f"--basetemp={tmp_path / 'base'}",
    ]
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", *session, str(suite)],
        env=env,
        cwd=suite,
        capture_output=True,
        text=True,
        timeout=300,
    )
    (left,) = [p.name for p in (tmp_path / "base").rglob("kc-left-*")]
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "1 passed" in proc.stdout and "left in the session's temporary" in proc.stdout
    assert "kc-other-" not in proc.stdout, proc.stdout
    assert left in proc.stdout
