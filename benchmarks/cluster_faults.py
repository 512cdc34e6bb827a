"""The servers of ``cluster_job.py`` and the faults it makes in them, each at a moment it
checks, with the evidence that it landed there: a killed or stopped server is probed before
the first job starts; a kill "while a lock is held and polled" waits until a build lock is
in Redis, its entry is not, and other processes send the shard commands meanwhile; a kill
"after N publications" waits until the namespace holds N entries; with replicas, the time
until another node serves the killed primary's slots (the failover) is measured.

The watchers read the servers directly (redis-py, ``/proc``), never through kernelcache, so
they see the same thing whichever checkout the job runs.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import threading
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

#: a scenario's fault, and when it is made: "before" the first job, or "during" it
FAULTS = {
    "healthy": None,
    "killed-primary": "before",
    "killed-lock-holder": "during",
    "killed-after-publications": "during",
    "stopped-primary": "before",
    "stopped-s3": "before",
    "full-disk": "before",
}
#: entries published before "killed-after-publications" kills a primary
PUBLICATIONS = 15
POLL_S = 0.01


def _state(pid: int) -> str:
    """The state letter of process ``pid`` (``T``: stopped), from ``/proc``."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "gone"
    return stat.rsplit(")", 1)[1].split()[0]


def _stopped(pid: int, within: float = 2.0) -> bool:
    """Whether process ``pid`` is stopped within ``within`` seconds (a signal is delivered
    when the process next runs)."""
    deadline = time.monotonic() + within
    while _state(pid) != "T":
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def _refused(port: int) -> bool:
    """Whether a connection to ``port`` on 127.0.0.1 is refused (nothing listens)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0):
            return False
    except ConnectionRefusedError:
        return True
    except OSError:
        return False


def _hangs(port: int, request: bytes) -> bool:
    """Whether ``request`` sent to ``port`` goes unanswered for 0.5 s (a stopped server:
    the kernel accepts the connection, nobody answers)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            s.sendall(request)
            return not s.recv(16)
    except TimeoutError:
        return True
    except OSError:
        return False


class Servers:
    """moto's S3 server for the whole run; a fresh 3-primary Redis Cluster per job pair (with
    ``replicas`` replicas of each primary); the faults of each scenario and their evidence."""

    def __init__(self, stack: ExitStack, tmp: Path) -> None:
        from remote import start_moto

        self.tmp = tmp
        self.bucket, self.moto = start_moto(stack)
        self.moto_port = int(self.bucket.split("127.0.0.1:")[1].split("&")[0])
        self.cluster: Any = None
        self.namespace = ""
        self.killed: Any = None

    def urls(self, tier: str, prefix: str) -> str:
        """The URL of ``tier`` for one scenario (its own namespace and bucket prefix)."""
        self.namespace = prefix
        s3 = self.bucket.replace("/run?", f"/{prefix}?")
        cluster = f"{self.cluster.url}?namespace={prefix}" if self.cluster else ""
        urls = {"cluster": cluster, "replicas": cluster, "s3": s3, "layered": f"{cluster} {s3}"}
        return urls[tier]

    def fresh_cluster(self, name: str, replicas: int) -> None:
        from redis_server import RedisClusterServers

        self.close_cluster()
        self.killed = None
        directory = self.tmp / f"cluster-{name}"
        self.cluster = RedisClusterServers(directory, replicas=replicas).start()

    def close_cluster(self) -> None:
        if self.cluster is not None:
            self.cluster.stop()
            self.cluster = None

    # -- faults made before the first job: made, then probed ------------------------------
    def before(self, scenario: str) -> dict[str, Any]:
        """Make the fault of ``scenario`` (one made before the first job); its evidence."""
        if scenario in ("killed-primary", "stopped-primary"):
            node = self.cluster.nodes[1]
            if scenario == "killed-primary":
                self._kill(node)
                evidence = {"landed": _refused(node.port), "port_refused": _refused(node.port)}
                if self.cluster.replicas:  # filled in while the job runs
                    since = time.monotonic()

                    def failover() -> None:
                        seconds = self.failover_s(since)
                        evidence["failover_s"] = None if seconds is None else round(seconds, 2)

                    threading.Thread(target=failover, daemon=True).start()
                return evidence
            node.pause()
            stopped = _stopped(node.process.pid)
            hangs = _hangs(node.port, b"PING\r\n")
            return {"landed": stopped and hangs, "state": "stopped", "ping_hangs": hangs}
        if scenario == "stopped-s3":
            self.moto.send_signal(signal.SIGSTOP)
            stopped = _stopped(self.moto.pid)
            hangs = _hangs(self.moto_port, b"HEAD / HTTP/1.1\r\nHost: x\r\n\r\n")
            return {"landed": stopped and hangs, "state": "stopped", "http_hangs": hangs}
        return {}

    def undo(self, scenario: str) -> None:
        """Undo what :meth:`before` made that outlives the scenario (a stopped process)."""
        if scenario == "stopped-primary" and self.cluster is not None:
            self.cluster.nodes[1].resume()
        elif scenario == "stopped-s3":
            self.moto.send_signal(signal.SIGCONT)

    def _kill(self, node: Any) -> None:
        self.killed = node
        node.kill()

    # -- faults made during the first job: a watcher thread ---------------------------------
    def during(self, scenario: str, started: float, deadline: float) -> Watcher:
        """Start the watcher that makes ``scenario``'s fault during the job (the job's clock
        starts at ``started``); :meth:`Watcher.finish` returns its evidence."""
        watcher = Watcher(self, scenario, started, deadline)
        watcher.start()
        return watcher

    def primaries(self) -> list[Any]:
        """The running nodes that serve slots now, as the first running node says."""
        for node in self._running():
            with contextlib.suppress(Exception):
                ports = {int(r[2][1]) for r in node.client().execute_command("CLUSTER SLOTS")}
                return [n for n in self._running() if n.port in ports]
        return []

    def _running(self) -> list[Any]:
        return [n for n in self.cluster.nodes if n.process and n.process.poll() is None]

    def failover_s(self, since: float, timeout: float = 20.0) -> float | None:
        """Seconds from ``since`` until every slot is served by a running node again (the
        killed primary's replica promoted), or None within ``timeout``."""
        while time.monotonic() - since < timeout:
            for node in self._running():
                with contextlib.suppress(Exception):
                    ranges = node.client().execute_command("CLUSTER SLOTS")
                    ports = {int(r[2][1]) for r in ranges}
                    covered = sum(int(r[1]) - int(r[0]) + 1 for r in ranges)
                    if covered == 16384 and self.killed.port not in ports:
                        return time.monotonic() - since
                    break
            time.sleep(0.05)
        return None


