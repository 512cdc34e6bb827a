"""The suite's check for what its processes leave in temporary directories (tests/conftest.py)
judges only the session's own temporary directories, never the machine's: a session run here,
with this suite's conftest, passes when another program leaves ``kc-*`` in the machine's temp
directory beside it, and fails when one of its own tests leaves one in its ``TMPDIR``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from support import REPO, child_env

CONFTEST = f"""
import sys
sys.path.insert(0, {str(REPO / "tests" / "helpers")!r})
exec(compile(open({str(REPO / "tests" / "conftest.py")!r}).read(), "conftest.py", "exec"))
"""


def _session(tmp_path: Path, body: str) -> subprocess.CompletedProcess[str]:
    """A pytest session of one test (``body``) with the suite's conftest, whose machine temp
    directory is ``tmp_path/machine``."""
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "conftest.py").write_text(CONFTEST)
    (tests / "test_one.py").write_text(
        "import os, tempfile\nfrom pathlib import Path\n\n\ndef test_one():\n" + body
    )
    machine = tmp_path / "machine"
    machine.mkdir()
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tests)]
    argv += [f"--basetemp={tmp_path / 'base'}", f"--rootdir={tests}", "-c", "/dev/null"]
    env = child_env(TMPDIR=str(machine), PYTHONDONTWRITEBYTECODE="1")
    env.pop("KC_TESTS_SESSION", None)
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300, cwd=tests)


def test_what_another_program_leaves_in_the_machines_temp_directory_fails_nothing(tmp_path):
    machine = tmp_path / "machine"
    proc = _session(tmp_path, f"    Path({str(machine)!r}, 'kc-another-program').mkdir()\n")
    assert (machine / "kc-another-program").is_dir()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "left in" not in proc.stdout


def test_what_the_sessions_own_processes_leave_in_its_temp_directory_fails_the_session(tmp_path):
    body = (
        "    os.mkdir(os.path.join(tempfile.gettempdir(), 'kc-mine'))\n"
        "    open(os.path.join(tempfile.gettempdir(), 'tmpab12.ptx'), 'w').close()\n"
    )
    proc = _session(tmp_path, body)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "1 passed" in proc.stdout
    said = next(line for line in proc.stdout.splitlines() if "left in" in line)
    assert "kc-mine" in said and "tmpab12.ptx" in said
    assert str(tmp_path / "base") in said
