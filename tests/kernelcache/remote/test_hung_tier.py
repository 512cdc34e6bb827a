"""A hung tier costs a node one wait, where a job would see it (real processes, a real Redis
server and a real S3-compatible server made to hang with SIGSTOP): processes that start
together share the first request to a tier; a request in flight is abandoned as soon as another
process of the node finds the tier hung, and nothing waits on it after that; a put below a tier
that holds the entry is made in the background, bounded at exit."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
import time

import pytest
from object_store import MotoProcess, moto_available, s3_env
from redis_server import REDIS_SERVER, SKIP_REASON
from remote_job import run_job
from remote_workers import key_of
from support import child_env

from kernelcache.remote.contact import FIRST_ANSWER_WAIT
from kernelcache.remote.layered import EXIT_WAIT

pytestmark = [
    pytest.mark.skipif(REDIS_SERVER is None, reason=SKIP_REASON),
    pytest.mark.skipif(not moto_available(), reason="needs moto and obstore (test extra)"),
]

META = {"name": "kernel", "target": "cuda:90"}


@pytest.fixture(scope="module")
def moto():
    """moto's S3 server in a process of its own (so that a test can stop it)."""
    with s3_env(), MotoProcess() as server:
        yield server


def _bucket(moto, request, options: str) -> str:
    """A bucket of the test's own, its tier's URL with ``options``."""
    name = re.sub("[^a-z0-9]+", "-", request.node.name.lower())[-40:].strip("-")
    return moto.bucket("kc-" + name) + options


def test_a_cold_job_behind_a_hung_bucket_waits_one_timeout_per_node(
    moto, server, tmp_path, request
):
    """2 nodes x 2 processes, Redis over a stopped bucket (timeout 3 s): each node's processes
    wait on the bucket one timeout and one FIRST_ANSWER_WAIT at most in all (not a timeout
    each), every key is built once, and the next job waits on the bucket not at all."""
    timeout = 3.0
    url = f"{server.url} {_bucket(moto, request, f'&timeout={timeout:g}s&breaker=60')}"
    keys = [key_of(700 + i) for i in range(4)]
    with moto.hung():
        first = run_job(url, tmp_path / "first", keys, build_s=0.3)
        second = run_job(url, tmp_path / "second", keys, build_s=0.3)
    per_node = [0.0, 0.0]
    for r in first.results:
        per_node[r["node"]] += r["waits"].get("ObjectStoreTier", 0.0)
    assert all(w <= timeout + FIRST_ANSWER_WAIT + 0.7 for w in per_node), per_node
    assert max(per_node) >= timeout - 0.1, "the bucket was asked, and waited for, once a node"
    assert first.builds == dict.fromkeys(keys, 1)
    timeouts = [
        r["tier"][label]["timeouts"]
        for r in first.results
        for label in r["tier"]
        if label.startswith("s3://") and "timeouts" in r["tier"][label]
    ]
    assert sum(timeouts) <= 2, "one request timed out a node, at most"
    assert not second.builds
    assert all(r["waits"].get("ObjectStoreTier", 0.0) < 0.05 for r in second.results)


def test_processes_that_start_together_use_a_healthy_tier_once_its_first_contact_answers(
    moto, server, tmp_path, request
):
    """The same job with the bucket healthy and holding every entry (Redis empty): the
    processes that waited for another's first contact go on with the bucket when it answers:
    nothing is skipped, nothing built."""
    from kernelcache.remote import ObjectStoreTier

    bucket = _bucket(moto, request, "&breaker=60")
    keys = [key_of(750 + i) for i in range(4)]
    seeded = ObjectStoreTier(bucket)
    for key in keys:
        assert seeded.put(key, "bin", key.encode() * 64, META)
    job = run_job(f"{server.url} {bucket}", tmp_path, keys, build_s=0.3)
    assert not job.builds
    labels = {label for r in job.results for label in r["tier"] if label.startswith("s3://")}
    assert len(labels) == 1
    (label,) = labels
    assert all(r["tier"][label].get("skipped", 0) == 0 for r in job.results), job.results
    assert sum(r["tier"][label].get("hits", 0) for r in job.results) >= len(keys)


GET_AT = textwrap.dedent(
    """
    import json, sys, time
    import kernelcache
    url, root, at = sys.argv[1], sys.argv[2], float(sys.argv[3])
    cache = kernelcache.Cache(root, readonly_roots=[], remote=url)
    time.sleep(max(0.0, at - time.time()))
    start = time.monotonic()
    assert cache.get("ab" * 32, "bin") is None
    print(json.dumps({"took": time.monotonic() - start, "tier": cache.remote.counters}))
    """
)


