"""kill -9 at every kind of point of put, prune, import and warm.

Each operation is first run to completion in a child that counts its file-system calls (every
open, write, replace, rename, unlink, link, utime, mkdir, close and flock: the steps at which a
crash can leave a different state on disk). Then, many times, a fresh copy of the same root
gets the same operation from a child that kills itself with SIGKILL just before call number
k, k drawn at random from each of equal slices of the run. (The children are forks of one
process that imported what they use, ``reliability_support.ForkServer``: a trial costs its
operation, not an interpreter's start and its imports.) After every kill:

* ``kernelcache verify --json`` runs; it finds no corrupt entry at all, and every entry it
  passes holds exactly the bytes that were written (see ``audit``);
* ``get`` of every key serves the right bytes or nothing (corrupt reads served: 0);
* the same operation, run again, completes (no leftover breaks it: stale soft locks of the
  killed process are broken, half-written files are ignored or replaced) and leaves a root
  that verifies clean, with every entry right.

The kill is a real SIGKILL of a real process (no exception handler, no atexit, no flush).
Time-based kills of concurrent writers are in test_multiprocess.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import time
from pathlib import Path

import pytest
from artifact_images import launch, sized
from reliability_support import (
    KILLER,
    ForkServer,
    audit,
    kill_points,
    payload,
    record_figures,
    run_cli,
)
from support import HELPERS, key_of, metadata_keys, run_py

import kernelcache
from kernelcache.store import Artifact, Store

KILLS = 24


@pytest.fixture(autouse=True)
def _no_stats_logs(monkeypatch):
    # the audits' own Cache objects must not add statistics logs to the roots they check
    monkeypatch.setenv("KERNELCACHE_STATS_LOG", "0")


@pytest.fixture
def server(tmp_path):
    """The process the children of put, prune and import are forked from."""
    with ForkServer(tmp_path, "kernelcache.cli") as server:
        yield server


def _copy(template: Path, dest: Path) -> Path:
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(template, dest, symlinks=True)  # copy2: mtimes (last-used stamps) kept
    return dest


def _killed(proc) -> bool:
    return proc.returncode == -signal.SIGKILL


def _backdate(path: Path, seconds: float) -> None:
    when = time.time() - seconds
    os.utime(path, (when, when), follow_symlinks=False)


# -- put ------------------------------------------------------------------------------------
PUT = (
    f"import sys\nsys.path.insert(0, {str(HELPERS)!r})\n"
    + """
import hashlib, os, sys, kernelcache
from artifact_images import launch, sized

def payload(key, size):  # as test_reliability_support.payload
    return sized("cubin", size, hashlib.sha256(key.encode()).digest())

