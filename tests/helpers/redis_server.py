"""A real redis-server for tests and benchmarks: started on a free port in a temporary directory.

``RedisServer(tmpdir).start()`` runs ``redis-server`` (``$PATH`` or /usr/bin) with no
persistence, waits until it answers PING, and ``stop()``/``kill()`` end it. ``REDIS_SERVER``
is the binary's path or None; tests skip with ``SKIP_REASON`` when it is absent.
:func:`make_tls_files` makes a self-signed certificate for a TLS server. Also:
:func:`blackhole` (a TCP port that accepts connections and never answers), :func:`drip` (a
server that answers one byte at a time, or floods), :func:`scripted` (a server that answers
what a test chooses) and :func:`free_port` (a port where nothing listens).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

REDIS_SERVER = shutil.which("redis-server") or (
    "/usr/bin/redis-server" if os.path.exists("/usr/bin/redis-server") else None
)
SKIP_REASON = "redis-server is not installed (apt-get install redis-server)"


def free_port() -> int:
    """A TCP port on 127.0.0.1 where nothing listens right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ping(port: int, password: str | None, ca: str | None = None, timeout: float = 0.2) -> bool:
    """Whether a server on ``port`` answers PING (over TLS trusting ``ca`` if given)."""
    try:
        with contextlib.ExitStack() as stack:
            s = stack.enter_context(socket.create_connection(("127.0.0.1", port), timeout=timeout))
            if ca is not None:
                context = ssl.create_default_context(cafile=ca)
                s = stack.enter_context(context.wrap_socket(s, server_hostname="127.0.0.1"))
            if password:
                s.sendall(f"AUTH {password}\r\n".encode())
                s.recv(64)
            s.sendall(b"PING\r\n")
            return s.recv(64).startswith(b"+PONG")
    except OSError:
        return False


@dataclass(frozen=True)
class TLSFiles:
    """A self-signed certificate for 127.0.0.1 (it is its own CA) and its key."""

    cert: str
    key: str


def make_tls_files(directory: str | os.PathLike[str]) -> TLSFiles:
    """Create a self-signed certificate for 127.0.0.1 with the openssl command.

    Raises:
        RuntimeError: openssl is not installed or failed.
    """
    openssl = shutil.which("openssl")
    if openssl is None:
        raise RuntimeError("openssl is not installed")
    cert, key = os.path.join(directory, "cert.pem"), os.path.join(directory, "key.pem")
    subject = ["-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"]
    ca = ["-addext", "basicConstraints=critical,CA:TRUE", "-keyout", key, "-out", cert]
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", *subject, *ca],
        check=True,
        capture_output=True,
    )
    return TLSFiles(cert, key)


