"""Child processes started as forks of a process per test worker that has already imported
what they import: the ``kernelcache`` console script (:func:`run`) and Python code that
imports jax (:func:`run_python`).

The tests run the command about a thousand times and a few hundred children that import jax;
a fresh interpreter spends most of such a run importing (0.1 s of CPU for the command and its
plugins, 0.6 s for jax). Each run here is still a process of its own: a fork of a server that
imported those modules and did nothing else, which takes the caller's arguments, variables,
working directory, umask and standard streams, then does what the script or ``python -c``
does, so exit codes, atexit handlers and output are a real run's. Neither kernelcache (its
settings are read when used: :mod:`kernelcache.config`) nor jax before its first backend reads
a variable at import that a run could set otherwise, and the interpreter's own state that
variables set at start-up (the module path, the user site, bytecode writing) is set again from
the run's. A run that would differ anyway is a fresh process: one whose variables change the
interpreter (other ``PYTHON*``, the locale, ``HOME``, ``TMPDIR``) or, for jax, what jax or the
loader reads at import (``JAX_*``, ``XLA_*``, ``TRITON_*``, ``LD_*``, ...), one whose module
path holds a module the server imported (another jax), or one asked for while another is in
flight.
"""

from __future__ import annotations

import atexit
import io
import json
import locale
import os
import re
import socket
import struct
import subprocess
import sys
import tempfile
import threading
from collections.abc import Sequence

#: variables that change what an interpreter is (its path, user site, encoding, temporary
#: directory) rather than what the command reads at run time: a run that sets them otherwise
#: than the server's environment is a fresh process, except those the fork sets again
INTERPRETER = ("PYTHON", "LC_", "LANG", "HOME", "TMPDIR", "TEMP", "TMP", "TZ")
#: what a fork sets again from the run's variables, as the interpreter does at start-up
RESET = ("PYTHONPATH", "PYTHONDONTWRITEBYTECODE", "PYTHONUSERBASE")
#: variables read by jax, its plugins, Triton or the dynamic loader when jax is imported
JAX_IMPORT = ("JAX_", "XLA_", "TF_", "TRITON_", "CUDA_", "NVIDIA_", "TPU_", "LD_", "OMP_")

#: the modules a server imports before serving, by what it serves
COMMAND = """
from importlib.metadata import entry_points
import kernelcache.cli
for ep in entry_points(group=kernelcache.cli.app.COMMANDS_GROUP):
    ep.load()
"""
JAX = """
import jax, jax.numpy
"""

SERVER = r"""
import json, os, site, socket, struct, sys, types
exec(sys.argv[2])
PATH = [p for p in sys.path if p not in os.environ.get("PYTHONPATH", "").split(os.pathsep)]
sock = socket.socket(fileno=int(sys.argv[1]))
names = json.dumps(sorted({n.split(".")[0] for n in sys.modules})).encode()
sock.sendall(struct.pack("!I", len(names)) + names)
def exact(n):
    got = b""
    while len(got) < n:
        part = sock.recv(n - len(got))
        if not part:
            raise SystemExit(0)
        got += part
    return got
while True:
    _, fds, _, _ = socket.recv_fds(sock, 1, 3)
    if not fds:
        raise SystemExit(0)
    ask = json.loads(exact(struct.unpack("!I", exact(4))[0]))
    sys.stdout.flush(); sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        sock.close()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(ask["cwd"])
        os.umask(ask["umask"])
        os.environ.clear()
        os.environ.update(ask["env"])
        given = [p for p in ask["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
        sys.path[:] = [ask["path0"], *dict.fromkeys(given), *PATH[1:]]
        sys.dont_write_bytecode = bool(ask["env"].get("PYTHONDONTWRITEBYTECODE"))
        site.USER_BASE = site.USER_SITE = None
        sys.argv = ask["argv"]
        if "numpy" in sys.modules:
            sys.modules["numpy"].random.seed()
        if ask["code"] is None:
            sys.exit(kernelcache.cli.main())
        main = types.ModuleType("__main__")
        sys.modules["__main__"] = main
        exec(compile(ask["code"], "<string>", "exec"), main.__dict__)
        sys.exit(0)
    for fd in fds:
        os.close(fd)
    sock.sendall(struct.pack("!q", pid))
    _, status = os.waitpid(pid, 0)
    sock.sendall(struct.pack("!q", os.waitstatus_to_exitcode(status)))
"""