root, keys = sys.argv[1], sys.argv[2].split(",")
cache = kernelcache.Cache(root, readonly_roots=())
arm(int(os.environ["KC_KILL_AT"]))
cache.put(keys[3], "cubin", payload(keys[3], 30_000), launch(name="k3"))  # replaces a corrupt entry
cache.put(keys[4], "cubin", payload(keys[4], 70_000), launch(name="k4"))  # new
cache.put(keys[0], "cubin", payload(keys[0], 5_000), launch(name="k0"))   # present: kept
art = cache.get_or_create(keys[5], "cubin", lambda: (payload(keys[5], 9_000), launch(name="k5")))
assert art.data == payload(keys[5], 9_000)
assert cache.get(keys[1], "cubin").data == payload(keys[1], 6_000)    # refreshes an old stamp
# (False: a killed run got there first. The wait: a run killed between creating its soft lock
# and writing the holder record leaves a lock that is stale only after a few seconds.)
assert cache.store.delete(keys[2], wait=10) is not None
"""
)
PUT_SIZES = [5_000, 6_000, 7_000, 30_000, 70_000, 9_000]


@pytest.mark.parametrize("lock_mode", ["flock", "soft"])
def test_kill_9_during_put(tmp_path, server, lock_mode):
    keys = [key_of("put", i) for i in range(6)]
    expected = {k: ("cubin", payload(k, n)) for k, n in zip(keys, PUT_SIZES, strict=True)}
    template = tmp_path / "template"
    store = Store(template)
    for i in (0, 1, 2, 3):
        store.put(keys[i], "cubin", payload(keys[i], PUT_SIZES[i]), launch(name=f"k{i}"))
    _backdate(template / f"{keys[1]}.json", 7200)
    corrupt = template / f"{keys[3]}.cubin"
    corrupt.write_bytes(b"\0" * PUT_SIZES[3])
    expected_after = dict(expected)
    del expected_after[keys[2]]
    env = {"KERNELCACHE_LOCK_MODE": lock_mode, "KERNELCACHE_LOCK_TIMEOUT": "30"}
    argv = [",".join(keys)]

    def run(root: Path, at: int):
        return server.run(PUT, [str(root), *argv], at, **env)

    calib = _copy(template, tmp_path / "calibration")
    proc, total = run(calib, 0)
    assert proc.returncode == 0 and total, proc.stderr
    _check_final(calib, expected_after)
    kills = 0
    for at in kill_points(total, KILLS, ("put", lock_mode)):
        root = _copy(template, tmp_path / "trial")
        proc, _ = run(root, at)
        assert _killed(proc), (at, proc.returncode, proc.stderr)
        kills += 1
        found = audit(root, expected)
        _no_corruption_but_the_planted_one(found, keys[3], at)
        started = time.monotonic()
        again, _ = run(root, 0)  # the same work again: must not trip over the leftovers
        assert again.returncode == 0, (at, again.stderr)
        assert time.monotonic() - started < 20, "waited for a lock of the killed process"
        _check_final(root, expected_after)
    record_figures(
        f"kill -9 during put ({lock_mode} locks)",
        processes=2 * kills + 1,
        operations=6 * (2 * kills + 1),
        faults=kills,
        corrupt_served=0,
        jobs_failed=0,
    )


def _no_corruption_but_the_planted_one(found, planted: str, at: int) -> None:
    """After a crash the only corrupt entry may be the one the template planted (the
    operation was killed before it replaced it)."""
    assert found.served_wrong == 0, at
    corrupt = {p["key"] for p in found.problems if p["kind"] == "corrupt"}
    assert corrupt <= {planted}, (at, found.problems)


def _check_final(root: Path, expected: dict[str, tuple[str, bytes]]) -> None:
    """The root after a completed operation: verifies clean; every expected entry is there
    and right; get_or_create of each builds nothing."""
    found = audit(root, expected)
    assert found.served_wrong == 0
    assert found.problems == [] or found.kinds() <= {"stale-lock"}, found.problems
    cache = kernelcache.Cache(root, readonly_roots=())
    for key, (ext, data) in expected.items():
        art = cache.get_or_create(key, ext, lambda k=key: pytest.fail(f"{k} had to be rebuilt"))
        assert art.data == data and art.source == "local"


# -- prune ----------------------------------------------------------------------------------
PRUNE = """
import os, sys
from kernelcache import cli
root, max_size = sys.argv[1], sys.argv[2]
arm(int(os.environ["KC_KILL_AT"]))
sys.exit(cli.main(["--root", root, "prune", "--max-size", max_size + "B", "--quarantine-age", "1d"]))
"""
PRUNE_ENTRIES = 40
OLD = 2 * 86400


def _prune_template(root: Path) -> tuple[dict[str, tuple[str, bytes]], dict[str, int]]:
    """A root needing every kind of prune work; returns its entries and its statistics."""
    store = Store(root)
    expected = {}
    for i in range(PRUNE_ENTRIES):
        key = key_of("prune", i)
        data = payload(key, 2_000 + 500 * (i % 9))
        store.put(key, "cubin", data, launch(name=f"k{i % 4}"))
        _backdate(root / f"{key}.json", 3600 * (PRUNE_ENTRIES - i))  # distinct last-used
        expected[key] = ("cubin", data)
    for i in range(3):  # orphan artifacts, staging files, old quarantined files, stale locks
        orphan = root / f"{key_of('orphan', i)}.cubin"
        orphan.write_bytes(b"half" * 100)
        _backdate(orphan, OLD)
        temp = root / ".tmp" / f"host-{i}-dead.tmp"
        temp.write_bytes(b"staged")
        _backdate(temp, OLD)
        (root / ".quarantine").mkdir(exist_ok=True)
        quarantined = root / ".quarantine" / f"{key_of('q', i)}.cubin.1-abc"
        quarantined.write_bytes(b"bad")
        _backdate(quarantined, 30 * 86400)
        lock = root / ".locks" / f"{key_of('gone', i)}.lock"
        lock.write_bytes(b"")
        _backdate(lock, OLD)
    counters = {"hits": 0, "misses": 0, "builds": 0}
    (root / ".stats").mkdir()
    for i in range(4):  # logs of finished processes on another host: folded by prune
        log = root / ".stats" / f"otherhost-{100 + i}-0000000{i}.jsonl"
        delta = {"hits": 10 + i, "misses": 3, "builds": 1 + i}
        log.write_text(json.dumps({"v": 1, "delta": delta}) + "\n")
        _backdate(log, OLD)
        for k, v in delta.items():
            counters[k] += v
    return expected, counters


def _counters(root: Path) -> dict[str, int]:
    code, out = run_cli("--root", str(root), "stats", "--json")
    assert code == 0, out
    c = json.loads(out)["counters"]
    return {k: c[k] for k in ("hits", "misses", "builds")}


def test_kill_9_during_prune(tmp_path, server):
    template = tmp_path / "template"
    expected, counters = _prune_template(template)
    total_bytes = sum(
        len(d) + (template / f"{k}.json").stat().st_size for k, (_, d) in expected.items()
    )
    max_size = str(total_bytes // 2)

    def run(root: Path, at: int):
        return server.run(PRUNE, [str(root), max_size], at)

    calib = _copy(template, tmp_path / "calibration")
    proc, total = run(calib, 0)
    assert proc.returncode == 0 and total, proc.stderr
    kept = _check_pruned(calib, expected, counters, int(max_size))
    kills = 0
    for at in kill_points(total, KILLS + 6, "prune"):
        root = _copy(template, tmp_path / "trial")
        proc, _ = run(root, at)
        assert _killed(proc), (at, proc.returncode, proc.stderr)
        kills += 1
        found = audit(root, expected)
        assert found.served_wrong == 0 and "corrupt" not in found.kinds(), (at, found.problems)
        again, _ = run(root, 0)
        assert again.returncode == 0, (at, again.stdout, again.stderr)
        assert _check_pruned(root, expected, counters, int(max_size)) == kept, at
    record_figures(
        "kill -9 during prune",
        processes=2 * kills + 1,
        operations=2 * kills + 1,
        faults=kills,
        corrupt_served=0,
        jobs_failed=0,
    )


def _check_pruned(
    root: Path, expected: dict[str, tuple[str, bytes]], counters: dict[str, int], cap: int
) -> list[str]:
    """After a completed prune: under the cap, least recently used gone, housekeeping done,
    no statistics lost or counted twice. Returns the keys kept."""
    found = audit(root, expected)
    assert found.served_wrong == 0 and found.problems == [], found.problems
    kept = sorted(k for k in expected if (root / f"{k}.json").exists())
    size = sum(len(expected[k][1]) + (root / f"{k}.json").stat().st_size for k in kept)
    assert size <= cap
    assert os.listdir(root / ".tmp") == []
    assert [n for n in os.listdir(root / ".quarantine")] == []
    assert not [n for n in os.listdir(root) if n.endswith(".cubin") and "orphan" in n]
    assert _counters(root) == counters
    return kept


# -- import ---------------------------------------------------------------------------------
IMPORT = """
import os, sys
from kernelcache import cli
root, path = sys.argv[1], sys.argv[2]
arm(int(os.environ["KC_KILL_AT"]))
sys.exit(cli.main(["--root", root, "import", path]))
"""
BUNDLE_ENTRIES = 30


def test_kill_9_during_import(tmp_path, server):
    source = tmp_path / "source"
    store = Store(source)
    expected = {}
    for i in range(BUNDLE_ENTRIES):
        key = key_of("bundle", i)
        ext = "hsaco" if i % 3 else "cubin"
        data = sized(ext, 1_000 + 3_000 * (i % 5), hashlib.sha256(key.encode()).digest())
        store.put(key, ext, data, launch(name=f"b{i}"))
        expected[key] = (ext, data)
    path = tmp_path / "entries.tar"
    code, out = run_cli("--root", str(source), "export", str(path), "--json")
    assert code == 0, out
    template = tmp_path / "template"  # a destination holding some entries, one corrupt
    dest = Store(template)
    for key in list(expected)[:5]:
        ext, data = expected[key]
        dest.put(key, ext, data, launch(name="already"))
    ext, data = expected[list(expected)[5]]
    dest.put(list(expected)[5], ext, data, launch())
    (template / f"{list(expected)[5]}.{ext}").write_bytes(b"\xff" * len(data))

    def run(root: Path, at: int):
        return server.run(IMPORT, [str(root), str(path)], at)

    calib = _copy(template, tmp_path / "calibration")
    proc, total = run(calib, 0)
    assert proc.returncode == 0 and total, proc.stderr
    _check_imported(calib, expected)
    kills = 0
    for at in kill_points(total, KILLS + 6, "import"):
        root = _copy(template, tmp_path / "trial")
        proc, _ = run(root, at)
        assert _killed(proc), (at, proc.returncode, proc.stderr)
        kills += 1
        found = audit(root, expected)
        _no_corruption_but_the_planted_one(found, list(expected)[5], at)
        again, _ = run(root, 0)
        assert again.returncode == 0, (at, again.stdout, again.stderr)
        _check_imported(root, expected)
    record_figures(
        "kill -9 during import",
        processes=2 * kills + 1,
        operations=(2 * kills + 1) * BUNDLE_ENTRIES,
        faults=kills,
        corrupt_served=0,
        jobs_failed=0,
    )


def _check_imported(root: Path, expected: dict[str, tuple[str, bytes]]) -> None:
    found = audit(root, expected)
    assert found.served_wrong == 0 and found.problems == [], found.problems
    assert found.served == len(expected)


# -- warm -----------------------------------------------------------------------------------
RECORD = """
import jax, jax.numpy as jnp
from examples import ops
for dtype in (jnp.float32, jnp.float16):
    for block in (256, 1024):
        s = jax.ShapeDtypeStruct((4096,), dtype)
        fn = lambda x, y: ops.add(x, y, block=block, target="cuda:90")
        jax.jit(fn).trace(s, s).lower(lowering_platforms=("cuda",))
