"""The benchmark scripts as a user runs them: without an optional package they need, they say
which and how to install it, in one line, never with a traceback."""

from __future__ import annotations

import subprocess
import sys

from support import REPO


def test_plots_without_matplotlib_says_what_to_install(tmp_path):
    # -S: no site-packages, so matplotlib is truly absent (the script needs nothing else there)
    argv = [
        sys.executable,
        "-S",
        "-I",
        str(REPO / "benchmarks" / "plots.py"),
        "--out",
        str(tmp_path),
    ]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert proc.stderr.startswith(
        "benchmarks/plots.py draws with matplotlib, which is not installed"
    )
    assert "pip install 'matplotlib==" in proc.stderr
    assert list(tmp_path.iterdir()) == []
