"""The size cap of a writable root (``KERNELCACHE_MAX_SIZE``, ``Cache(max_size=)``): real
processes putting at once keep the root under it, least recently used entries go first, one
eviction pass runs at a time, read-only roots are never touched; what another writer puts in the
usage file cannot keep passes from running nor cost a put time or memory, and a burst of
writers never takes the root past twice the cap."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from cli_support import files_under, kc, kc_json, put
from support import child_env, run_py

import kernelcache
from kernelcache.capacity.usage import PASS_LOCK, RECORD, entries_of, replace_usage, usage_record
from kernelcache.errors import ConfigError
from kernelcache.store.locks import Locker

#: the extension of the artifacts these tests store: one without a structural check (what they
#: hold is random bytes of a given size)
EXT = "bin"

PUTTER = """
import hashlib, os, sys
import kernelcache
tag, count, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
cache = kernelcache.Cache()
for i in range(count):
    key = hashlib.sha256(f"{tag}-{i}".encode()).hexdigest()
    cache.put(key, "bin", os.urandom(size), {"name": tag, "target": "cuda:90"})
print("put", flush=True)
if cache.capacity:
    cache.capacity.wait()
print(cache.capacity.passes if cache.capacity else -1)
"""


def start_putters(
    root: Path, tags: list[str], count: int, size: int, **env: str
) -> list[subprocess.Popen[str]]:
    """Start one process per tag, each putting ``count`` entries of ``size`` bytes into
    ``root``."""
    return [
        subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(PUTTER), tag, str(count), str(size)],
            env=child_env(KERNELCACHE_DIR=str(root), **env),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for tag in tags
    ]


def finish(procs: list[subprocess.Popen[str]]) -> list[tuple[int, str]]:
    """Wait for putters: the eviction passes each ran, and what each wrote to stderr."""
    done = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        done.append((int(out.split()[-1]), err))
    return done


def putters(root: Path, tags: list[str], count: int, size: int, **env: str) -> list[int]:
    """Run one process per tag at once, each putting ``count`` entries of ``size`` bytes into
    ``root``; the eviction passes each ran."""
    return [passes for passes, _ in finish(start_putters(root, tags, count, size, **env))]


def test_processes_putting_at_once_keep_the_root_under_the_cap(tmp_path):
    root, image = tmp_path / "cache", tmp_path / "image"
    for i in range(5):
        put(image, "baked", size=20_000, seed=i, ext=EXT)
    baked = files_under(image)
    cap = 300_000
    passes = putters(
        root,
        ["a", "b", "c"],
        count=60,
        size=8_000,
        KERNELCACHE_MAX_SIZE="300000B",
        KERNELCACHE_READONLY_DIRS=str(image),
    )
    doc = kc_json(root, "stats")
    # 180 entries of ~8.4 KB were written (1.5 MB): the root holds at most the cap, give or
    # take the puts that raced with the last pass
    assert 0 < doc["bytes"] <= cap * 1.15, doc["bytes"]
    assert doc["entries"] < 60
    assert sum(passes) >= 1
    assert files_under(image) == baked  # a read-only root is never evicted from
    assert kc_json(root, "verify")["clean"]


def test_least_recently_used_entries_go_first(tmp_path):
    root = tmp_path / "cache"
    # entries of ~10.4 KB: 10 old ones (the higher i, the older), 5 recent ones
    old = [
        put(root, "old", size=10_000, seed=i, last_used=2 * 86400 + i, ext=EXT) for i in range(10)
    ]
    recent = [put(root, "recent", size=10_000, seed=i, last_used=60 + i, ext=EXT) for i in range(5)]
    # the 20th entry passes the cap (200K): one pass keeps 80% of it, 15 entries, so the 5
    # least recently used go: the 5 oldest of the old ones
    (passes,) = putters(root, ["new"], count=5, size=10_000, KERNELCACHE_MAX_SIZE="200K")
    assert passes >= 1  # (the first measured the root, in its helper, while the puts went on)
    keys = {e["key"] for e in kc_json(root, "ls")["entries"]}
    assert keys & {a.key for a in old} == {a.key for a in old[:5]}
    assert {a.key for a in recent} <= keys
    assert len(keys) == 15


def test_one_eviction_pass_at_a_time(tmp_path):
    root = tmp_path / "cache"
    for i in range(10):
        put(root, "old", size=10_000, seed=i, last_used=86400, ext=EXT)
    held = Locker(str(root)).acquire(PASS_LOCK, shared=False, timeout=0)
    child = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(PUTTER), "new", "5", "10000"],
        env=child_env(KERNELCACHE_DIR=str(root), KERNELCACHE_MAX_SIZE="50K"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout.readline().strip() == "put"  # every put returned: none waited
        time.sleep(0.3)  # (its pass tries the lock meanwhile)
        assert kc_json(root, "stats")["entries"] == 15  # nothing evicted while another holds it
    finally:
        held.release()
    out, err = child.communicate(timeout=60)
    assert child.returncode == 0, err
    assert int(out.split()[-1]) == 1  # the pass tried again, and ran once the lock was free
    assert kc_json(root, "stats")["bytes"] <= 50 * 1024


def test_no_cap_by_default_and_sizes_read_with_the_one_parser(tmp_path, monkeypatch):
    assert kernelcache.Cache(tmp_path / "a").capacity is None
    assert kernelcache.Cache(tmp_path / "b", max_size="50G").capacity.max_size == 50 << 30
    monkeypatch.setenv("KERNELCACHE_MAX_SIZE", "1.5GiB")
    assert kernelcache.Cache(tmp_path / "c").capacity.max_size == int(1.5 * (1 << 30))
    assert kernelcache.Cache(tmp_path / "d", max_size=0).capacity is None
    with pytest.raises(ValueError, match="invalid size 'lots'"):
        kernelcache.Cache(tmp_path / "e", max_size="lots")
    monkeypatch.setenv("KERNELCACHE_MAX_SIZE", "lots")
    with pytest.raises(ConfigError, match="KERNELCACHE_MAX_SIZE='lots'"):
        kernelcache.config.settings()  # what every command checks first (exit 2)
    uncapped = kernelcache.Cache(tmp_path / "f")  # a job is never failed for it: no cap
    assert uncapped.capacity is None and uncapped.get_or_create(
        "ab" * 32, "bin", lambda: (b"x", {})
    )
    assert (tmp_path / "f" / f"{'ab' * 32}.bin").exists()


def test_stats_shows_the_cap(tmp_path):
    put(tmp_path / "cache", ext=EXT)
    env = {"KERNELCACHE_MAX_SIZE": "1M"}
    doc = kc_json(tmp_path / "cache", "stats", env=env)
    assert doc["max_size"] == 1 << 20
    human = kc(tmp_path / "cache", "stats", env=env).stdout
    assert "Size cap:" in human and "% used; KERNELCACHE_MAX_SIZE)" in human
    prom = kc(tmp_path / "cache", "stats", "--format", "prometheus", env=env).stdout
    assert "# TYPE kernelcache_max_size_bytes gauge" in prom
    assert prom.count(f"}} {doc['max_size']}\n") == 1  # the cap's sample
    assert kc_json(tmp_path / "cache", "stats")["max_size"] is None
    assert "Size cap:" not in kc(tmp_path / "cache", "stats").stdout


def test_a_bad_cap_is_said_naming_the_variable_and_refused_where_it_is_set(tmp_path):
    """A command that does not work by the jobs' cap says it and runs (clear removes what it
    removes whatever the cap); setting it as the root's own is refused, nothing written."""
    put(tmp_path / "cache", ext=EXT)
    proc = kc(tmp_path / "cache", "clear", "--dry-run", env={"KERNELCACHE_MAX_SIZE": "50Q"})
    assert proc.returncode == 0
    assert "KERNELCACHE_MAX_SIZE='50Q'" in proc.stderr
    refused = kc(tmp_path / "cache", "-M", "50Q")
    assert refused.returncode == 2 and "max_size='50Q'" in refused.stderr


