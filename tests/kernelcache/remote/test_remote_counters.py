"""Counters of each remote tier in the statistics logs: written per process, summed by
`kernelcache stats`, kept when logs are folded, and untrusted when read."""

from __future__ import annotations

import json
import os

from kernelcache import stats
from kernelcache.store.locks import Locker


def test_tier_counters_are_logged_summed_and_kept_by_a_fold(tmp_path):
    root = str(tmp_path)
    stats.enable_log(root)
    stats.count_tier(root, "redis://h:6379/0", hits=2, bytes_read=100, unknown=5)
    stats.count_tier(root, "s3://b/kc", misses=1)
    stats.flush()
    stats.count_tier(root, "redis://h:6379/0", hits=1)
    stats.flush()
    tiers: dict = {}
    stats.read_logs(root, tiers)
    assert tiers["redis://h:6379/0"]["hits"] == 3 and tiers["redis://h:6379/0"]["bytes_read"] == 100
    assert tiers["s3://b/kc"]["misses"] == 1 and "unknown" not in tiers["s3://b/kc"]

    # another (finished) process's log, with a malformed tiers field beside a good one
    stats_dir = tmp_path / ".stats"
    bad = {"v": 1, "delta": {"hits": 1}, "tiers": {"s3://b/kc": {"misses": 2, "hits": -1}}}
    worse = {"v": 1, "delta": {}, "tiers": ["not", "a", "mapping"]}
    (stats_dir / "otherhost-1-abcdef01.jsonl").write_text(
        json.dumps(bad) + "\n" + json.dumps(worse) + "\n"
    )
    folded, error = stats.fold_logs(Locker(root), ["otherhost-1-abcdef01.jsonl"])
    assert (folded, error) == (1, None)
    assert not os.path.exists(stats_dir / "otherhost-1-abcdef01.jsonl")
    after: dict = {}
    stats.read_logs(root, after)
    assert after["s3://b/kc"]["misses"] == 3 and after["s3://b/kc"]["hits"] == 0
    assert after["redis://h:6379/0"]["hits"] == 3


def test_at_most_so_many_tiers_are_read_from_a_log(tmp_path):
    stats_dir = tmp_path / ".stats"
    stats_dir.mkdir()
    many = {f"redis://h{i}:6379/0": {"hits": 1} for i in range(stats.MAX_TIERS + 10)}
    (stats_dir / "h-1-00000000.jsonl").write_text(json.dumps({"delta": {}, "tiers": many}))
    tiers: dict = {}
    stats.read_logs(str(tmp_path), tiers)
    assert len(tiers) == stats.MAX_TIERS
