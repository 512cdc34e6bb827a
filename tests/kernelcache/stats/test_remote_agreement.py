"""The remote statistics agree with themselves: a lookup no tier was asked (its breaker open,
another process's first request pending) is a miss of the cache's lookups and a ``skipped``
of the tier, shown as such, never a lookup the tier table loses."""

from __future__ import annotations

import re

from cli_support import kc, kc_json
from support import run_py

CHILD = """
import sys
from kernelcache import stats
root = sys.argv[1]
stats.enable_log(root)
stats.count(root, remote_misses=11, remote_hits=2)
stats.count_tier(root, "redis://cache:6379/0", misses=1, hits=2, skipped=10)
stats.flush()
"""


def test_skipped_requests_are_counted_and_shown_beside_the_lookups(tmp_path):
    root = tmp_path / "cache"
    root.mkdir()
    run_py(CHILD, str(root))
    (tier,) = kc_json(root, "stats")["remote_tiers"].values()
    assert tier["skipped"] == 10 and tier["misses"] == 1 and tier["hits"] == 2
    human = kc(root, "stats").stdout
    assert "2 hits, 11 misses (hit rate 15.4%), of every entry" in human, human
    assert "10 not sent to the tier (skipped: see SKIPPED below)" in human
    header = next(line for line in human.splitlines() if line.startswith("REMOTE TIER"))
    row = next(line for line in human.splitlines() if line.startswith("redis://cache:6379/0"))
    columns = dict(zip(header.split()[2:], row.split()[1:], strict=False))
    assert columns["HITS"] == "2" and columns["MISSES"] == "1" and columns["SKIPPED"] == "10"
    assert int(columns["HITS"]) + int(columns["MISSES"]) + int(columns["SKIPPED"]) == 13
    prom = kc(root, "stats", "--format", "prometheus").stdout
    assert re.search(r"^kernelcache_remote_tier_skipped_total\{.*\} 10$", prom, re.M), prom