@pytest.mark.parametrize("planted", [os.mkdir, os.mkfifo], ids=["directory", "fifo"])
def test_a_cap_that_cannot_be_kept_never_fails_a_put(tmp_path, planted):
    root = tmp_path / "cache"
    put(root, ext=EXT)
    (root / ".stats").mkdir(exist_ok=True)
    planted(root / ".stats" / "usage")  # not a file: accounting cannot work (and never waits)
    out = run_py(
        """
        import hashlib, kernelcache
        cache = kernelcache.Cache(max_size="10K")
        for i in range(5):
            key = hashlib.sha256(str(i).encode()).hexdigest()
            cache.put(key, "bin", b"x" * 4000, {})
            cache.capacity.wait()
        print(cache.capacity.broken)
        """,
        KERNELCACHE_DIR=str(root),
    )
    assert out.stdout.split()[-1] == "True"
    assert out.stderr.count("cannot keep") == 1
    assert kc_json(root, "stats")["entries"] == 6


def usage_total(path: Path) -> int:
    """The running total the usage file says: its base and the bytes recorded since."""
    data = path.read_bytes()
    records = [data[i : i + 24] for i in range(0, len(data), 24)]
    assert records[0][:1] == b"B" and all(r[:1] == b"+" for r in records[1:])
    return sum(int(r[1:23]) for r in records)


