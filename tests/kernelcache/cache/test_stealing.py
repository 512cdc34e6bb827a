"""Work stealing across real processes: a process builds every missing key that nobody else is
building before it waits, every key is still built exactly once (single flight), and a builder
that dies mid-way (SIGKILL: its flock is dropped, its soft lock's holder is dead) or stops
(a soft lock that is no longer refreshed goes stale) has its key taken over by another."""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from bridge_helpers import COUNT_COMPILES
from support import REPO, checked, child_env, key_of

import kernelcache

# argv: root, lock mode, build log, start file, names, name whose build hangs ("" for none)
STEALER = """
import hashlib, json, os, sys, time
import kernelcache
root, mode, log, start, names, stuck = sys.argv[1:7]

def key_of(name):
    return hashlib.sha256(repr((name,)).encode()).hexdigest()

def build_of(name):
    def build():
        with open(log, "a") as f:
            f.write(f"start {name} {os.getpid()}\\n")
        if name == stuck:
            print("BUILDING", flush=True)
            time.sleep(600)
        time.sleep(0.4)
        with open(log, "a") as f:
            f.write(f"done {name} {os.getpid()}\\n")
        return name.encode(), {"name": name}
    return build

while not os.path.exists(start):
    time.sleep(0.002)
started = time.monotonic()
cache = kernelcache.Cache(root, readonly_roots=(), lock_mode=mode)
items = [kernelcache.BuildItem(key_of(n), "bin", build_of(n)) for n in names.split(",")]
arts = cache.get_or_create_many(items)
print(json.dumps({"data": [a.data.decode() for a in arts], "pid": os.getpid(),
                  "seconds": time.monotonic() - started, "stats": kernelcache.process_stats()}))
"""


