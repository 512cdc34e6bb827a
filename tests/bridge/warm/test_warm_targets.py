"""``kernelcache warm --target T`` for an architecture the compiler Triton runs here does not
know (``cuda:900``, ``hip:gfx999``): refused before any compile, exit 2, with the ones it knows
listed; nothing stored and nothing left in the temporary directory. A compile that fails in
ptxas leaves nothing there either (Triton leaves its PTX and log behind when ptxas fails)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from cli_support import kc, kc_json
from support import REPO

pytest.importorskip("triton", reason="warm compiles kernels")

ADD = json.loads((REPO / "examples" / "manifest.jsonl").read_text().splitlines()[0])


def _manifest(tmp_path: Path) -> Path:
    manifest = tmp_path / "add.jsonl"
    manifest.write_text(json.dumps(ADD) + "\n")
    return manifest


@pytest.mark.parametrize(
    "target, known",
    [
        ("cuda:900", ["cuda:80", "cuda:90", "cuda:120"]),
        ("hip:gfx999", ["hip:gfx90a", "hip:gfx942"]),
    ],
)
def test_a_target_the_compiler_does_not_know_is_refused_before_any_compile(tmp_path, target, known):
    temp = tmp_path / "tmp"
    temp.mkdir()
    root = tmp_path / "cache"
    proc = kc(root, "warm", str(_manifest(tmp_path)), "--target", target, env={"TMPDIR": str(temp)})
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.strip().splitlines()  # one line: no compiler's dump
    vendor, arch = target.split(":")
    assert line.startswith(
        f"kernelcache: error: target {target}: the {'CUDA' if vendor == 'cuda' else 'ROCm'} "
        f"compiler Triton runs here does not know {arch}; nothing was compiled. It knows "
    )
    assert all(f" {name}," in line or line.endswith(f" {name}") for name in known)
    assert not root.exists() or kc_json(root, "ls", "--kind", "all")["count"] == 0
    assert list(temp.iterdir()) == []


def test_a_compile_that_fails_in_ptxas_leaves_nothing_in_the_temporary_directory(tmp_path):
    from triton import knobs

    failing = tmp_path / "ptxas"
    failing.write_text(
        "#!/bin/sh\n"
        'case "$*" in *--version*|*--help*) exec ' + knobs.nvidia.ptxas.path + ' "$@";; esac\n'
        "echo 'ptxas fatal: refused' >&2\nexit 1\n"
    )
    failing.chmod(0o755)
    temp = tmp_path / "tmp"
    temp.mkdir()
    env = {"TMPDIR": str(temp), "TRITON_PTXAS_PATH": str(failing)}
    for jobs in ("1", "2"):  # in this process, and in the pool (each into a root of its own)
        proc = kc(
            tmp_path / f"cache-{jobs}",
            "warm",
            str(_manifest(tmp_path)),
            "--target",
            "cuda:90",
            "--target",
            "cuda:80",
            "--jobs",
            jobs,
            env=env,
        )
        assert "ptxas fatal: refused" in proc.stdout, proc.stderr  # (reported, left out)
        assert list(temp.iterdir()) == [], jobs


def test_the_temporary_directory_of_a_killed_run_is_removed_by_the_next(tmp_path):
    from bridge.warm.warming import TEMP_PREFIX

    temp = tmp_path / "tmp"
    dead = temp / f"{TEMP_PREFIX}{2**22 + 1}-abc"  # (above any pid this host gives)
    alive = temp / f"{TEMP_PREFIX}{os.getpid()}-abc"  # a run going on: this test's process
    for directory in (dead, alive):
        (directory / "left").mkdir(parents=True)
    proc = kc(
        tmp_path / "cache",
        "warm",
        str(_manifest(tmp_path)),
        "--target",
        "cuda:90",
        env={"TMPDIR": str(temp)},
    )
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in temp.iterdir()) == [alive.name]
