"""Statistics: per-process counters and the append-only per-process logs under the root (the
API), and statistics that tell the truth through the real command line: every job's lookups are
logged (also one served only by a read-only layer), the hit rate counts one lookup per kernel
(PTX companions and memoized identities apart), time saved is builds avoided, and the human
table shows every counter."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
from bridge_helpers import forget_lowerings, run_child
from cli_support import kc, kc_json, put
from support import HELPERS, child_env, key_of, run_py

import kernelcache
from kernelcache import stats

# A job that reads one kernel (and its companions) through the cache API and exits.
JOB = """
import sys, kernelcache
cache = kernelcache.Cache(root=sys.argv[1], readonly_roots=[sys.argv[2]])
for key in sys.argv[3:]:
    assert cache.get(key, "cubin") is not None
"""


def _job(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", JOB, *args],
        env=child_env(**env),
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_job_served_by_a_read_only_layer_logs_its_hits_under_a_new_root(tmp_path):
    image, root = tmp_path / "image", tmp_path / "fresh" / "root"
    keys = [put(image, f"k{i}").key for i in range(2)]
    proc = _job(str(root), str(image), *keys)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    doc = kc_json(root, "stats")
    assert doc["counters"]["hits"] == 2 and doc["processes"] == 1


def test_a_root_that_cannot_hold_statistics_is_warned_about_once(tmp_path):
    image = tmp_path / "image"
    (tmp_path / "file").write_text("not a directory")
    keys = [put(image, f"k{i}").key for i in range(2)]
    proc = _job(str(tmp_path / "file" / "root"), str(image), *keys)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("cannot log statistics under") == 1, proc.stderr
    assert "KERNELCACHE_STATS_LOG=0" in proc.stderr
    quiet = _job(str(tmp_path / "file" / "root"), str(image), *keys, KERNELCACHE_STATS_LOG="0")
    assert quiet.returncode == 0 and quiet.stderr == ""


@pytest.mark.parametrize("fmt", ["prometheus", "table"])
def test_stats_json_with_another_format_is_a_usage_error(tmp_path, fmt):
    put(tmp_path / "c", "k")
    proc = kc(tmp_path / "c", "stats", "--format", fmt, "--json")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert (
        json.loads(proc.stdout)["error"] == f"--json and --format {fmt} conflict: give one of them"
    )
    assert kc(tmp_path / "c", "stats", "--format", "json", "--json").returncode == 0


# Lowers two kernels for CUDA (each with its PTX beside it) in a fresh process.
LOWER = f"""
import sys
sys.path.insert(0, {str(HELPERS)!r})
import json, jax, jax.numpy as jnp, kernelcache
from bridge_helpers import lowered_module
from examples import ops
f32 = jax.ShapeDtypeStruct((4096,), jnp.float32)
lowered_module(lambda x, y: ops.add(x, y, target="cuda:90", embed="ptx"), f32, f32, platform="cuda")
lowered_module(lambda x: ops.gluon_scale(x, 2.0, warp_size=32, target="cuda:90"), f32, platform="cuda")
print(json.dumps(kernelcache.process_stats()))
"""


def test_hit_rate_and_time_saved_count_kernels_not_their_companions(tmp_path):
    root = tmp_path / "c"
    cold = run_child(LOWER, KERNELCACHE_DIR=str(root))
    replayed = run_child(LOWER, KERNELCACHE_DIR=str(root))
    forget_lowerings(root)  # the next process works from the kernel entries
    warm = run_child(LOWER, KERNELCACHE_DIR=str(root))
    assert (cold["misses"], cold["builds"], cold["hits"]) == (2, 2, 0)
    # a replayed lowering: a hit per kernel it launches, nothing else read
    assert (replayed["hits"], replayed["misses"], replayed["companion_hits"]) == (2, 0, 0)
    # one lookup per kernel; its PTX and the compiler's memoized identity are counted apart
    assert (warm["hits"], warm["misses"], warm["companion_hits"]) == (2, 0, 2)
    assert warm["memo_hits"] >= 1 and cold["memo_misses"] >= 1
    doc = kc_json(root, "stats")
    c = doc["counters"]
    assert (c["hits"], c["misses"], c["companion_hits"]) == (4, 2, 2)
    assert doc["hit_rate"] == pytest.approx(4 / 6)
    assert doc["compile_seconds_saved"] == pytest.approx(2 * c["build_seconds"], abs=0.01)
    human = kc(root, "stats", "--all").stdout  # (companions and memoized values: on request)
    assert "Hit rate:         66.7%" in human and "(4 builds avoided x mean build time)" in human
    assert "PTX companions:   2 hits, 0 misses" in human
    for line in ("Untrusted:", "Lock waits:", "Written:", "Remote:           (none configured)"):
        assert line in human
    prom = kc(root, "stats", "--format", "prometheus").stdout
    assert "# TYPE kernelcache_read_bytes_total counter" in prom
    assert (
        "kernelcache_companion_hits_total" in prom and "kernelcache_compile_saved_seconds" in prom
    )
    assert (
        "# HELP kernelcache_bytes_read_total Deprecated: use kernelcache_read_bytes_total." in prom
    )


def test_stats_names_the_configured_remote_and_shows_its_counters(tmp_path):
    put(tmp_path / "c", "k")
    env = {"KERNELCACHE_REMOTE": "redis://:secret@127.0.0.1:1/0"}
    doc = kc_json(tmp_path / "c", "stats", env=env)
    assert doc["remote_urls"] == ["redis://:***@127.0.0.1:1/0"]
    human = kc(tmp_path / "c", "stats", env=env).stdout
    assert "Remote:           redis://:***@127.0.0.1:1/0" in human and "secret" not in human
    assert "0 unauthenticated" in human


def test_verify_reports_a_foreign_file_with_its_size(tmp_path):
    root = tmp_path / "c"
    put(root, "k")
    (root / "notes.txt").write_bytes(b"x" * 1234)
    doc = kc_json(root, "verify", code=0)  # (a foreign file alone is no failure)
    (foreign,) = [p for p in doc["problems"] if p["kind"] == "foreign"]
    assert foreign["path"] == "notes.txt" and foreign["size"] == 1234


# -- per-process counters and logs, through the API ------------------------------------------
def test_counters_follow_operations(root):
    cache = kernelcache.Cache(root, readonly_roots=())
    before = kernelcache.process_stats()
    key = key_of("stats")
    assert cache.get(key, "bin") is None
    cache.get_or_create(key, "bin", lambda: (b"x" * 100, {}))
    cache.get(key, "bin")
    cache.get_or_create(key, "bin", lambda: (b"never", {}))
    cache.put(key_of("stats-2"), "bin", b"y" * 10, {})
    after = kernelcache.process_stats()
    delta = {k: after[k] - before[k] for k in after}
    assert delta["misses"] == 2  # the plain get, and the get_or_create that built
    assert delta["hits"] == 2
    assert delta["builds"] == 1
    assert delta["puts"] == 2
    assert delta["bytes_read"] == 200
    assert delta["bytes_written"] == 110
    assert delta["corrupt"] == 0
    assert after["build_seconds"] >= before["build_seconds"]
    for name in (
        "hits",
        "misses",
        "builds",
        "puts",
        "corrupt",
        "lock_waits",
        "bytes_read",
        "bytes_written",
    ):
        assert name in after


def test_logs_from_several_processes_add_up(root):
    code = """
        import sys, kernelcache
        c = kernelcache.Cache(sys.argv[1], readonly_roots=())
        for i in range(int(sys.argv[2])):
            k = ("%02x" % i) * 16
            c.get_or_create(k, "bin", lambda: (b"z" * 10, {}))
            c.get(k, "bin")
    """
    run_py(code, str(root), "3")
    run_py(code, str(root), "5")
    totals, processes, problems = stats.read_logs(str(root))
    assert processes == 2 and problems == []
    # first process: 3 builds (misses) and 3 hits; second: 3 hits + 2 builds, then 5 hits
    assert totals["builds"] == 5
    assert totals["misses"] == 5
    assert totals["hits"] == 3 + 3 + 5
    logs = list((root / ".stats").glob("*.jsonl"))
    assert len(logs) == 2
    for log in logs:
        for line in log.read_text().splitlines():
            record = json.loads(line)
            assert record["v"] == 1 and record["pid"] > 0 and "delta" in record


# A job that uses a root ("opened": one that exists; "put": one its put creates; "built": one
# its get_or_create creates, whose build flushes the log at once), says so, and exits on a line.
USES_THEN_EXITS = """
import sys, kernelcache
root, how = sys.argv[1], sys.argv[2]
cache = kernelcache.Cache(root, readonly_roots=(), remote="")
key = "ab" * 16
if how == "opened":
    assert cache.get(key, "bin") is None