class _Server:
    def __init__(self, preload: str, fixed: tuple[str, ...]) -> None:
        from support import child_env

        ours, theirs = socket.socketpair()
        self.env = child_env()
        self.fixed = fixed
        self.said = tempfile.TemporaryFile()  # the server's own output, if it fails
        self.proc = subprocess.Popen(
            [sys.executable, "-c", SERVER, str(theirs.fileno()), preload],
            pass_fds=[theirs.fileno()],
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=self.said,
            stderr=self.said,
        )
        theirs.close()
        self.sock = ours
        self.busy = threading.Lock()
        #: the top-level names of the modules the server imported
        self.imported = set(json.loads(self._exact(struct.unpack("!I", self._exact(4))[0])))

    def close(self) -> None:
        self.sock.close()
        self.proc.wait(timeout=30)
        self.said.close()

    def serves(self, env: dict[str, str]) -> bool:
        """Whether a fork of this server is what a fresh interpreter run with ``env`` is."""
        if self.proc.poll() is not None:
            return False
        # in a virtual environment the user site is never on the path: its folder
        # (PYTHONUSERBASE) is read where asked for, so a fork sets it again
        reset = (
            RESET if sys.prefix != sys.base_prefix else ("PYTHONPATH", "PYTHONDONTWRITEBYTECODE")
        )
        keys = {k for k in {*env, *self.env} if k.startswith(self.fixed) and k not in reset}
        if any(env.get(k) != self.env.get(k) for k in keys):
            return False
        ours = self.env.get("PYTHONPATH", "").split(os.pathsep)
        given = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p not in ours]
        return all(os.path.isabs(p) and not self._shadows(p) for p in given)

    def _shadows(self, folder: str) -> bool:
        """Whether ``folder`` holds a module the server imported (a run would import that)."""
        if not os.path.isdir(folder):
            return os.path.exists(folder)  # a zip: not looked into
        return bool({n.split(".")[0] for n in os.listdir(folder)} & self.imported)

    def run(
        self, argv: list[str], code: str | None, env: dict[str, str], cwd: str, timeout: float
    ) -> tuple[int, bytes, bytes]:
        """Run ``argv`` (a console script's, or ``python -c CODE ARGS...`` where ``code`` is
        given) as a fork of this server: its exit code, its output and its error output."""
        out, err = os.memfd_create("stdout"), os.memfd_create("stderr")
        null = os.open(os.devnull, os.O_RDONLY)
        try:
            mask = os.umask(0o022)
            os.umask(mask)
            # sys.path[0] and sys.argv: a script's folder (links resolved) and its argv, or ""
            # and ``-c ARGS...`` for ``python -c``
            path0 = "" if code is not None else os.path.dirname(os.path.realpath(argv[0]))
            ask = {
                "argv": argv if code is None else ["-c", *argv[3:]],
                "code": code,
                "env": env,
                "cwd": cwd,
                "umask": mask,
                "path0": path0,
            }
            data = json.dumps(ask).encode()
            socket.send_fds(self.sock, [b"r"], [null, out, err])
            self.sock.sendall(struct.pack("!I", len(data)) + data)
            self.sock.settimeout(30)
            (pid,) = struct.unpack("!q", self._exact(8))
            self.sock.settimeout(timeout)
            try:
                (exit_code,) = struct.unpack("!q", self._exact(8))
            except TimeoutError:
                os.kill(pid, 9)
                self.sock.settimeout(30)
                self._exact(8)
                raise subprocess.TimeoutExpired(argv, timeout) from None
            return exit_code, _read(out), _read(err)
        finally:
            for fd in (out, err, null):
                os.close(fd)

    def _exact(self, n: int) -> bytes:
        got = b""
        while len(got) < n:
            part = self.sock.recv(n - len(got))
            if not part:
                self.said.seek(0)
                said = self.said.read().decode(errors="replace")
                raise RuntimeError(f"the server of child processes exited: {said}")
            got += part
        return got