def test_prune_and_clear_make_the_next_capped_put_measure_again(tmp_path):
    root = tmp_path / "cache"
    putters(root, ["a"], count=10, size=10_000, KERNELCACHE_MAX_SIZE="1M")
    usage = root / ".stats" / "usage"
    entry = 10_000 + 400  # bytes of an entry, about
    # the first put made the file; a pass measured the root (the base), puts went on meanwhile
    # (an entry published between the pass's look at the file and its listing counts twice)
    assert 0 <= usage_total(usage) - kc_json(root, "stats")["bytes"] <= 2 * entry
    kc_json(root, "prune", "--max-size", "50K")
    assert not usage.exists()
    assert putters(root, ["b"], count=1, size=10_000, KERNELCACHE_MAX_SIZE="1M") == [1]
    assert 0 <= usage_total(usage) - kc_json(root, "stats")["bytes"] <= 2 * entry
    kc_json(root, "clear")
    assert not usage.exists()


def test_short_processes_wait_at_exit_for_their_pass(tmp_path):
    root = tmp_path / "cache"
    for n in range(4):  # each puts 5 entries of ~10.4 KB and exits at once
        run_py(
            """
            import hashlib, os, sys, kernelcache
            cache = kernelcache.Cache(max_size="60K")
            for i in range(5):
                key = hashlib.sha256(f"{sys.argv[1]}-{i}".encode()).hexdigest()
                cache.put(key, "bin", os.urandom(10_000), {})
            """,
            str(n),
            KERNELCACHE_DIR=str(root),
        )
    assert 0 < kc_json(root, "stats")["bytes"] <= 60 * 1024


#: code that makes the next eviction pass of a process stop after its listing, once
#: ``<gate>.armed`` exists, until ``<gate>.go`` does (it says so with ``<gate>.listed``), and
#: lets a process's passes run one in a row
PAUSED = """
import os, time
import kernelcache.capacity.eviction as eviction
from kernelcache.capacity.size_cap import SizeCap
SizeCap.MAX_PASSES_IN_A_ROW = 1
listing = eviction.entries_of
def paused(*args):
    rows = listing(*args)
    if os.path.exists(GATE + ".armed"):
        os.remove(GATE + ".armed")
        open(GATE + ".listed", "w").close()
        while not os.path.exists(GATE + ".go"):
            time.sleep(0.01)
    return rows
eviction.entries_of = paused
"""

LAST_PUT = """
import hashlib, os, sys, time, kernelcache
import kernelcache.capacity.helper as helpers
how, GATE = sys.argv[1], sys.argv[2]
exec(PAUSED)
if how == "thread":
    sys.executable = ""  # nothing to start a helper with
else:
    helpers.HELPER_CODE = f"GATE = {GATE!r}\\n{PAUSED}\\n{helpers.HELPER_CODE}"
cache = kernelcache.Cache(max_size="100K")
def put(i, size=10_000):
    key = hashlib.sha256(f"{how}-{i}".encode()).hexdigest()
    cache.put(key, "bin", os.urandom(size), {})
for i in range(9):  # ~92 KB: under the cap
    put(i)
cache.capacity.wait()
open(GATE + ".armed", "w").close()
put(9), put(10)  # over the cap: a pass runs, and stops after its listing
deadline = time.monotonic() + 60
while not os.path.exists(GATE + ".listed") and time.monotonic() < deadline:
    time.sleep(0.01)
put(11, size=40_000)  # a pass is due, and one runs: it listed the root before this put
open(GATE + ".go", "w").close()
cache.capacity.wait()
print(cache.capacity.passes)
"""


