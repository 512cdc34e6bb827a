"""Processes of a job that share one remote tier, for the remote tiers' tests: :func:`key_of`
(keys shaped as real ones are), :func:`start_workers` (each process ``get_or_create``s its keys,
in its own order, on a root of its own) and :func:`finish` (what each reported).
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from support import child_env


def key_of(i: int) -> str:
    """A key as real ones are (a digest: its group, its first characters, spreads over a
    cluster's slots)."""
    return hashlib.sha256(str(i).encode()).hexdigest()[:32]


# A job process: get_or_create every key (in its own order) on its own root, sharing Redis.
WORKER = textwrap.dedent(
    """
    import json, os, sys, time
    import kernelcache
    url, root, builds, build_s, start_at, keys = sys.argv[1:7]
    cache = kernelcache.Cache(root, readonly_roots=[], remote=url, lock_timeout=20)
    time.sleep(max(0.0, float(start_at) - time.time()))
    def build(key):
        def fn():
            fd = os.open(builds, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
            os.write(fd, f"{key} {os.getpid()}\\n".encode())
            os.close(fd)
            time.sleep(float(build_s))
            return (key.encode() * 2048, {"name": "k"})
        return fn
    sources = {}
    started = time.monotonic()
    for key in json.loads(keys):
        art = cache.get_or_create(key, "bin", build(key))
        assert art.data == key.encode() * 2048, key
        sources[key] = art.source
    print(json.dumps({"sources": sources, "seconds": time.monotonic() - started,
                      "stats": kernelcache.process_stats(), "tier": cache.remote.counters}))
    """
)


def start_workers(url: str, tmp_path: Path, key_lists: list[list[str]], build_s: float):
    """A process per list of ``key_lists``, sharing the tier at ``url`` (each starts a second
    from now, together); every build appends ``<key> <pid>`` to the log returned beside them."""
    builds = tmp_path / "builds.log"
    start_at = time.time() + 1.0
    tail = [str(build_s), str(start_at)]
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                WORKER,
                url,
                str(tmp_path / f"node{i}"),
                str(builds),
                *tail,
                json.dumps(keys),
            ],
            env=child_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i, keys in enumerate(key_lists)
    ]
    return procs, builds


def finish(procs, timeout: float = 60) -> list[tuple[dict, str]]:
    """What each of ``procs`` printed last (a JSON document), and its standard error."""
    results = []
    for p in procs:
        out, err = p.communicate(timeout=timeout)
        assert p.returncode == 0, err
        results.append((json.loads(out.strip().splitlines()[-1]), err))
    return results
