"""Helpers for the reliability and hostile-input tests (tests/system/): a child harness that
SIGKILLs itself at a chosen file-system call (run as a fresh interpreter, or forked from a
process that imported kernelcache once), the post-crash audit, and the figures for
benchmarks/RELIABILITY.md."""

from __future__ import annotations

import contextlib
import hashlib
import io
import itertools
import json
import os
import random
import select
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
#: at which a crash can leave a different state on disk) in the thread that armed it. The
#: calls of other threads are not counted: a held soft lock's heartbeat refreshes its file
#: every so often, so how many of those a run makes depends on how long it takes (a kill
#: point drawn from a slow run's count could lie beyond a faster run's end), and they change
#: nothing but a time. ``arm(0)`` only counts; the count is written to ``$KC_CALLS_FILE`` at
#: exit (registered first, so it runs after every other exit handler, kernelcache's
#: statistics flush included).
KILLER = r"""
import atexit as _atexit, fcntl as _fcntl, os as _os, signal as _signal, threading as _threading
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
    kill, getpid, thread = _os.kill, _os.getpid, _threading.get_ident
    armed = thread()

    def wrap(module, name):
        real = getattr(module, name)

        def call(*args, **kwargs):
            if thread() == armed:
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


#: The program of :class:`ForkServer`: ``KILLER``, the modules named in its arguments imported
#: once, then for each request (a JSON line: code, argv, env, output files) a fork that runs
#: the request's code as a ``python -c`` program would, in a module whose globals are
#: ``KILLER``'s: its argv, its variables added, its output to the files, and its end the
#: interpreter's own (threads joined, exit handlers run, the exit status of SystemExit or of an
#: uncaught exception). The server answers each request with the child's pid, then its
#: wait status.
FORK_SERVER = (
    KILLER
    + r"""
import json as _json, sys as _sys
for _name in _sys.argv[1:]:
    __import__(_name)

def _serve():
    for line in _sys.stdin:
        job = _json.loads(line)
        _sys.stdout.flush()
        pid = _os.fork()
        if pid == 0:
            return job
        print(pid, flush=True)
        print(_os.waitpid(pid, 0)[1], flush=True)
    return None

_job = _serve()
if _job is not None:  # (the child)
    del _serve
    _opened = _os.open(_os.devnull, _os.O_RDONLY)
    _os.dup2(_opened, 0)
    _os.close(_opened)
    for _fd, _path in ((1, _job["stdout"]), (2, _job["stderr"])):
        _opened = _os.open(_path, _os.O_WRONLY | _os.O_CREAT | _os.O_TRUNC, 0o600)
        _os.dup2(_opened, _fd)
        _os.close(_opened)
    _sys.argv = ["-c", *_job["argv"]]
    _os.environ.update(_job["env"])
    exec(compile(_job["code"], "<string>", "exec"))
"""
)


class ForkServer:
    """Runs programs armed with ``KILLER`` as children of one process that imported the modules
    they use (``preload``) once: each is a fresh fork, a real process that a real SIGKILL ends,
    without the start of an interpreter and its imports (most of such a short program's time;
    its count of file-system calls is the same). The children's environment is
    :func:`support.child_env`'s when the server started, with each call's variables added."""

    def __init__(self, tmp: Path, *preload: str) -> None:
        self.tmp = tmp
        self.proc = subprocess.Popen(
            [sys.executable, "-c", FORK_SERVER, *preload],
            env=child_env(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def run(
        self, code: str, argv: list[str], at: int, timeout: float = 120, **env: str
    ) -> tuple[subprocess.CompletedProcess[str], int | None]:
        """Run ``code`` with ``argv`` in a fork of the server; the code calls
        ``arm(int(os.environ["KC_KILL_AT"]))`` where the operation starts. Returns the process
        and, for an unkilled run, its count of file-system calls."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        out, err = self.tmp / "fork-stdout", self.tmp / "fork-stderr"
        calls_file = self.tmp / f"calls-{os.getpid()}-{random.random()}"
        env = {"KC_KILL_AT": str(at), "KC_CALLS_FILE": str(calls_file), **env}
        job = {"code": textwrap.dedent(code), "argv": argv, "env": env}
        self.proc.stdin.write(json.dumps({**job, "stdout": str(out), "stderr": str(err)}) + "\n")
        self.proc.stdin.flush()
        pid = self.proc.stdout.readline()
        assert pid, f"the fork server ended ({self.proc.wait()}); see its standard error"
        if not select.select([self.proc.stdout], [], [], timeout)[0]:
            os.kill(int(pid), signal.SIGKILL)
            self.proc.stdout.readline()  # (its status)
            raise subprocess.TimeoutExpired(code, timeout)
        status = int(self.proc.stdout.readline())
        returncode = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        proc = subprocess.CompletedProcess(argv, returncode, out.read_text(), err.read_text())
        return proc, _calls_counted(proc, calls_file)

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=60)
        assert self.proc.stdout is not None
        self.proc.stdout.close()

    def __enter__(self) -> ForkServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _calls_counted(proc: subprocess.CompletedProcess[str], calls_file: Path) -> int | None:
    """The count of file-system calls a child wrote to ``calls_file`` at its exit (None for a
    killed child); the file is removed."""
    count = None
    if proc.returncode != -signal.SIGKILL and calls_file.exists():
        count = int(calls_file.read_text())
    with contextlib.suppress(FileNotFoundError):
        calls_file.unlink()
    return count


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