@pytest.mark.parametrize("how", ["thread", "helper"])
def test_a_put_during_the_last_pass_of_a_row_gets_a_pass_after_it(tmp_path, how):
    root, gate = tmp_path / "cache", tmp_path / "gate"
    out = run_py(f"PAUSED = {PAUSED!r}\n{LAST_PUT}", how, str(gate), KERNELCACHE_DIR=str(root))
    assert (tmp_path / "gate.listed").exists()  # the pass did pause
    # the paused pass took the root to ~80 KB, and the 40 KB put after its listing would
    # have stayed: another pass ran after it
    assert 0 < kc_json(root, "stats")["bytes"] <= 100 * 1024
    assert int(out.stdout.split()[-1]) >= 3


HELPED = """
import hashlib, os, sys, kernelcache
import kernelcache.capacity.helper as helpers
how = sys.argv[1]
if how == "no-helpers":
    sys.executable = ""  # nothing to start a helper with
if how == "failing-helper":
    helpers.HELPER_CODE = "import sys; sys.stderr.write('cannot start here'); sys.exit(3)"
cache = kernelcache.Cache(max_size="60K")
def put(i):
    key = hashlib.sha256(f"{how}-{i}".encode()).hexdigest()
    cache.put(key, "bin", os.urandom(10_000), {})
for i in range(10):
    put(i)
cache.capacity.wait()
put(10)  # (where the helper failed, this pass runs in a thread)
cache.capacity.wait()
helper = cache.capacity._helper
print(repr(helpers.no_helpers_since))
print(helper.proc.pid if helper and helper.alive else -1, cache.capacity.passes, flush=True)
if how == "killed":
    os._exit(0)  # no exit handlers: the helper sees its input close
"""


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.parametrize("how", ["exits", "killed"])
def test_passes_run_in_a_helper_process_that_ends_with_its_process(tmp_path, how):
    root = tmp_path / "cache"
    out = run_py(HELPED, how, KERNELCACHE_DIR=str(root))
    pid, passes = map(int, out.stdout.split()[-2:])
    assert pid > 0 and passes >= 1
    deadline = time.monotonic() + 20
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(pid)
    assert 0 < kc_json(root, "stats")["bytes"] <= 60 * 1024


@pytest.mark.parametrize("how", ["no-helpers", "failing-helper"])
def test_without_a_helper_process_passes_run_in_a_thread(tmp_path, how):
    root = tmp_path / "cache"
    out = run_py(HELPED, how, KERNELCACHE_DIR=str(root))
    pid, passes = map(int, out.stdout.split()[-2:])
    assert pid == -1 and passes >= 1
    assert 0 < kc_json(root, "stats")["bytes"] <= 60 * 1024
    assert "Traceback" not in out.stderr
    if how == "failing-helper":  # why is kept (and logged at INFO)
        assert "status 3: cannot start here" in out.stdout


HOSTILE = """
import os, sys, time
path, record = sys.argv[1], bytes.fromhex(sys.argv[2])
for n in range(1 << 30):  # as another program might: open, append, close (each new file)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    os.write(fd, record)
    os.close(fd)
    if n == 0:
        print("writing", flush=True)
    time.sleep(0.005)
"""