elif how == "put":
    cache.put(key, "bin", b"x" * 10, {})
else:
    cache.get_or_create(key, "bin", lambda: (b"x" * 10, {}))
    assert cache.get(key, "bin") is not None  # counted after the flush
print("ready", flush=True)
sys.stdin.readline()
"""


@pytest.mark.parametrize("how", ["opened", "put", "built"])
def test_a_root_deleted_while_a_job_ran_stays_deleted_after_it_exits(root, how):
    """The log written at exit does not bring back a root (with a lone ``.stats/``) that was
    deleted while the job ran; a root the job never saw exist is still created for it."""
    if how == "opened":
        root.mkdir()
    job = subprocess.Popen(
        [sys.executable, "-c", USES_THEN_EXITS, str(root), how],
        env=child_env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert job.stdout is not None and job.stdout.readline() == "ready\n"
    assert root.is_dir()
    shutil.rmtree(root)
    _, err = job.communicate("\n", timeout=60)
    assert job.returncode == 0 and err == "", err
    assert not root.exists(), sorted(p.name for p in root.rglob("*"))


def test_stats_log_can_be_turned_off(root):
    run_py(
        """
        import sys, kernelcache
        kernelcache.Cache(sys.argv[1], readonly_roots=()).get_or_create("ab" * 16, "bin", lambda: (b"x", {}))
        """,
        str(root),
        KERNELCACHE_STATS_LOG="0",
    )
    assert not (root / ".stats").exists()


def test_unreadable_log_lines_are_reported_not_raised(root):
    (root / ".stats").mkdir(parents=True)
    (root / ".stats" / "h-1-x.jsonl").write_text('{"v":1,"delta":{"hits":2}}\nnot json\n[1]\n')
    totals, processes, problems = stats.read_logs(str(root))
    assert totals["hits"] == 2 and processes == 1 and len(problems) == 2
