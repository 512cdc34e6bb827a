"""A job of many machines on this one, for the remote tiers' tests: ``nodes`` x ``per_node``
real processes, each node its own cache root, all sharing remote tiers. Every process asks
``get_or_create_each`` for the same keys (in its own order); a build sleeps ``build_s`` and
appends ``<key> <node> <pid>`` to a log of its own, so that a test counts what was built where. With
``companion``, a build also stores a second entry under a key derived from the first before it
returns, under the first's locks (as the bridge stores a kernel's PTX beside its binary).

:func:`run_job` starts them together (each sleeps until a common start time) and returns what
each printed; :func:`job_processes` starts them and returns at once (for a test that acts on
servers or processes meanwhile; :func:`finish` collects them). Each process also reports the
seconds its own (main) thread spent in calls to each of its tiers (``waits``, by the tier's
class name: its gets, puts, lock tries and releases), as the job sees them: what a tier does in
a background thread is not a wait of the job.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import textwrap
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from support import child_env

META = {"name": "kernel", "target": "cuda:90"}

WORKER = textwrap.dedent(
    """
    import hashlib, json, logging, os, sys, threading, time
    import kernelcache
    cfg = json.loads(sys.argv[1])
    warnings = []

    class Keep(logging.Handler):
        def emit(self, record):
            warnings.append(record.getMessage())

    logging.getLogger("kernelcache").addHandler(Keep(logging.WARNING))
    cache = kernelcache.Cache(
        cfg["root"], readonly_roots=[], remote=cfg["url"], lock_timeout=cfg["lock_timeout"]
    )
    built = []
    waits = {}
    inside = threading.local()

    def timed(fn, name):
        def call(*args, **kw):
            if threading.current_thread() is not threading.main_thread() or getattr(
                inside, "busy", False
            ):
                return fn(*args, **kw)
            inside.busy, started = True, time.monotonic()
            try:
                out = fn(*args, **kw)
            finally:
                inside.busy = False
                waits[name] = waits.get(name, 0.0) + time.monotonic() - started
            return timed(out, name) if callable(out) else out  # a lock's release

        return call

    for tier in getattr(cache.remote, "tiers", [cache.remote]):
        for method in ("get", "put", "put_outcome", "try_acquire", "acquire"):
            if callable(getattr(tier, method, None)):
                setattr(tier, method, timed(getattr(tier, method), type(tier).__name__))

    def build(key):
        def fn():
            fd = os.open(cfg["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
            os.write(fd, f"{key} {cfg['node']} {os.getpid()}\\n".encode())
            os.close(fd)
            time.sleep(cfg["build_s"])
            data = key.encode() * 64
            if cfg["companion"]:
                companion = hashlib.sha256(key.encode()).hexdigest()
                try:
                    cache.put(companion, "txt", data, {"name": "companion"})
                except kernelcache.CacheError:
                    pass
            built.append(key)
            return data, {"name": "kernel", "target": "cuda:90"}

        return fn

    time.sleep(max(0.0, cfg["start_at"] - time.time()))
    started = time.monotonic()
    items = [kernelcache.BuildItem(k, "bin", build(k)) for k in cfg["keys"]]
    order, sources = [], {}
    for index, art in cache.get_or_create_each(items):
        assert art.data == cfg["keys"][index].encode() * 64, cfg["keys"][index]
        order.append(cfg["keys"][index])
        sources[cfg["keys"][index]] = art.source
    print(json.dumps({
        "node": cfg["node"], "seconds": time.monotonic() - started, "order": order,
        "built": built, "sources": sources, "stats": kernelcache.process_stats(),
        "tier": getattr(cache.remote, "counters", {}), "warnings": warnings, "waits": waits,
    }))
    """
)


def companion_of(key: str) -> str:
    """The key of the entry a ``companion`` build stores beside ``key``'s."""
    return hashlib.sha256(key.encode()).hexdigest()


@dataclass
class Job:
    """What the processes of a job printed, and what was built (a Counter of keys)."""

    results: list[dict]
    builds: Counter[str]

    @property
    def seconds(self) -> float:
        """The longest time a process took (from the common start to its last key)."""
        return max(r["seconds"] for r in self.results)

    def warnings(self, text: str) -> list[str]:
        """Every warning of every process that contains ``text``."""
        return [w for r in self.results for w in r["warnings"] if text in w]


def job_processes(
    url: str,
    directory: Path,
    keys: Sequence[str],
    *,
    nodes: int = 2,
    per_node: int = 2,
    build_s: float = 0.2,
    companion: bool = False,
    lock_timeout: float = 20.0,
    start_in: float = 1.0,
    wrap: dict[int, list[str]] | None = None,
    env: dict[str, str] | None = None,
) -> tuple[list[subprocess.Popen[str]], Path]:
    """Start the job's processes (node ``n``'s root is ``directory/node<n>``; ``wrap[n]``, if
    given, is a command line that runs the rest of node ``n``'s command lines, e.g. in a mount
    namespace); the processes and the build log."""
    logs = directory / "builds"
    logs.mkdir(parents=True, exist_ok=True)
    start_at = time.time() + start_in
    procs = []
    for index in range(nodes * per_node):
        node = index // per_node
        shift = index % len(keys)
        cfg = {
            "url": url,
            "root": str(directory / f"node{node}"),
            "node": node,
            "keys": list(keys[shift:]) + list(keys[:shift]),
            "log": str(logs / f"{index}.log"),
            "build_s": build_s,
            "companion": companion,
            "lock_timeout": lock_timeout,
            "start_at": start_at,
        }
        argv = [sys.executable, "-c", WORKER, json.dumps(cfg)]
        procs.append(
            subprocess.Popen(
                [*(wrap or {}).get(node, []), *argv],
                env=child_env(**(env or {})),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    return procs, logs


def finish(procs: list[subprocess.Popen[str]], logs: Path, timeout: float = 120) -> Job:
    """Wait for the job's processes; what they printed and built.

    Raises:
        AssertionError: a process failed (its stderr is shown).
    """
    results = []
    for p in procs:
        out, err = p.communicate(timeout=timeout)
        assert p.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    lines = [line for log in logs.iterdir() for line in log.read_text().splitlines()]
    return Job(results, Counter(line.split()[0] for line in lines))


def run_job(url: str, directory: Path, keys: Sequence[str], **options: object) -> Job:
    """:func:`job_processes`, then :func:`finish`."""
    procs, logs = job_processes(url, directory, keys, **options)  # type: ignore[arg-type]
    return finish(procs, logs)
