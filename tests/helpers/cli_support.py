"""Helpers for the command-line tests: run the real console script (:func:`kc`,
:func:`kc_json`, :func:`kc_code`; each run a process of its own: :mod:`command_server`),
make entries (:func:`put`), age files, hold shared locks."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import command_server
import pytest
from artifact_images import launch, sized, whole
from support import REPO, child_env, key_of

from kernelcache.store import Artifact, Store


def _script() -> str | None:
    beside = Path(sys.executable).parent / "kernelcache"
    if beside.exists():
        return str(beside)
    return shutil.which("kernelcache")


KERNELCACHE = _script()


def kc(
    root: Path | str | None,
    *args: str,
    env: dict[str, str] | None = None,
    timeout: float = 120,
    cwd: Path | str | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``kernelcache [--root ROOT] ARGS...`` (the installed console script), in ``cwd``."""
    if KERNELCACHE is None:
        pytest.fail(
            "the kernelcache console script is not installed next to this Python; "
            "install the project first (pip install -e .)"
        )
    given = ["--root", str(root)] if root is not None else []
    return command_server.run(
        KERNELCACHE, [*given, *args], child_env(**(env or {})), timeout=timeout, cwd=cwd
    )


def kc_code(
    *args: str, code: int, prelude: str | None = None, **env: str
) -> subprocess.CompletedProcess[str]:
    """The real console script run with ``args`` (in the checkout, no root given), or with
    ``prelude`` (Python code that runs the command itself) in a fresh interpreter; it must exit
    with ``code``."""
    assert KERNELCACHE is not None, "install the project first (pip install -e '.[bridge]')"
    if prelude is None:
        proc = command_server.run(KERNELCACHE, args, child_env(**env), timeout=300, cwd=REPO)
    else:
        argv = [sys.executable, "-c", prelude, *args]
        proc = command_server.fresh(argv, child_env(**env), timeout=300, cwd=REPO)
    assert proc.returncode == code, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


def kc_json(root: Path | str | None, *args: str, code: int = 0, **kw: Any) -> dict[str, Any]:
    """Run a command with --json; check its exit code; return the parsed document."""
    proc = kc(root, *args, "--json", **kw)
    assert proc.returncode == code, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    doc = json.loads(proc.stdout)
    assert doc["schema"] == 1
    return doc


def put(
    root: Path,
    name: str = "kern",
    target: str = "cuda:90",
    ext: str = "cubin",
    size: int = 300,  # room for a whole cubin (at least 203 bytes)
    *,
    key: str | None = None,
    last_used: float | None = None,
    seed: object = None,
) -> Artifact:
    """Store one entry of ``size`` bytes through the core API (whole for its format where the
    size has room: see :func:`artifact_images.sized`); optionally backdate its last-used
    stamp."""
    key = key or key_of(name, target, ext, size, seed)
    data = sized(ext, size, key.encode(), name)
    meta = launch(ext, name=name, target=target, num_warps=4)
    art = Store(root).put(key, ext, data, meta)
    if last_used is not None:
        backdate(root / f"{key}.json", time.time() - last_used)
    return art


def backdate(path: Path, when: float) -> None:
    os.utime(path, (when, when), follow_symlinks=False)


def files_under(root: Path) -> set[str]:
    """Every path under ``root``, relative (for "nothing was written" checks)."""
    if not root.exists():
        return set()
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


HOLD = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
fcntl.flock(fd, fcntl.LOCK_SH)
print("held", flush=True)
sys.stdin.read()
"""


def hold_shared(path: Path | str) -> subprocess.Popen[str]:
    """Another process holding a shared flock on ``path`` (as a reader of an artifact does)
    until its standard input is closed: ``proc.communicate("")``."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=child_env(),
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def answer_on_a_terminal(root: Path, answer: str | None, *args: str) -> tuple[int, str]:
    """Run ``kernelcache --root ROOT ARGS...`` with standard input and error on a
    pseudo-terminal; type ``answer`` once a ``[y/N]`` question shows (None: expect none).
    Returns (exit code, what the terminal showed, then standard output)."""
    import pty
    import select

    assert KERNELCACHE is not None, "install the project first (pip install -e '.[bridge]')"
    primary, secondary = pty.openpty()
    proc = subprocess.Popen(
        [KERNELCACHE, "--root", str(root), *args],
        stdin=secondary,
        stdout=subprocess.PIPE,
        stderr=secondary,
        env=child_env(),
    )
    os.close(secondary)
    shown = b""
    deadline = time.monotonic() + 60
    while answer is not None and b"[y/N]" not in shown and time.monotonic() < deadline:
        if select.select([primary], [], [], 0.5)[0]:
            shown += os.read(primary, 4096)
    if answer is not None:
        os.write(primary, answer.encode() + b"\n")
    out, _ = proc.communicate(timeout=60)
    with_rest = shown
    while select.select([primary], [], [], 0.1)[0]:
        try:
            chunk = os.read(primary, 4096)
        except OSError:
            break
        if not chunk:
            break
        with_rest += chunk
    os.close(primary)
    return proc.returncode, with_rest.decode(errors="replace") + out.decode()


def put_companion(
    root: Path,
    kernel_key: str,
    ext: str = "ptx",
    kind: str = "ptx",
    *,
    role: str | None = None,
    last_used: float | None = None,
    **fields: Any,
) -> Artifact:
    """Store an entry of ``kind`` in the key group of ``kernel_key`` (as a package derives the
    keys of a kernel's companions: its PTX, what it keeps beside it), its metadata naming
    kernel ``matmul`` for ``cuda:90`` unless ``fields`` says otherwise."""
    from kernelcache.keys import group_of

    key = group_of(kernel_key) + key_of(kernel_key, role or kind)[16:]
    given = {"name": "matmul", "target": "cuda:90", **fields, "kind": kind}
    meta = {k: v for k, v in given.items() if v is not None}  # (target=None: none)
    art = Store(root).put(key, ext, whole(ext, name=str(meta["name"])), launch(ext, **meta))
    if last_used is not None:
        backdate(root / f"{key}.json", time.time() - last_used)
    return art
