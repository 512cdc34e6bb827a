"""Circuit breakers shared through the cache root: a tier that one process found hung is
skipped by the other processes of the root, not waited on again by each (real processes, a
real hung server); the files are untrusted (links, other users' files, times far ahead)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest
from redis_server import blackhole
from support import child_env

from kernelcache.remote.breakers import BREAKER_DIR, SharedBreakers

GET = """
import json, sys, time
import kernelcache
cache = kernelcache.Cache(sys.argv[1], readonly_roots=[], remote=sys.argv[2])
start = time.monotonic()
found = cache.get("ab" * 32, "bin")
print(json.dumps({"found": found is not None, "took": time.monotonic() - start,
                  "tier": cache.remote.counters}))
"""


def _get(root, url) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(GET), str(root), url],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_a_hung_tier_costs_the_first_process_of_a_root_one_timeout_and_the_others_none(tmp_path):
    with blackhole() as port:
        url = f"redis://127.0.0.1:{port}/0?timeout=1&breaker=60"
        first = _get(tmp_path / "root", url)
        assert first["took"] >= 0.9 and first["tier"]["breaker_trips"] == 1
        later = [_get(tmp_path / "root", url) for _ in range(3)]
        other_root = _get(tmp_path / "other", url)
    for result in later:
        assert result["took"] < 0.5 and result["tier"].get("breaker_trips", 0) == 0
        assert result["tier"]["skipped"] >= 1 and result["tier"].get("gets", 0) == 0
    assert other_root["took"] >= 0.9, "a breaker is shared by the processes of one root only"


def test_a_breaker_ends_when_its_time_is_up(tmp_path):
    breakers = SharedBreakers(str(tmp_path), "redis://x")
    assert breakers.until("", 60) == 0.0
    assert breakers.trip("", 0.3) and breakers.trip("10.0.0.1:7000", 60)
    assert breakers.until("", 60) > time.time()
    assert breakers.until("10.0.0.1:7000", 60) > time.time() + 50
    assert breakers.until("10.0.0.2:7000", 60) == 0.0, "one shard's breaker is its own"
    time.sleep(0.4)
    assert breakers.until("", 60) == 0.0


def test_breaker_files_are_untrusted(tmp_path):
    breakers = SharedBreakers(str(tmp_path), "redis://x")
    assert breakers.trip("", 10)
    (name,) = os.listdir(tmp_path / BREAKER_DIR)
    path = tmp_path / BREAKER_DIR / name
    far = time.time() + 10 * 365 * 86400
    os.utime(path, (far, far))  # a neighbour's clock gone wrong: at most the breaker's length
    assert time.time() < breakers.until("", 30) <= time.time() + 30
    path.unlink()
    target = tmp_path / "elsewhere"
    target.write_text("")
    os.utime(target, (far, far))
    path.symlink_to(target)
    assert breakers.until("", 30) == 0.0, "a link is not a breaker"
    assert not breakers.trip("", 10) and os.stat(target).st_mtime == pytest.approx(far)


def test_a_root_that_cannot_hold_breakers_keeps_them_in_the_process(tmp_path):
    (tmp_path / "a-file").write_text("")
    missing = SharedBreakers(str(tmp_path / "a-file" / "root"), "redis://x")
    assert not missing.trip("", 10) and missing.until("", 10) == 0.0
    (tmp_path / BREAKER_DIR).write_text("not a directory")
    assert not SharedBreakers(str(tmp_path), "redis://x").trip("", 10)


def test_a_root_with_breakers_verifies_clean_in_a_process_that_never_opened_a_tier(tmp_path):
    """The breakers' directory is the cache's own: ``kernelcache verify`` (which imports no
    tier) neither calls it foreign nor touches it."""
    root = tmp_path / "root"
    assert SharedBreakers(str(root), "redis://h:6379/0").trip("", 30.0)
    done = subprocess.run(
        [sys.executable, "-m", "kernelcache.cli", "verify", "--root", str(root), "--json"],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout)["problems"] == []
    assert len(os.listdir(root / BREAKER_DIR)) == 1


def test_a_first_contact_is_shared_through_the_root_and_its_files_are_untrusted(tmp_path):
    """One process of a root makes the first contact with a tier; another sees it in flight,
    then its answer; one past its end is taken over; a link planted in its place is neither
    followed nor shared."""
    maker = SharedBreakers(str(tmp_path), "s3://b/kc")
    other = SharedBreakers(str(tmp_path), "s3://b/kc")
    assert maker.begin_probe("", 5.0) is None, "the first process makes it"
    in_flight = other.begin_probe("", 5.0)
    assert in_flight is not None and other.probe_state("") == (in_flight, 0.0)
    maker.end_probe("", answered=True)
    current, alive = other.probe_state("")
    assert current is None and time.time() - 5 < alive <= time.time()
    assert maker.begin_probe("x", -2.0) is None  # a first contact past its end: a dead maker's
    assert other.begin_probe("x", 5.0) is None, "taken over"
    name = next(n for n in os.listdir(tmp_path / BREAKER_DIR) if n.endswith(".probe"))
    path = tmp_path / BREAKER_DIR / name
    path.unlink()
    target = tmp_path / "elsewhere"
    target.write_text("")
    path.symlink_to(target)
    assert other.probe_state("x")[0] is None, "a link is not a first contact"
    assert other.begin_probe("x", 5.0) is None and path.is_symlink()
    assert target.read_text() == "" and os.stat(target).st_mtime < time.time() + 1
