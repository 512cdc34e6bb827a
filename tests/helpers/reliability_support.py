"""Helpers for the reliability and hostile-input tests (tests/system/): a child harness that
SIGKILLs itself at a chosen file-system call, the post-crash audit, and the figures for
benchmarks/RELIABILITY.md."""

from __future__ import annotations

import contextlib
import hashlib
import io
import itertools
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from artifact_images import sized
from support import child_env, metadata_keys

import kernelcache
from kernelcache import cli
from kernelcache.store import Artifact, Store

#: Prepended to a child's code. ``arm(at)`` makes the process kill itself with SIGKILL just
#: before its ``at``-th file-system call (the os functions below and fcntl.flock: every step
#: at which a crash can leave a different state on disk). ``arm(0)`` only counts; the count is
#: written to ``$KC_CALLS_FILE`` at exit (registered first, so it runs after every other
#: exit handler, kernelcache's statistics flush included).
KILLER = r"""
import atexit as _atexit, fcntl as _fcntl, os as _os, signal as _signal
_FS_CALLS = ("open", "write", "replace", "rename", "unlink", "link", "utime", "mkdir", "rmdir",
             "close", "fsync", "ftruncate")
_calls = [0]

def _save_count():
    out = _os.environ.get("KC_CALLS_FILE")
    if out:
        with open(out, "w") as f:
            f.write(str(_calls[0]))

_atexit.register(_save_count)

def arm(at):
    kill, getpid = _os.kill, _os.getpid

    def wrap(module, name):
        real = getattr(module, name)

        def call(*args, **kwargs):
            _calls[0] += 1
            if _calls[0] == at:
                kill(getpid(), _signal.SIGKILL)
            return real(*args, **kwargs)

        setattr(module, name, call)

    for name in _FS_CALLS:
        wrap(_os, name)
    wrap(_fcntl, "flock")
"""


def run_cli(*argv: str) -> tuple[int, str]:
    """``kernelcache ARGV`` in this process (the console script's own entry point): (exit code,
    standard output)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = cli.main(list(argv))
    return code, out.getvalue()


def payload(key: str, size: int) -> bytes:
    """The artifact bytes of ``key`` in these tests, a whole cubin (so any served entry can be
    checked, and verify finds the entries whole)."""
    return sized("cubin", size, hashlib.sha256(key.encode()).digest())


def run_armed(
    code: str, argv: list[str], at: int, tmp: Path, timeout: float = 120, **env: str
) -> tuple[subprocess.CompletedProcess[str], int | None]:
    """Run ``KILLER + code`` with ``argv``; the code calls ``arm(int(os.environ["KC_KILL_AT"]))``
    where the operation starts. Returns the process and, for an unkilled run, its count of
    file-system calls."""
    calls_file = tmp / f"calls-{os.getpid()}-{random.random()}"
    proc = subprocess.run(
        [sys.executable, "-c", KILLER + textwrap.dedent(code), *argv],
        env=child_env(KC_KILL_AT=str(at), KC_CALLS_FILE=str(calls_file), **env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    count = None
    if proc.returncode != -signal.SIGKILL and calls_file.exists():
        count = int(calls_file.read_text())
    with contextlib.suppress(FileNotFoundError):
        calls_file.unlink()
    return proc, count


def kill_points(total: int, count: int, seed: object) -> list[int]:
    """``count`` call numbers in 1..total, one drawn at random from each of ``count`` equal
    slices (every part of the operation gets killed, in a reproducible way)."""
    rng = random.Random(repr(seed))
    count = min(count, total)
    edges = [1 + (total * i) // count for i in range(count + 1)]
    return [rng.randrange(lo, max(hi, lo + 1)) for lo, hi in itertools.pairwise(edges)]


@dataclass
class Audit:
    """What a root looks like after a crash: verify's findings and what ``get`` serves."""

    problems: list[dict] = field(default_factory=list)
    entries_ok: int = 0
    served: int = 0
    served_wrong: int = 0  # corrupt reads served: must stay 0

    def kinds(self) -> set[str]:
        return {p["kind"] for p in self.problems}


def audit(root: Path, expected: Mapping[str, tuple[str, bytes]]) -> Audit:
    """Check a root after a crash (or at any time):

    * ``kernelcache verify --json`` runs; every entry it passes is exactly the expected bytes,
      every entry it calls corrupt is refused by a plain read, and it finds no file that is
      not the cache's own;
    * ``Cache.get`` of every expected key serves the expected bytes or nothing.
    """
    code, out = run_cli("--root", str(root), "verify", "--json")
    doc = json.loads(out)
    assert code in (0, 1), out
    result = Audit(problems=doc["problems"], entries_ok=doc["entries_ok"])
    reader = Store(root, readonly=True, trust="any")
    assert "foreign" not in result.kinds(), doc["problems"]
    for problem in doc["problems"]:
        if problem["kind"] == "corrupt":
            assert not isinstance(reader.read(problem["key"]), Artifact), problem
    for key in metadata_keys(root):
        assert key in expected, f"an entry nobody wrote: {key}"
    # served through a read-only layer: the audit itself refreshes no last-used stamp
    scratch = tempfile.mkdtemp(prefix="kc-audit-")
    cache = kernelcache.Cache(scratch, readonly_roots=[root])
    for key, (ext, data) in expected.items():
        art = cache.get(key, ext)
        if art is not None:
            result.served += 1
            if art.data != data or Path(art.path).read_bytes() != data:
                result.served_wrong += 1
    shutil.rmtree(scratch, ignore_errors=True)
    return result


def record_figures(scenario: str, **figures: int) -> None:
    """Append one line of figures to ``$KC_RELIABILITY_FIGURES`` when it is set (the numbers
    of benchmarks/RELIABILITY.md: processes, operations, faults, corrupt reads served, jobs
    failed)."""
    path = os.environ.get("KC_RELIABILITY_FIGURES")
    if not path:
        return
    line = json.dumps({"scenario": scenario, **figures}, sort_keys=True) + "\n"
    with open(path, "a", encoding="utf-8") as f:
        f.write(line)
