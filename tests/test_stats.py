"""Per-process counters and the append-only per-process logs under the root."""

from __future__ import annotations

import json

from conftest import key_of, run_py

import kernelcache
from kernelcache import stats


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