class Watcher(threading.Thread):
    """Waits for its scenario's moment in the job, makes the fault, and records evidence."""

    def __init__(self, servers: Servers, scenario: str, started: float, deadline: float) -> None:
        super().__init__(daemon=True)
        self.servers, self.scenario = servers, scenario
        self.started, self.deadline = started, deadline
        self.evidence: dict[str, Any] = {"landed": False}
        self.done = threading.Event()

    def run(self) -> None:
        try:
            moment = self._lock_held if self.scenario == "killed-lock-holder" else self._published
            while not self.done.is_set() and time.time() < self.deadline:
                found = moment()
                if found is not None:
                    node, evidence = found
                    names = self._keys(node, f"{self.servers.namespace}:*")
                    evidence["locks_held"] = sum(n.endswith(b":lock") for n in names)
                    evidence["entries_held"] = len(names) - evidence["locks_held"]
                    killed_at = time.monotonic()
                    self.servers._kill(node)
                    evidence["at_s"] = round(time.time() - self.started, 3)
                    if self.servers.cluster.replicas:
                        failover = self.servers.failover_s(killed_at)
                        evidence["failover_s"] = None if failover is None else round(failover, 2)
                    self.evidence = {"landed": True, **evidence}
                    return
                time.sleep(POLL_S)
        except Exception as e:  # the evidence says why the fault did not land
            self.evidence = {"landed": False, "error": f"{type(e).__name__}: {e}"}

    def finish(self) -> dict[str, Any]:
        self.done.set()
        self.join(timeout=30)
        return self.evidence

    def _keys(self, node: Any, match: str) -> list[bytes]:
        return list(node.client().scan_iter(match=match, count=1000))

    def _lock_held(self) -> tuple[Any, dict[str, Any]] | None:
        """The moment a build lock is held and polled: a ``:lock`` key whose entry is absent on
        its shard, the lock still held and its entry still absent 0.1 s later, and the shard
        serving commands from the job meanwhile (other processes polling)."""
        namespace = self.servers.namespace
        for node in self.servers.primaries():
            for lock in self._keys(node, f"{namespace}:*:lock"):
                entry = lock[: -len(b":lock")]
                client = node.client()
                if client.exists(entry):
                    continue
                before = int(client.info("stats")["total_commands_processed"])
                time.sleep(0.1)
                after = int(client.info("stats")["total_commands_processed"])
                if not client.exists(lock) or client.exists(entry):
                    continue
                polled = after - before - 3  # less this watcher's own commands
                if polled <= 0:
                    continue
                evidence = {"lock": lock.decode()[-24:], "entry_absent": True, "polls": polled}
                return node, evidence
        return None

    def _published(self) -> tuple[Any, dict[str, Any]] | None:
        """The moment the namespace holds :data:`PUBLICATIONS` entries (locks not counted)."""
        namespace = self.servers.namespace
        primaries = self.servers.primaries()
        entries = 0
        for node in primaries:
            names = self._keys(node, f"{namespace}:*")
            entries += sum(not name.endswith(b":lock") for name in names)
        if entries < PUBLICATIONS:
            return None
        victim = next(n for n in primaries if n.port == self.servers.cluster.nodes[1].port)
        return victim, {"published": entries}