def _start(
    root: Path, mode: str, log: Path, start: Path, names: list[str], stuck: str = "", **env: str
) -> subprocess.Popen:
    argv = [str(root), mode, str(log), str(start), ",".join(names), stuck]
    return subprocess.Popen(
        [sys.executable, "-c", STEALER, *argv],
        env=child_env(**env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _finish(proc: subprocess.Popen, timeout: float = 120) -> dict:
    out, err = proc.communicate(timeout=timeout)
    checked(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    assert "building privately" not in err and "without a lock" not in err, err
    return json.loads(out.strip().splitlines()[-1])


def _events(log: Path) -> collections.Counter[tuple[str, str]]:
    return collections.Counter(
        (event, name) for event, name, _ in (line.split() for line in log.read_text().splitlines())
    )


@pytest.mark.parametrize("mode", ["flock", "soft"])
def test_four_processes_share_the_builds_and_build_each_key_once(tmp_path, mode):
    names = [f"k{i}" for i in range(8)]
    log, start = tmp_path / "builds.log", tmp_path / "start"
    procs = [_start(tmp_path / "root", mode, log, start, names) for _ in range(4)]
    start.touch()
    results = [_finish(p) for p in procs]
    for r in results:
        assert r["data"] == names  # every process got every entry, in order
    events = _events(log)
    assert all(events[("start", n)] == 1 and events[("done", n)] == 1 for n in names), events
    builds = [r["stats"]["builds"] for r in results]
    assert sum(builds) == len(names)  # single flight: each key built once in total
    # stealing: nobody waited while a key was free, so the builds were shared out and ran
    # side by side (the log's order: several started before one was done), not one after
    # another; told from the order of events, not a wall time a loaded machine stretches
    assert all(b >= 1 for b in builds), builds
    running = most = 0
    for line in log.read_text().splitlines():
        running += 1 if line.startswith("start ") else -1
        most = max(most, running)
    assert most >= 2, log.read_text()


@pytest.mark.parametrize("mode, how", [("flock", "kill"), ("soft", "kill"), ("soft", "stop")])
def test_a_dead_or_stopped_builder_is_taken_over(tmp_path, mode, how):
    """A builder holding one key's lock dies (SIGKILL) or stops (SIGSTOP: its soft lock is no
    longer refreshed and goes stale): the others build every other key meanwhile, then one of
    them takes the orphaned key over; each key is finished exactly once."""
    names = ["a", "b", "c", "d"]
    root, log = tmp_path / "root", tmp_path / "builds.log"
    early, start = tmp_path / "early", tmp_path / "start"
    early.touch()
    env = {"KERNELCACHE_LOCK_STALE": "1.5", "KERNELCACHE_LOCK_TIMEOUT": "60"}
    builder = _start(root, mode, log, early, names, stuck="a", **env)
    try:
        assert builder.stdout is not None
        assert builder.stdout.readline().strip() == "BUILDING"  # holds a's lock, hangs in it
        others = [_start(root, mode, log, start, names, **env) for _ in range(3)]
        start.touch()
        deadline = time.monotonic() + 60
        while sum(1 for n in "bcd" if f"done {n} " in log.read_text()) < 3:
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        time.sleep(0.3)  # the others now wait for a
        assert "done a" not in log.read_text()
        os.kill(builder.pid, signal.SIGKILL if how == "kill" else signal.SIGSTOP)
        if how == "kill":
            builder.wait(timeout=30)  # reaped: its pid is gone, as after a real crash
        results = [_finish(p) for p in others]
    finally:
        builder.kill()
        builder.communicate(timeout=30)
    for r in results:
        assert r["data"] == names
        assert r["stats"]["lock_timeouts"] == 0  # taken over, not built privately
    events = _events(log)
    assert events[("start", "a")] == 2  # the stuck builder, then the one that took over
    assert all(events[("done", n)] == 1 for n in names), events
    assert sum(r["stats"]["builds"] for r in results) == len(names)


def test_build_errors_and_duplicates_in_one_batch(tmp_path):
    """An item whose build raises is reported (its lock released, nothing stored); equal
    items are built once; the rest of the batch is still built."""
    cache = kernelcache.Cache(tmp_path / "root", readonly_roots=())
    calls: list[str] = []

    def build(name: str):
        def run():
            calls.append(name)
            if name == "bad":
                raise RuntimeError("no such kernel")
            return name.encode(), {}

        return run

    items = [kernelcache.BuildItem(key_of(n), "bin", build(n)) for n in ("x", "bad", "x", "y")]
    results = dict(cache.get_or_create_each(items))
    assert isinstance(results[1], RuntimeError)
    assert results[0].data == results[2].data == b"x" and results[3].data == b"y"
    assert sorted(calls) == ["bad", "x", "y"]
    assert cache.get(key_of("bad"), "bin") is None
    with pytest.raises(RuntimeError, match="no such kernel"):
        cache.get_or_create_many(items)
    # the lock of the failed key was released: a later build of it is not blocked
    assert cache.get_or_create(key_of("bad"), "bin", lambda: (b"fixed", {})).data == b"fixed"
    with pytest.raises(ValueError):
        cache.get_or_create_many([kernelcache.BuildItem("not-a-key", "bin", build("x"))])


def test_without_waiting_a_key_being_built_elsewhere_is_none(tmp_path):
    root, log, early = tmp_path / "root", tmp_path / "builds.log", tmp_path / "early"
    early.touch()
    builder = _start(root, "flock", log, early, ["a"], stuck="a")
    try:
        assert builder.stdout is not None
        assert builder.stdout.readline().strip() == "BUILDING"
        cache = kernelcache.Cache(root, readonly_roots=(), lock_mode="flock")
        items = [
            kernelcache.BuildItem(key_of(n), "bin", lambda n=n: (n.encode(), {})) for n in "ab"
        ]
        started = time.monotonic()
        results = dict(cache.get_or_create_each(items, wait=False))
        assert time.monotonic() - started < 5
        assert results[0] is None and results[1].data == b"b"
    finally:
        builder.kill()
        builder.communicate(timeout=30)


# -- the bridge: one 4-config autotuned call lowered by several processes at once -------------
LOWER = (
    COUNT_COMPILES
    + r"""
import hashlib, json, os, time
import jax, jax.numpy as jnp
import bridge, kernelcache
from bridge.compile import compiler as bridge_compile
from bridge_helpers import custom_calls, lowered_module
from examples import ops

start, stuck = sys.argv[1], sys.argv[2]
if stuck:  # this process hangs in its first compile, holding that variant's build lock
    import bridge.compile.fetch as S
    def hang(*args, **kwargs):
        print("COMPILING", flush=True)
        time.sleep(600)
    S.compile_source = hang
bf = jax.ShapeDtypeStruct((256, 256), jnp.bfloat16)
bridge.triton_call
print("READY", flush=True)
while not os.path.exists(start):
    time.sleep(0.002)
(call,) = custom_calls(lowered_module(lambda a, b: ops.matmul(a, b, target="cuda:90"), bf, bf))
print(json.dumps({"opaque": hashlib.sha256(call["opaque"]).hexdigest(),
                  "compiles": bridge_compile.compile_count(),
                  "stats": kernelcache.process_stats()}))
"""
)


def _lowering(start: Path, stuck: bool = False, **env: str) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(LOWER), str(start), "1" if stuck else ""],
        env=child_env(**env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=str(REPO),
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    if line != "READY":
        _, err = proc.communicate(timeout=60)
        raise AssertionError(f"child failed to start: {line}\n{err}")
    return proc


@pytest.mark.parametrize("mode", ["flock", "soft"])
def test_processes_lowering_one_autotuned_call_compile_each_variant_once(tmp_path, mode):
    """Four processes lower the same 4-config matmul into an empty cache at once: 4 compiles
    in total, and every process embeds the very module that one process alone lowers."""
    start = tmp_path / "start"
    env = {"KERNELCACHE_DIR": str(tmp_path / "shared"), "KERNELCACHE_LOCK_MODE": mode}
    procs = [_lowering(start, **env) for _ in range(4)]
    alone = _lowering(start, KERNELCACHE_DIR=str(tmp_path / "alone"))
    start.touch()
    results = [_finish(p, timeout=240) for p in procs]
    solo = _finish(alone, timeout=240)
    assert solo["compiles"] == 4
    assert sum(r["compiles"] for r in results) == 4
    assert sum(r["stats"]["builds"] for r in results) == 4
    assert {r["opaque"] for r in results} == {solo["opaque"]}


@pytest.mark.parametrize("mode", ["flock", "soft"])
def test_lowering_takes_over_the_variant_of_a_killed_process(tmp_path, mode):
    """A process killed while compiling one variant: the others compile the other three, then
    one of them compiles the orphaned one; their modules are identical."""
    start = tmp_path / "start"
    root = tmp_path / "shared"
    env = {"KERNELCACHE_DIR": str(root), "KERNELCACHE_LOCK_MODE": mode}
    stuck = _lowering(start, stuck=True, **env)
    try:
        start.touch()
        assert stuck.stdout is not None
        assert stuck.stdout.readline().strip() == "COMPILING"
        others = [_lowering(tmp_path / "go", **env) for _ in range(3)]
        (tmp_path / "go").touch()
        deadline = time.monotonic() + 200
        while len(list(root.glob("*.cubin"))) < 3:  # the three other variants are published
            assert time.monotonic() < deadline
            time.sleep(0.05)
        stuck.kill()
        stuck.wait(timeout=30)
        results = [_finish(p, timeout=240) for p in others]
    finally:
        stuck.kill()
        stuck.communicate(timeout=30)
    assert sum(r["compiles"] for r in results) == 4
    assert len({r["opaque"] for r in results}) == 1
    assert len(list(root.glob("*.cubin"))) == 4


# -- warm: a kernel another process is compiling is compiled around, then waited for ----------
HOLD_BUILD = """
import sys, time
from kernelcache.store.locks import Locker
locker = Locker(sys.argv[1], mode="flock")
held = [locker.acquire(key + ".build", shared=False, timeout=10) for key in sys.argv[2:]]
print("HELD", flush=True)
time.sleep(600)
"""


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_warm_compiles_the_other_kernels_while_one_is_being_compiled_elsewhere(tmp_path, jobs):
    """Another process holds the build locks of two kernels (it is compiling them): warm, in
    this process (--jobs 1) or in its pool of two (--jobs 2), compiles every other kernel
    meanwhile, then waits for those two and compiles them once their compiler is gone."""
    from cli_support import KERNELCACHE

    from bridge.vendors.targets import parse_target
    from bridge.warm import load_manifest, make_plan

    if KERNELCACHE is None:
        pytest.fail("the kernelcache console script is not installed: pip install -e '.[bridge]'")
    root, manifest = tmp_path / "root", REPO / "examples" / "manifest.jsonl"
    cache = kernelcache.Cache(root, readonly_roots=(), remote="")
    plan = make_plan(load_manifest(manifest), [parse_target("cuda:90")], cache, False)
    keys = [job.key for job in plan.jobs]
    held, others = keys[:2], keys[2:]
    assert len(others) >= 3
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_BUILD, str(root), *held],
        env=child_env(),
        stdout=subprocess.PIPE,
        text=True,
    )
    warm = None
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "HELD"
        argv = ["--root", str(root), "warm", str(manifest), "--target", "cuda:90", "--jobs", jobs]
        warm = subprocess.Popen(
            [KERNELCACHE, *argv, "--json"],
            env=child_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=str(REPO),
            stdin=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 240
        while not all((root / f"{key}.cubin").exists() for key in others):
            assert warm.poll() is None, warm.communicate()
            assert time.monotonic() < deadline, "warm waited instead of compiling the others"
            time.sleep(0.05)
        time.sleep(0.3)
        assert warm.poll() is None  # it waits for the held kernels
        assert not any((root / f"{key}.cubin").exists() for key in held)
        holder.kill()
        holder.wait(timeout=30)
        out, err = warm.communicate(timeout=240)
    finally:
        holder.kill()
        holder.communicate(timeout=30)
        if warm is not None and warm.poll() is None:
            warm.kill()
            warm.communicate(timeout=30)
    assert warm.returncode == 0, err
    doc = json.loads(out)
    assert {r["key"]: r["status"] for r in doc["results"]} == dict.fromkeys(keys, "compiled")
    assert all((root / f"{key}.cubin").exists() for key in held)
