"""The ``kernelcache`` console script, run as a fork of one process per test worker that has
already imported the command (:func:`run`).

The tests run the command about a thousand times; a fresh interpreter spends most of each run
importing the command and its plugins (about 0.1 s of CPU). Each run here is still a process of
its own, started from a server that imported ``kernelcache.cli`` and loaded its plugins' modules
and nothing else: a fork that takes the caller's arguments, environment, working directory,
umask and standard streams, then does what the console script does (``sys.exit(main())``), so
exit codes, atexit handlers and output are a real run's. No configuration is read at import
(:mod:`kernelcache.config`), so an import done before the fork reads nothing a run's variables
would change. A run whose variables would start another interpreter (``PYTHON*``, the locale,
``HOME``'s user site, ``TMPDIR``), or one asked for while another is in flight, is a fresh
process of the script instead.
"""

from __future__ import annotations

import atexit
import io
import json
import locale
import os
import socket
import struct
import subprocess
import sys
import threading
from collections.abc import Sequence

#: variables that change what an interpreter is (its path, user site, encoding, temporary
#: directory) rather than what the command reads at run time: a run that sets them otherwise
#: than the server's environment is a fresh process
INTERPRETER = ("PYTHON", "LC_", "LANG", "HOME", "TMPDIR", "TEMP", "TMP", "TZ")

SERVER = r"""
import json, os, socket, struct, sys
from importlib.metadata import entry_points
import kernelcache.cli
for ep in entry_points(group=kernelcache.cli.app.COMMANDS_GROUP):
    ep.load()
sock = socket.socket(fileno=int(sys.argv[1]))
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
        sys.argv = ask["argv"]
        sys.exit(kernelcache.cli.main())
    for fd in fds:
        os.close(fd)
    sock.sendall(struct.pack("!q", pid))
    _, status = os.waitpid(pid, 0)
    sock.sendall(struct.pack("!q", os.waitstatus_to_exitcode(status)))
"""


class _Server:
    def __init__(self) -> None:
        ours, theirs = socket.socketpair()
        env = _base_env()
        self.env = env
        self.proc = subprocess.Popen(
            [sys.executable, "-c", SERVER, str(theirs.fileno())],
            pass_fds=[theirs.fileno()],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        theirs.close()
        self.sock = ours
        self.busy = threading.Lock()

    def close(self) -> None:
        self.sock.close()
        self.proc.wait(timeout=30)

    def serves(self, env: dict[str, str]) -> bool:
        def interpreter(e: dict[str, str]) -> dict[str, str]:
            return {k: v for k, v in e.items() if k.startswith(INTERPRETER)}

        return self.proc.poll() is None and interpreter(env) == interpreter(self.env)

    def run(
        self, argv: list[str], env: dict[str, str], cwd: str, timeout: float
    ) -> tuple[int, bytes, bytes]:
        out, err = os.memfd_create("stdout"), os.memfd_create("stderr")
        null = os.open(os.devnull, os.O_RDONLY)
        try:
            mask = os.umask(0o022)
            os.umask(mask)
            ask = json.dumps({"argv": argv, "env": env, "cwd": cwd, "umask": mask}).encode()
            socket.send_fds(self.sock, [b"r"], [null, out, err])
            self.sock.sendall(struct.pack("!I", len(ask)) + ask)
            self.sock.settimeout(30)
            (pid,) = struct.unpack("!q", self._exact(8))
            self.sock.settimeout(timeout)
            try:
                (code,) = struct.unpack("!q", self._exact(8))
            except TimeoutError:
                os.kill(pid, 9)
                self.sock.settimeout(30)
                self._exact(8)
                raise subprocess.TimeoutExpired(argv, timeout) from None
            return code, _read(out), _read(err)
        finally:
            for fd in (out, err, null):
                os.close(fd)

    def _exact(self, n: int) -> bytes:
        got = b""
        while len(got) < n:
            part = self.sock.recv(n - len(got))
            if not part:
                said = self.proc.stderr.read().decode() if self.proc.poll() is not None else ""
                raise RuntimeError(f"the command server exited ({self.proc.poll()}): {said}")
            got += part
        return got


def _read(fd: int) -> bytes:
    os.lseek(fd, 0, os.SEEK_SET)
    with open(fd, "rb", closefd=False) as f:
        return f.read()


def _base_env() -> dict[str, str]:
    from support import child_env

    return child_env()


_server: _Server | None = None
_started = threading.Lock()
atexit.register(lambda: stop())


def _the_server() -> _Server:
    global _server
    with _started:
        if _server is None or _server.proc.poll() is not None:
            _server = _Server()
        return _server


def stop() -> None:
    """End this process's server (at the end of a test session)."""
    global _server
    with _started:
        if _server is not None:
            _server.close()
            _server = None


def _text(data: bytes) -> str:
    encoding = locale.getpreferredencoding(False)
    return io.TextIOWrapper(io.BytesIO(data), encoding=encoding, newline=None).read()


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
    argv = [script, *args]
    where = os.fspath(cwd) if cwd is not None else os.getcwd()
    server = _the_server()
    if server.serves(env) and server.busy.acquire(blocking=False):
        try:
            code, out, err = server.run(argv, env, where, timeout)
        finally:
            server.busy.release()
        return subprocess.CompletedProcess(argv, code, _text(out), _text(err))
    return subprocess.run(
        argv,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        cwd=where,
    )