def test_processes_of_a_node_that_start_together_ask_a_hung_server_once(server, tmp_path):
    """Three processes of one root ask a stopped Redis server at the same moment (timeout
    2 s): one of them asks, the others wait a second at most for its answer; one request
    times out in all, and the three wait one timeout and two seconds at most together."""
    timeout = 2.0
    url = f"{server.url}?timeout={timeout:g}s&breaker=60"
    at = time.time() + 1.5
    argv = [sys.executable, "-c", GET_AT, url, str(tmp_path / "root"), str(at)]
    with server_hung(server)():
        procs = [
            subprocess.Popen(argv, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            for _ in range(3)
        ]
        outs = [p.communicate(timeout=60) for p in procs]
    for p, (_, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-3000:]
    results = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
    assert sum(r["tier"].get("timeouts", 0) for r in results) == 1, results
    assert sum(r["took"] for r in results) <= timeout + 2 * FIRST_ANSWER_WAIT + 0.7, results


WORKER = textwrap.dedent(
    """
    import json, sys, time
    import kernelcache
    cfg = json.loads(sys.argv[1])
    cache = kernelcache.Cache(cfg["root"], readonly_roots=[], remote=cfg["url"])
    tier = cache.remote
    assert tier.get(cfg["keys"][0], "bin") is None  # in contact with the tier
    claim = tier.try_acquire(cfg["keys"][1])
    assert callable(claim), claim
    time.sleep(max(0.0, cfg["ask_at"] - time.time()))
    took = {}
    for what, call in (
        ("get", lambda: tier.get(cfg["keys"][2], "bin")),
        ("put", lambda: tier.put(cfg["keys"][3], "bin", b"x" * 64, {"name": "k"})),
        ("lock", lambda: tier.try_acquire(cfg["keys"][4])),
        ("release", claim),
    ):
        start = time.monotonic()
        call()
        took[what] = time.monotonic() - start
    print(json.dumps({"took": took, "tier": tier.counters}))
    """
)


@pytest.mark.parametrize("kind", ["redis", "s3"])
def test_a_request_in_flight_is_abandoned_when_another_process_finds_the_tier_hung(
    kind, moto, server, tmp_path, request
):
    """Two processes of one root, in contact with the tier, each holding a build lock; the
    server stops; the first asks at once and times out (4 s), the second asks 2 s later: its
    request is abandoned when the first's opens the breaker (about 2 s, not 4), and its put,
    lock try and lock release then wait for nothing."""
    timeout = 4.0
    options = f"timeout={timeout:g}s&breaker=60&lease=60s"  # (no renewal during the test)
    if kind == "redis":
        url = f"{server.url}?{options}"
    else:
        url = _bucket(moto, request, f"&{options}")
    hang = moto.hung if kind == "s3" else server_hung(server)
    stop_at = time.time() + 3.0
    procs = []
    for index, delay in enumerate((0.3, 2.3)):
        cfg = {
            "url": url,
            "root": str(tmp_path / "root"),
            "keys": [key_of(800 + 10 * index + i) for i in range(5)],
            "ask_at": stop_at + delay,
        }
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", WORKER, json.dumps(cfg)],
                env=child_env(),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    time.sleep(max(0.0, stop_at - time.time()))
    with hang():
        outs = [p.communicate(timeout=60) for p in procs]
    for p, (_, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-3000:]
    found, late = (json.loads(out.strip().splitlines()[-1]) for out, _ in outs)
    assert timeout - 0.2 < found["took"]["get"] < timeout + 1.0
    assert found["tier"]["timeouts"] == 1 and "abandoned" not in found["tier"]
    assert late["took"]["get"] < timeout - 0.8, late
    assert late["tier"]["abandoned"] == 1 and late["tier"].get("timeouts", 0) == 0
    for result in (found, late):
        assert all(result["took"][w] < 0.3 for w in ("put", "lock", "release")), result


def server_hung(server):
    """A context that stops the Redis ``server`` for its block (a stopped process answers no
    command, while the kernel still accepts connections), resumed after."""
    import contextlib

    @contextlib.contextmanager
    def hung():
        server.pause()
        try:
            yield
        finally:
            server.resume()

    return hung


PUTTER = textwrap.dedent(
    """
    import json, sys, time
    import kernelcache
    url, root, key = sys.argv[1:4]
    cache = kernelcache.Cache(root, readonly_roots=[], remote=url)
    start = time.monotonic()
    cache.put(key, "bin", b"y" * 256, {"name": "k", "target": "cuda:90"})
    print(json.dumps({"put": time.monotonic() - start}), flush=True)
    """
)


def test_a_put_below_a_tier_that_holds_the_entry_is_made_in_the_background(
    moto, server, tmp_path, request
):
    """Redis over a stopped bucket (timeout 20 s): the put returns once Redis holds the entry,
    and the process exits after EXIT_WAIT at most, not after the bucket's timeout; with the
    bucket healthy the background put lands there."""
    bucket = _bucket(moto, request, "&timeout=20s")
    url = f"{server.url} {bucket}"
    key = key_of(900)
    with moto.hung():
        start = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-c", PUTTER, url, str(tmp_path / "a"), key],
            env=child_env(),
            capture_output=True,
            text=True,
            timeout=60,
        )
        took = time.monotonic() - start
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout)["put"] < 1.0
    assert took < EXIT_WAIT + 8.0, "the exit waited for the bucket's timeout"
    from kernelcache.remote import ObjectStoreTier, open_remote

    assert open_remote(server.url).get(key, "bin") is not None  # Redis was waited for
    other = key_of(901)
    done = subprocess.run(
        [sys.executable, "-c", PUTTER, url, str(tmp_path / "b"), other],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert ObjectStoreTier(bucket).get(other, "bin") is not None  # made before the exit