"""
WARM_TARGET = "hip:gfx942"  # recorded for cuda:90, warmed for another target


@pytest.fixture(scope="module")
def manifest(tmp_path_factory) -> Path:
    """A manifest of 4 specializations, recorded by lowering them ($KERNELCACHE_RECORD)."""
    work = tmp_path_factory.mktemp("manifest")
    path = work / "manifest.jsonl"
    run_py(RECORD, KERNELCACHE_DIR=str(work / "kernels"), KERNELCACHE_RECORD=str(path))
    assert len(path.read_text().splitlines()) == 4
    return path


# One process imports the bridge once, then forks a child per trial (each a real process,
# killed by a real SIGKILL at call number k of its warm). It keeps the killed state of every
# trial root for the audit (killed-<i>), then warms it again to completion (final-<i>).
WARM_SERVER = """
import json, os, random, shutil, signal, sys, traceback
from bridge import warm
manifest, work, target, points = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])

def fork_warm(root, at):
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            arm(at)
            warm.compile_manifest(manifest, [target], cache=root)
            with open(os.path.join(work, "calls"), "w") as f:
                f.write(str(_calls[0]))
        except BaseException:
            traceback.print_exc()
            code = 1
        os._exit(code)
    return os.waitpid(pid, 0)[1]

template = os.path.join(work, "template")  # a root holding one of the four kernels already
records = warm.read_manifest(manifest)
pid = os.fork()
if pid == 0:
    warm.compile_record(records[0], target, cache=template)
    os._exit(0)
