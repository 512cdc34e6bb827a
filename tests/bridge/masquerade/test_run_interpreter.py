"""``kernelcache run -- python ...`` where the ``python`` on ``PATH`` is not the environment
``kernelcache`` runs from and cannot import jax: it is named, with what to run instead, before
the program runs (and fails on its own)."""

from __future__ import annotations

import os
import subprocess
import sys

from cli_support import KERNELCACHE
from support import child_env


def _run(*command: str, path: str, cwd) -> subprocess.CompletedProcess[str]:
    assert KERNELCACHE is not None, "install the project first (pip install -e .)"
    env = child_env()
    env["PATH"] = path
    return subprocess.run(
        [KERNELCACHE, "run", "--", *command],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=str(cwd),
        stdin=subprocess.DEVNULL,
    )


def test_a_python_without_jax_is_named_with_what_to_run(tmp_path):
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    path = os.pathsep.join([str(bare / "bin"), os.environ.get("PATH", "")])
    proc = _run("python", "-c", "import jax", path=path, cwd=tmp_path)
    assert proc.returncode == 1 and "No module named 'jax'" in proc.stderr  # its own error
    (said,) = [line for line in proc.stderr.splitlines() if line.startswith("kernelcache run:")]
    assert f"'python' is {bare / 'bin' / 'python'}, which cannot import jax" in said, said
    assert f"kernelcache run -- {sys.executable} ..." in said
    assert proc.stderr.index("kernelcache run:") < proc.stderr.index("Traceback")


def test_the_environments_own_python_runs_without_a_word(tmp_path):
    path = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])
    proc = _run("python", "-c", "import jax; print('ok')", path=path, cwd=tmp_path)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr
    assert "kernelcache run:" not in proc.stderr
