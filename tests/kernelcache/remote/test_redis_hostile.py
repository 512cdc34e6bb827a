"""A server that answers what it likes: whatever a Redis (or a cluster's slot map) replies, a
job's call ends within its bounds and never raises, a build lock's release or renewal that
fails is a failure of the tier, and an operator's count or probe ends in bounded time."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
import time

from redis_server import scripted
from remote_workers import key_of
from support import child_env

import kernelcache
from kernelcache.remote import RedisTier
from kernelcache.remote.leases import Leases
from kernelcache.remote.redis.scripts import SHAS

SCRIPT_OF = {sha.encode(): name for name, sha in SHAS.items()}
NULL = b"$-1\r\n"
#: an array nested past Python's recursion limit
NESTED = b"*1\r\n" * 3000 + b":1\r\n"


def _script(command: list[bytes]) -> str | None:
    """The tier's script a command runs (EVALSHA), or None."""
    return SCRIPT_OF.get(command[1]) if command[0].upper() == b"EVALSHA" else None


def _plain(command: list[bytes]) -> bytes:
    """What a server says to what is not a script: the connection's set-up (RESP3's HELLO
    too), a PING."""
    name = command[0].upper()
    if name == b"HELLO":
        return b"%1\r\n$5\r\nproto\r\n:3\r\n"
    return b"+PONG\r\n" if name == b"PING" else b"+OK\r\n"


def test_a_release_answered_past_the_recursion_limit_fails_the_release_not_the_job(tmp_path):
    """redis-py's RecursionError on the release's reply escaped get_or_create into the job."""
    released = []

    def answer(command: list[bytes]) -> bytes:
        script = _script(command)
        if script == "acquire":
            return b"*2\r\n:1\r\n$0\r\n\r\n"  # taken
        if script == "release":
            released.append(command)
            return NESTED
        return NULL if script == "get" else _plain(command)

    with scripted(answer) as port:
        cache = kernelcache.Cache(tmp_path / "root", (), f"redis://127.0.0.1:{port}/0")
        key = key_of(1)
        art = cache.get_or_create(key, "bin", lambda: (b"built", {"name": "k"}))
        assert art.data == b"built"
        assert released, "the lock was taken and released"
        assert cache.get(key, "bin").data == b"built"


_PUSHED = """
import sys, time, kernelcache
cache = kernelcache.Cache(sys.argv[2], (), f"redis://127.0.0.1:{sys.argv[1]}/0")
started = time.monotonic()
print(cache.get(sys.argv[3], "bin"), round(time.monotonic() - started, 1), flush=True)
"""


def test_a_push_naming_a_timer_and_an_address_is_never_acted_on(tmp_path):
    """Under RESP3 a MOVING push made redis-py start a timer of the server's length (100,000 s
    here) that held the process at its exit, and move its connections where the push said."""
    seen = []

    def answer(command: list[bytes]) -> bytes:
        seen.append(command[0].upper())
        if _script(command) == "get":
            ep = b"127.0.0.1:1"
            return b">4\r\n$6\r\nMOVING\r\n:1\r\n:100000\r\n$%d\r\n%s\r\n" % (len(ep), ep) + NULL
        return _plain(command)

    with scripted(answer) as port:
        started = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(_PUSHED), str(port), str(tmp_path), key_of(2)],
            capture_output=True,
            text=True,
            timeout=60,
            env=child_env(),
        )
        elapsed = time.monotonic() - started
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[0] == "None"  # a reply it cannot read: a miss
    assert elapsed < 30, elapsed
    assert b"HELLO" not in seen  # RESP2: no protocol upgrade asked for


def test_a_scan_that_never_ends_is_stopped_and_said_incomplete():
    """A server whose SCAN always gave cursor 7 and no key kept `stats --remote` and doctor
    counting forever (530,000 calls in 30 s); one that gives a new cursor each time is
    stopped by the time (20 timeouts)."""
    scans = []

    def answer(command: list[bytes]) -> bytes:
        if command[0].upper() == b"SCAN":
            scans.append(command)
            cursor = b"7" if mode == "same" else str(7 + len(scans)).encode()
            return b"*2\r\n$%d\r\n%s\r\n*0\r\n" % (len(cursor), cursor)
        if command[0].upper() == b"DBSIZE":
            return b":5\r\n"
        return _plain(command)

    for mode, timeout in (("same", 1.0), ("new", 0.1)):
        scans.clear()
        with scripted(answer) as port:
            tier = RedisTier(f"redis://127.0.0.1:{port}/0?timeout={timeout}")
            started = time.monotonic()
            usage = tier.usage()
            elapsed = time.monotonic() - started
            tier.close()
        assert usage["complete"] is False, mode
        if mode == "same":  # a cursor given twice: the scan went round
            assert usage["entries"] == 0 and usage["server_keys"] == 5 and len(scans) == 2
        assert elapsed < 40 * timeout, (mode, elapsed)  # 20 timeouts at most


