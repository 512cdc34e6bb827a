"""benchmarks/cluster_scale.py as a user runs it, at its smallest: a cold and a warm job of 4
nodes x 2 ranks on a Redis Cluster over a bucket, and the slow tier; the document it writes
has the shape issue 79 asks for, and holds what a job of many machines must (each variant
compiled once, every rank lowering the same thing, the warm job compiling nothing). The
numbers are the benchmark's to judge, not this test's: it checks counts, not times."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from object_store import moto_available
from redis_server import REDIS_SERVER, SKIP_REASON
from support import REPO, child_env

pytestmark = [
    pytest.mark.skipif(REDIS_SERVER is None, reason=SKIP_REASON),
    pytest.mark.skipif(not moto_available(), reason="needs moto and obstore (test extra)"),
]


def test_the_smallest_run_writes_the_document_and_compiles_each_variant_once(tmp_path):
    out = tmp_path / "scale.json"
    argv = [sys.executable, str(REPO / "benchmarks" / "cluster_scale.py")]
    argv += ["--shapes", "4x2", "--tiers", "layered", "--jobs", "cold,warm"]
    argv += ["--bridge-shapes", "", "--json", str(out)]
    proc = subprocess.run(
        argv, env=child_env(), capture_output=True, text=True, timeout=600, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert set(doc) == {"measured", "predicted", "slow_tier"}
    assert set(doc["slow_tier"]) == {"lookup_s", "timeout_s"}
    job = doc["measured"]["4x2"]
    for field in ("makespan_s", "compiles", "ideal", "requests", "digests"):
        assert field in job, field
    assert job["compiles"] == job["ideal"] == 13
    assert len(job["digests"]) == 8 and len(set(job["digests"])) == 1
    warm = next(j for j in job["jobs"] if j["job"] == "warm")
    assert warm["compiles"] == 0 and warm["digests"] == job["digests"]
    # a warm job asks the tier once a variant a node: its requests grow with nodes
    reads = sum(n for kind, n in warm["requests_by_kind"]["redis"].items() if kind.endswith(":get"))
    assert reads <= 13 * 4, warm["requests_by_kind"]
    assert doc["predicted"] == {}  # (three shapes are needed to fit the model)