class RedisServer:
    """One redis-server process listening on 127.0.0.1, data under ``directory``."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        password: str | None = None,
        args: Sequence[str] = (),
        port: int | None = None,
        tls: TLSFiles | None = None,
    ) -> None:
        if REDIS_SERVER is None:
            raise RuntimeError(SKIP_REASON)
        self.directory = Path(directory)
        self.password = password
        self.args = list(args)
        self.port = port
        self.tls = tls
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        scheme = "rediss" if self.tls else "redis"
        return f"{scheme}://{auth}127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> RedisServer:
        """Start the server (on a fresh free port unless one was given) and wait for PING."""
        self.directory.mkdir(parents=True, exist_ok=True)
        fixed = self.port
        for _attempt in range(1 if fixed else 3):
            port = fixed or free_port()
            if self.tls:
                listen = ["--port", "0", "--tls-port", str(port), "--tls-auth-clients", "no"]
                listen += ["--tls-cert-file", self.tls.cert, "--tls-key-file", self.tls.key]
                listen += ["--tls-ca-cert-file", self.tls.cert]
            else:
                listen = ["--port", str(port)]
            cmd = [
                REDIS_SERVER,
                *listen,
                "--bind",
                "127.0.0.1",
                "--dir",
                str(self.directory),
                "--save",
                "",
                "--appendonly",
                "no",
                "--daemonize",
                "no",
                "--logfile",
                str(self.directory / f"redis-{port}.log"),
            ]
            if self.password:
                cmd += ["--requirepass", self.password]
            cmd += self.args
            self.process = subprocess.Popen(
                cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and self.process.poll() is None:
                if _ping(port, self.password, self.tls.cert if self.tls else None):
                    self.port = port
                    return self
                time.sleep(0.02)
            self.stop()
        raise RuntimeError(f"redis-server did not start; see {self.directory}")

    def client(self):  # -> redis.Redis
        """A plain redis-py client of this server (for inspecting and tampering)."""
        import redis

        return redis.Redis(host="127.0.0.1", port=self.port, password=self.password)

    def kill(self) -> None:
        """SIGKILL the server (a crash) and wait for it."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=10)

    def pause(self) -> None:
        """SIGSTOP the server: it accepts connections (the kernel does) and never answers."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT a paused server."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        """Terminate the server (resumed first, if paused) and wait for it."""
        if self.process is not None and self.process.poll() is None:
            self.resume()
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def _listener(
    serve: Callable[[socket.socket, threading.Event], None], host: str = "127.0.0.1"
) -> Iterator[int]:
    """A port on ``host`` whose every connection is handed to ``serve(conn, stop)`` in a
    thread of its own; ``stop`` is set, and every connection closed, on exit."""
    listener = socket.socket()
    listener.bind((host, 0))
    listener.listen(64)
    stop = threading.Event()
    threads: list[threading.Thread] = []
    conns: list[socket.socket] = []

    def accept() -> None:
        listener.settimeout(0.05)
        while not stop.is_set():
            with contextlib.suppress(OSError):
                conn, _ = listener.accept()
                conns.append(conn)
                thread = threading.Thread(target=serve, args=(conn, stop), daemon=True)
                thread.start()
                threads.append(thread)

    acceptor = threading.Thread(target=accept, daemon=True)
    acceptor.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        acceptor.join()
        for conn in conns:  # (wakes a thread blocked reading it)
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        for thread in threads:
            thread.join(timeout=5)
        for conn in conns:
            conn.close()
        listener.close()


def blackhole(reply: bytes = b"") -> contextlib.AbstractContextManager[int]:
    """A port on 127.0.0.1 that accepts connections, sends ``reply`` (default: nothing) and
    then never another byte: a hung server, or one that speaks another protocol."""

    def serve(conn: socket.socket, stop: threading.Event) -> None:
        with contextlib.suppress(OSError):
            if reply:
                conn.sendall(reply)

    return _listener(serve)


def _commands(conn: socket.socket) -> Iterator[list[bytes]]:
    """The commands a client sends on ``conn`` (RESP arrays of bulk strings), until it closes."""
    reader = conn.makefile("rb")
    while line := reader.readline():
        count = int(line[1:])
        command = []
        for _ in range(count):
            size = int(reader.readline()[1:])
            command.append(reader.read(size + 2)[:-2])
        yield command


def scripted(
    answer: Callable[[list[bytes]], bytes | None], host: str = "127.0.0.1"
) -> contextlib.AbstractContextManager[int]:
    """A port on ``host`` ("0.0.0.0": every loopback address) whose server answers each
    command (``[b"EVALSHA", sha, ...]``) with the raw bytes ``answer(command)`` gives, or
    never again where it gives None: a server that says what a test chooses."""

    def serve(conn: socket.socket, stop: threading.Event) -> None:
        with contextlib.suppress(OSError, ValueError):
            for command in _commands(conn):
                reply = answer(command)
                if reply is None:
                    stop.wait()
                    return
                conn.sendall(reply)

    return _listener(serve, host)


def drip(
    head: bytes = b"$1000000\r\n",
    chunk: bytes = b"x",
    interval: float = 0.3,
    limit: float = 60.0,
) -> contextlib.AbstractContextManager[int]:
    """A port on 127.0.0.1 whose server answers every connection, once the client has sent
    its first bytes, with ``head``, then ``chunk`` every ``interval`` seconds (0: as fast as
    the client reads) whatever it is asked: a slow (or flooding) server. Each connection stops
    after ``limit`` seconds, or when the client goes away."""

    def serve(conn: socket.socket, stop: threading.Event) -> None:
        with contextlib.suppress(OSError):
            conn.recv(65536)  # (an HTTP client refuses an answer that comes before its request)
            conn.sendall(head)
            end = time.monotonic() + limit
            while not stop.is_set() and time.monotonic() < end:
                conn.sendall(chunk)
                if interval:
                    stop.wait(interval)

    return _listener(serve)


def _cluster_ports(count: int) -> list[int]:
    """``count`` free ports whose cluster bus ports (port + 10000) are free too."""
    ports: list[int] = []
    while len(ports) < count:
        port = free_port()
        if port + 10000 > 65535 or port in ports:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        ports.append(port)
    return ports


class RedisClusterServers:
    """A Redis Cluster of ``size`` primaries on 127.0.0.1, every slot assigned, with
    ``replicas`` replicas of each (``nodes``: the primaries first, then the replicas):
    redis-server processes in cluster mode, each primary given a range of slots, then joined.
    ``url`` is ``redis+cluster://127.0.0.1:p1,127.0.0.1:p2,...`` (every node).

    Configured as docs/remote.md recommends for a cache: ``cluster-require-full-coverage no``
    (the primaries that are up keep serving their slots when one is down); ``full_coverage``
    keeps Redis's default, under which the whole cluster refuses every key once a primary has
    been unreachable for the node timeout (2 s here)."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        size: int = 3,
        *,
        full_coverage: bool = False,
        replicas: int = 0,
    ) -> None:
        self.directory = Path(directory)
        self.size = size
        self.replicas = replicas
        self.full_coverage = full_coverage
        self.nodes: list[RedisServer] = []

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)

    def start(self, timeout: float = 30.0) -> RedisClusterServers:
        for port in _cluster_ports(self.size * (1 + self.replicas)):
            args = ["--cluster-enabled", "yes", "--cluster-node-timeout", "2000"]
            args += ["--cluster-config-file", str(self.directory / f"nodes-{port}.conf")]
            if not self.full_coverage:
                args += ["--cluster-require-full-coverage", "no"]
            node = RedisServer(self.directory / str(port), args=args, port=port)
            self.nodes.append(node.start())
        # what redis-cli --cluster create does, without its pauses: each node takes an equal
        # range of the 16384 slots and a config epoch of its own, then meets the first one
        for i, node in enumerate(self.nodes[: self.size]):
            first, last = i * 16384 // self.size, (i + 1) * 16384 // self.size - 1
            client = node.client()
            client.execute_command("CLUSTER ADDSLOTSRANGE", first, last)
            client.execute_command("CLUSTER SET-CONFIG-EPOCH", i + 1)
        for node in self.nodes[1:]:
            node.client().execute_command("CLUSTER MEET", "127.0.0.1", self.nodes[0].port)
        deadline = time.monotonic() + timeout
        replicating = False
        while time.monotonic() < deadline:
            if all(self._state_ok(n) for n in self.nodes):
                if not replicating:  # replica j of primary j % size, once all know each other
                    ids = [n.client().execute_command("CLUSTER MYID") for n in self.nodes]
                    for j, node in enumerate(self.nodes[self.size :]):
                        primary = ids[j % self.size]
                        primary = primary.decode() if isinstance(primary, bytes) else primary
                        node.client().execute_command("CLUSTER REPLICATE", primary)
                    replicating = True
                if all(self._replicating(n) for n in self.nodes[self.size :]):
                    return self
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"the Redis Cluster did not come up; see {self.directory}")

    @staticmethod
    def _replicating(node: RedisServer) -> bool:
        import redis

        try:
            info = node.client().info("replication")
        except (OSError, redis.RedisError):
            return False
        return info.get("role") == "slave" and info.get("master_link_status") == "up"

    def primary_of(self, client, name: str) -> RedisServer:
        """The node that serves the slot of the Redis key ``name`` now, as the first running
        node that answers says."""
        for said in self._said_primaries(client, name):
            return said
        raise LookupError(f"no node serves {name}")

    def primaries_of(self, client, name: str) -> set[RedisServer]:
        """The node that serves the slot of the Redis key ``name``, as each running node that
        answers says (after a failover, nodes learn the new primary one by one)."""
        return set(self._said_primaries(client, name))

    def _said_primaries(self, client, name: str) -> Iterator[RedisServer]:
        """For each running node that answers, in order, the node it says serves the slot of
        the Redis key ``name``."""
        import redis

        slot = client.keyslot(name)
        for node in self.nodes:
            if node.process is None or node.process.poll() is not None:
                continue  # killed (redis-py would retry a refused connection for a while)
            with contextlib.suppress(OSError, redis.RedisError):
                for first, last, *owner in node.client().execute_command("CLUSTER SLOTS"):
                    if first <= slot <= last:
                        port = int(owner[0][1])
                        yield next(n for n in self.nodes if n.port == port)
                        break

    def _state_ok(self, node: RedisServer) -> bool:
        """Whether ``node`` sees the whole cluster: state ok, every node known and every slot
        assigned (without full coverage, a node says ok before gossip brought it every
        other node's slots, and a client reading its slot map then finds slots without a
        primary)."""
        import redis

        try:
            info = node.client().execute_command("CLUSTER INFO")  # parsed by redis-py
        except (OSError, redis.RedisError):
            return False
        return (
            str(info.get("cluster_state")) == "ok"
            and int(info.get("cluster_known_nodes", 0)) == len(self.nodes)
            and int(info.get("cluster_slots_assigned", 0)) == 16384
        )

    def client(self):  # -> redis.cluster.RedisCluster
        """A plain redis-py cluster client (for inspecting and tampering)."""
        from redis.cluster import RedisCluster

        return RedisCluster(host="127.0.0.1", port=self.nodes[0].port)

    def stop(self) -> None:
        for node in self.nodes:
            node.resume()
            node.stop()

    def __enter__(self) -> RedisClusterServers:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