@pytest.mark.parametrize(
    "record",
    [b"B%22d\n" % 0, b"B%22d\n" % (10**22 - 1), b"-1\n"],
    ids=["zero-base", "huge-base", "short-negative"],
)
def test_records_another_writer_appends_cannot_starve_passes(tmp_path, record):
    root = tmp_path / "cache"
    (root / ".stats").mkdir(parents=True)
    usage = root / ".stats" / "usage"
    usage.write_bytes(b"B%22d\n" % 0)  # as a pass leaves it for an empty root
    hostile = subprocess.Popen(
        [sys.executable, "-c", HOSTILE, str(usage), record.hex()],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert hostile.stdout.readline().strip() == "writing"  # (then it writes on)
        # 500 entries of ~2.4 KB (6x the cap) while a record comes every 5 ms
        done = finish(
            start_putters(root, ["a", "b"], count=250, size=2_000, KERNELCACHE_MAX_SIZE="200K")
        )
    finally:
        hostile.kill()
        hostile.wait()
    assert 0 < kc_json(root, "stats")["bytes"] <= 200 * 1024 * 1.15
    assert sum(passes for passes, _ in done) >= 1
    warnings = [err.count(f"kernelcache: ignoring {usage}") for _, err in done]
    assert max(warnings) == 1  # once per process, naming the file


def test_a_pass_keeps_the_records_appended_after_what_another_program_wrote(tmp_path):
    """What another program appends to the usage file costs its own lines only: the puts
    recorded after it, while a pass ran, are kept in the file the pass writes."""
    stats = tmp_path / ".stats"
    stats.mkdir()
    usage = stats / "usage"
    seen = usage_record(b"B", 1000) + usage_record(b"+", 5)  # what the pass began after
    late = [usage_record(b"+", 7), usage_record(b"+", 11)]
    usage.write_bytes(seen + b"-1\n" + late[0] + b"junk\n" + late[1] + b"+  a partial line")
    dfd = os.open(stats, os.O_RDONLY | os.O_DIRECTORY)
    fd = os.open(usage, os.O_RDONLY)
    try:
        replace_usage(dfd, fd, len(seen), usage_record(b"B", 500))
    finally:
        os.close(fd)
        os.close(dfd)
    assert usage.read_bytes() == usage_record(b"B", 500) + b"".join(late)


def test_a_huge_sparse_usage_file_costs_a_put_neither_time_nor_memory(tmp_path):
    root = tmp_path / "cache"
    put(root, ext=EXT)
    (root / ".stats").mkdir()
    usage = root / ".stats" / "usage"
    with open(usage, "wb") as f:
        f.truncate(1 << 30)  # 1 GiB of nothing
    out = run_py(
        """
        import hashlib, os, resource, time, kernelcache
        def read_bytes():  # every byte this process has read, by any system call
            with open("/proc/self/io") as f:
                return int(next(line for line in f if line.startswith("rchar:")).split()[1])
        cache = kernelcache.Cache(max_size="1M")
        data = [os.urandom(10_000) for _ in range(5)]
        rss, read, slowest = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, read_bytes(), 0.0
        for i in range(5):
            started = time.monotonic()
            cache.put(hashlib.sha256(str(i).encode()).hexdigest(), "bin", data[i], {})
            slowest = max(slowest, time.monotonic() - started)
        grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss) * 1024
        print(read_bytes() - read, grown, slowest, flush=True)
        cache.capacity.wait()
        """,
        KERNELCACHE_DIR=str(root),
    )
    read, grown, slowest = out.stdout.split()
    # (bytes read stand for the time: the put reads what it must, not the file's gigabyte)
    assert int(read) < 8 << 20, (read, slowest)
    assert int(grown) < 64 << 20, grown
    assert usage.stat().st_size < 1024  # the eviction pass wrote it anew
    assert out.stderr.count(f"kernelcache: ignoring {usage}") == 1
    assert kc_json(root, "stats")["entries"] == 6


def test_a_burst_of_writers_never_takes_the_root_past_twice_the_cap(tmp_path):
    """Writers wait for passes past the bound: twice the cap, or, after a pass that could not
    get under the cap (entries it planned to delete were in use then), the cap more than that
    pass left (the base it wrote into the usage file)."""
    root, cap, size, tags = tmp_path / "cache", 1 << 20, 32_000, ["a", "b", "c", "d"]
    root.mkdir()
    peak, base = 0, 0
    stop = threading.Event()
    usage = root / ".stats" / "usage"

    def sample() -> None:  # the root's entries as a pass would see them, every millisecond
        nonlocal peak, base
        while not stop.wait(0.001):
            peak = max(peak, sum(entry.nbytes for entry in entries_of(str(root))))
            with contextlib.suppress(OSError):
                first = usage.read_bytes()[:RECORD]
                if first.startswith(b"B") and first.endswith(b"\n"):
                    base = max(base, int(first[1:]))

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:  # 600 entries of ~32.4 KB: 19 MB as fast as four processes can put them
        done = finish(
            start_putters(root, tags, count=150, size=size, KERNELCACHE_MAX_SIZE=f"{cap}B")
        )
    finally:
        stop.set()
        sampler.join()
    entry = size + 1024  # an entry's bytes, metadata included (at most)
    # the bound, and the one entry each writer may have published since it last looked
    said = [err for _, err in done if err]  # (a writer that stopped waiting says why)
    bound = cap + max(cap, base)
    assert peak <= bound + len(tags) * entry, f"peak {peak / cap:.2f}x the cap; {base=}; {said}"
    assert base <= cap + len(tags) * entry * 8, f"passes left {base / cap:.2f}x the cap"
    assert 0 < kc_json(root, "stats")["bytes"] <= cap * 1.15
