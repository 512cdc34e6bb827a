"""The benchmark scripts as a user runs them: without an optional package they need, they say
which and how to install it, in one line, never with a traceback."""

from __future__ import annotations

import json
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


def test_the_compression_benchmark_prints_its_table_and_writes_its_json(tmp_path):
    from cli_support import put

    kernels = tmp_path / "kernels"
    for i in range(3):
        put(kernels, "matmul", ext="cubin", size=20_000, seed=i)
        put(kernels, "matmul", ext="ptx", size=20_000, seed=i)
    out = tmp_path / "compression.json"
    argv = [sys.executable, str(REPO / "benchmarks" / "compression.py")]
    argv += ["--kernels", str(kernels), "--reads", "64", "--out", str(out)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("Sizes (plain -> zstd level 3):")
    assert "get, plain root (default)" in proc.stdout and "x the floor" in proc.stdout
    doc = json.loads(out.read_text())
    assert doc == json.loads(proc.stdout.splitlines()[-1])
    total = doc["sizes"]["total"]
    assert total["entries"] == 6 and total["artifact_zstd"] < total["artifact"]
    assert set(doc["hot_path"]["vs_floor"]) == {
        "floor: open().read()",
        "get, plain root (default)",
        "get, zstd root",
    }