assert os.waitpid(pid, 0)[1] == 0
out = {"trials": []}
calibration = os.path.join(work, "calibration")
shutil.copytree(template, calibration)
assert fork_warm(calibration, 0) == 0
out["calls"] = int(open(os.path.join(work, "calls")).read())
rng, n = random.Random("warm"), out["calls"]
edges = [1 + n * j // points for j in range(points + 1)]  # one random point in each slice
for i, at in enumerate(rng.randrange(lo, max(hi, lo + 1)) for lo, hi in zip(edges, edges[1:])):
    root = os.path.join(work, f"final-{i}")
    shutil.copytree(template, root)
    status = fork_warm(root, at)
    shutil.copytree(root, os.path.join(work, f"killed-{i}"))
    again = fork_warm(root, 0)
    out["trials"].append({"at": at, "killed": os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, "again": again})
print(json.dumps(out))
"""


def _entries(root: Path) -> dict[str, tuple[str, bytes]]:
    out = {}
    store = Store(root)
    for key in metadata_keys(root):
        art = store.read(key)
        assert isinstance(art, Artifact), (key, art)
        out[key] = (art.ext, art.data)
    return out


def test_kill_9_during_warm(tmp_path, manifest):
    """``bridge.warm.compile_manifest`` (what ``kernelcache warm`` runs) killed at random
    points: the cache stays consistent and a second warm completes it."""
    work = tmp_path / "warm"
    work.mkdir()
    proc = run_py(KILLER + WARM_SERVER, str(manifest), str(work), WARM_TARGET, "20", timeout=600)
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    expected = _entries(work / "calibration")
    assert sum(ext == "hsaco" for ext, _ in expected.values()) == 4
    for i, trial in enumerate(out["trials"]):
        assert trial["killed"] and trial["again"] == 0, trial
        found = audit(work / f"killed-{i}", expected)
        assert found.served_wrong == 0 and "corrupt" not in found.kinds(), (trial, found)
        final = audit(work / f"final-{i}", expected)
        assert final.problems == [] and final.served == len(expected), (trial, final)
    kills = len(out["trials"])
    assert kills == 20
    record_figures(
        "kill -9 during warm",
        processes=2 * kills + 2,
        operations=4 * (2 * kills + 1),
        faults=kills,
        corrupt_served=0,
        jobs_failed=0,
    )


WARM_CLI = """
import os, sys
from kernelcache import cli
root, manifest, target = sys.argv[1:4]
arm(int(os.environ["KC_KILL_AT"]))
sys.exit(cli.main(["--root", root, "warm", manifest, "--target", target]))
"""


def test_kill_9_during_kernelcache_warm_command(tmp_path, manifest):
    """The same through the command line (``kernelcache warm``), fewer kills."""
    server = ForkServer(tmp_path, "kernelcache.cli", "bridge.warm")

    def run(root: Path, at: int):
        argv = [str(root), str(manifest), WARM_TARGET]
        return server.run(WARM_CLI, argv, at, timeout=300)

    with server:
        calibration = tmp_path / "calibration"
        proc, total = run(calibration, 0)
        assert proc.returncode == 0 and total, proc.stderr
        expected = _entries(calibration)
        kills = 0
        for at in kill_points(total, 8, "warm command"):
            root = tmp_path / "trial"
            shutil.rmtree(root, ignore_errors=True)
            proc, _ = run(root, at)
            assert _killed(proc), (at, proc.returncode, proc.stderr)
            kills += 1
            found = audit(root, expected)
            assert found.served_wrong == 0 and "corrupt" not in found.kinds(), (at, found)
            again, _ = run(root, 0)
            assert again.returncode == 0, (at, again.stderr)
            final = audit(root, expected)
            assert final.problems == [] and final.served == len(expected), (at, final)
    record_figures(
        "kill -9 during kernelcache warm",
        processes=2 * kills + 1,
        operations=4 * (2 * kills + 1),
        faults=kills,
        corrupt_served=0,
        jobs_failed=0,
    )