def _read(fd: int) -> bytes:
    os.lseek(fd, 0, os.SEEK_SET)
    with open(fd, "rb", closefd=False) as f:
        return f.read()


_servers: dict[str, _Server] = {}
_started = threading.Lock()


def _the_server(preload: str, fixed: tuple[str, ...]) -> _Server:
    with _started:
        server = _servers.get(preload)
        if server is None or server.proc.poll() is not None:
            server = _servers[preload] = _Server(preload, fixed)
        return server


@atexit.register
def stop() -> None:
    """End this process's servers (at its exit)."""
    with _started:
        for server in _servers.values():
            server.close()
        _servers.clear()


def _text(data: bytes) -> str:
    encoding = locale.getpreferredencoding(False)
    return io.TextIOWrapper(io.BytesIO(data), encoding=encoding, newline=None).read()


def _served(
    server: _Server,
    argv: list[str],
    code: str | None,
    env: dict[str, str],
    cwd: str,
    timeout: float,
) -> subprocess.CompletedProcess[str] | None:
    if not (server.serves(env) and server.busy.acquire(blocking=False)):
        return None
    try:
        exit_code, out, err = server.run(argv, code, env, cwd, timeout)
    finally:
        server.busy.release()
    return subprocess.CompletedProcess(argv, exit_code, _text(out), _text(err))


def fresh(
    argv: list[str],
    env: dict[str, str],
    *,
    timeout: float,
    cwd: str | os.PathLike[str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """``argv`` in a fresh interpreter with ``env``, in ``cwd``, stdin empty, its output
    captured as text."""
    return subprocess.run(
        argv,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        cwd=cwd,
    )


def _run(
    argv: list[str],
    code: str | None,
    server: _Server | None,
    env: dict[str, str],
    timeout: float,
    cwd: str | os.PathLike[str] | None,
) -> subprocess.CompletedProcess[str]:
    """``argv`` as a fork of ``server`` where it serves it, else :func:`fresh`."""
    where = os.fspath(cwd) if cwd is not None else os.getcwd()
    done = None if server is None else _served(server, argv, code, env, where, timeout)
    return done if done is not None else fresh(argv, env, timeout=timeout, cwd=where)


def run(
    script: str,
    args: Sequence[str],
    env: dict[str, str],
    *,
    timeout: float,
    cwd: str | os.PathLike[str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """``script ARGS...`` (the console script ``script``) with ``env``, in ``cwd``, stdin
    empty, its output captured as text: what :func:`subprocess.run` gives."""
    server = _the_server(COMMAND, INTERPRETER)
    return _run([script, *args], None, server, env, timeout, cwd)


#: a top-level import of jax
IMPORTS_JAX = re.compile(r"^(?:import|from) jax\b", re.M)
#: code that, run before jax is imported, could make that import another (variables, modules)
BEFORE_JAX = re.compile(
    r"environ\s*\[[^]]*\]\s*=|environ\.(?:update|setdefault|pop)|putenv|sys\.modules|meta_path"
)


def run_python(
    code: str,
    args: Sequence[str],
    env: dict[str, str],
    *,
    timeout: float,
    cwd: str | os.PathLike[str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """``python -c CODE ARGS...`` with ``env``, in ``cwd``, stdin empty, its output captured
    as text; a fork of the jax server where ``code`` imports jax at its top level and does
    nothing before that could change what the import is."""
    first = IMPORTS_JAX.search(code)
    jax = first is not None and not BEFORE_JAX.search(code[: first.start()])
    server = _the_server(JAX, INTERPRETER + JAX_IMPORT) if jax else None
    return _run([sys.executable, "-c", code, *args], code, server, env, timeout, cwd)
