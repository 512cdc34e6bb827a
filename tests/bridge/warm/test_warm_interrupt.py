"""Ctrl-C on ``kernelcache warm``: it ends at once with exit 130, whatever its compilers are
doing, kills the compiles under way with what they started (nothing of theirs keeps running or
is stored), and says exactly how many of the kernels it was compiling are stored. Through the
real command line, in real processes: a ptxas that never answers makes the compiles under way
last for ever."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from cli_support import KERNELCACHE, kc_json
from support import REPO, child_env

triton = pytest.importorskip("triton", reason="warm compiles kernels")

TARGETS = ("--target", "cuda:90", "--target", "hip:gfx942")
ADD = json.loads((REPO / "examples" / "manifest.jsonl").read_text().splitlines()[0])


def _stalling_ptxas(tmp_path: Path) -> Path:
    """A ptxas that answers ``--version`` and ``--help`` as the real one and, asked to
    assemble, writes its pid into ``tmp_path/started/`` and sleeps for ever."""
    from triton import knobs

    started = tmp_path / "started"
    started.mkdir()
    script = tmp_path / "ptxas"
    script.write_text(
        "#!/bin/sh\n"
        'case "$*" in *--version*|*--help*) exec ' + knobs.nvidia.ptxas.path + ' "$@";; esac\n'
        f"echo $$ > {started}/$$\n"
        "exec sleep 3600\n"
    )
    script.chmod(0o755)
    return script


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.parametrize("whom", ["the command", "its process group"])
def test_ctrl_c_ends_warm_at_once_even_mid_compile_and_kills_the_compiles(tmp_path, whom):
    manifest = tmp_path / "add.jsonl"
    manifest.write_text(json.dumps(ADD) + "\n")
    root, temp = tmp_path / "cache", tmp_path / "tmp"
    temp.mkdir()
    ptxas = str(_stalling_ptxas(tmp_path))  # (Triton 3.9 runs ptxas_blackwell from sm_90 on)
    env = child_env(TRITON_PTXAS_PATH=ptxas, TRITON_PTXAS_BLACKWELL_PATH=ptxas, TMPDIR=str(temp))
    argv = [KERNELCACHE, "--root", str(root), "warm", str(manifest)]
    proc = subprocess.Popen(
        [*argv, "--target", "cuda:90", "--target", "cuda:80", "--jobs", "2"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        cwd=REPO,
    )
    try:
        deadline = (
            time.monotonic() + 300
        )  # (until both compiles reach ptxas: a bound, not a measure)
        while len(list((tmp_path / "started").iterdir())) < 2:
            if proc.poll() is not None:
                pytest.fail(f"warm ended before its compiles reached ptxas: {proc.stderr.read()}")
            assert time.monotonic() < deadline, "the compiles never reached ptxas"
            time.sleep(0.1)
        if whom == "the command":  # as `kill -INT PID` or a job scheduler sends it
            os.kill(proc.pid, signal.SIGINT)
        else:  # as a terminal sends it
            os.killpg(proc.pid, signal.SIGINT)
        _, said = proc.communicate(timeout=120)  # (the compiles never end: a wait would hang)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, said
    last = said.strip().splitlines()[-1]
    assert last.startswith("kernelcache: interrupted while warming, after 0 of 2 kernels; ")
    assert f"0 kernels of the 2 it was compiling are stored in {root}, whole" in last
    assert "Traceback" not in said and "Exception ignored" not in said
    ptxas = [int(p.name) for p in (tmp_path / "started").iterdir()]
    deadline = time.monotonic() + 60
    while not all(_gone(pid) for pid in ptxas) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert all(_gone(pid) for pid in ptxas), "a compile it started is still running"
    assert kc_json(root, "ls", "--kind", "all")["count"] <= 4  # (compiler identities, no kernel)
    assert kc_json(root, "ls")["count"] == 0
    assert list(temp.iterdir()) == []


def test_ctrl_c_mid_warm_says_exactly_how_many_kernels_are_stored(tmp_path):
    root = tmp_path / "cache"
    proc = subprocess.Popen(
        [KERNELCACHE, "--root", str(root), "warm", "examples/manifest.jsonl", *TARGETS],
        env=child_env(KERNELCACHE_PROGRESS_INTERVAL="0"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        cwd=REPO,
    )
    assert proc.stderr is not None
    said = ""
    while "warming: 2/" not in said:
        line = proc.stderr.readline()
        assert line, said
        said += line
    os.killpg(proc.pid, signal.SIGINT)
    _, rest = proc.communicate(timeout=120)
    assert proc.returncode == 130, said + rest
    last = rest.strip().splitlines()[-1]
    stored = kc_json(root, "ls")["count"]
    assert f"; {stored} kernel" in last and f"stored in {root}, whole;" in last, last
    kinds = {e["kind"] for e in kc_json(root, "ls", "--kind", "all")["entries"]}
    assert "failure" not in kinds  # no interrupted compile taken for one that cannot compile