def _slot_map(hosts: list[str], port: int) -> bytes:
    """CLUSTER SLOTS: the 16,384 slots spread over one primary at each of ``hosts``."""
    rows, per = [], 16384 // len(hosts)
    for i, host in enumerate(hosts):
        last = 16383 if i == len(hosts) - 1 else (i + 1) * per - 1
        node = b"*2\r\n$%d\r\n%s\r\n:%d\r\n" % (len(host), host.encode(), port)
        rows.append(b"*3\r\n:%d\r\n:%d\r\n" % (i * per, last) + node)
    return b"*%d\r\n" % len(hosts) + b"".join(rows)


SILENT = [f"127.0.{1 + i // 200}.{1 + i % 200}" for i in range(60)]


def test_probing_a_slot_map_of_silent_primaries_ends_in_bounded_time():
    """A map naming N primaries that never answer made `stats --remote` and doctor probe each
    for a whole timeout (2,000 of them at 0.5 s: 17 minutes)."""

    def answer(command: list[bytes]) -> bytes | None:
        if command[0].upper() == b"CLUSTER":
            return _slot_map(["127.0.0.1", *SILENT], port)
        return _plain(command) if command[0].upper() != b"PING" else None  # silent

    with scripted(answer, host="0.0.0.0") as port:
        tier = RedisTier(f"redis+cluster://127.0.0.1:{port}?timeout=0.1")
        started = time.monotonic()
        why = tier.probe()
        elapsed = time.monotonic() - started
        tier.close()
    assert why is not None and "primaries not asked in time" in why, why
    assert elapsed < 4, elapsed  # 61 primaries x 0.1 s: 6 s; bounded at 8 calls' time: 0.8 s


_MOVED = """
import logging, os, sys, time, kernelcache
logging.disable(logging.WARNING)
cache = kernelcache.Cache(sys.argv[2], (), f"redis+cluster://127.0.0.1:{sys.argv[1]}?timeout=0.1")
worst = 0.0
for _ in range(30):
    started = time.monotonic()
    cache.get(os.urandom(16).hex(), "bin")
    worst = max(worst, time.monotonic() - started)
print(round(worst, 2))
"""


def test_moved_replies_that_never_settle_cost_each_lookup_a_bounded_time(tmp_path):
    """Every lookup answered MOVED and every later CLUSTER SLOTS never: each read of the map
    tried every primary known, so the k-th lookup waited about k timeouts."""
    maps = []

    def answer(command: list[bytes]) -> bytes | None:
        if command[0].upper() == b"CLUSTER":
            maps.append(command)
            return _slot_map(SILENT, port) if len(maps) == 1 else None
        if _script(command) == "get":
            return b"-MOVED 0 127.0.0.1:%d\r\n" % port
        return _plain(command)

    with scripted(answer, host="0.0.0.0") as port:
        done = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(_MOVED), str(port), str(tmp_path)],
            capture_output=True,
            text=True,
            timeout=120,
            env=child_env(),
        )
    assert done.returncode == 0, done.stderr
    # one read of the map asks at most 3 nodes: (0.1 + 0.1) x 3, plus the lookup's own tries
    assert float(done.stdout.split()[-1]) < 2.0, done.stdout


def test_a_renewal_that_raises_leaves_the_renewals_going(caplog):
    """A renewal's exception killed the leases' thread: no lock of the tier was renewed again."""
    calls = []

    def renew(seconds: float) -> bool:
        calls.append(seconds)
        if len(calls) == 1:
            raise RecursionError("maximum recursion depth exceeded")
        return True

    leases = Leases(lease=0.15, longest=60.0, lost=lambda: None)
    caplog.set_level(logging.DEBUG, "kernelcache.remote")
    leases.hold("token", renew)
    deadline = time.monotonic() + 10
    while len(calls) < 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    leases.drop("token")
    assert len(calls) >= 3, calls
    assert "renewal raised" in caplog.text
