"""The operator's views show kernels, the rest on request: ``ls`` lists entries without a
``kind`` and counts the others under the list (``--kind`` lists them), ``stats`` leads with
the kernels and breaks the others down with ``--all``; ``warm``, ``ls`` and ``stats`` give one
count of kernels."""

from __future__ import annotations

import json
import re

from cli_support import kc, kc_json, put
from support import REPO, key_of

from kernelcache.store import Store

EXAMPLES = (REPO / "examples" / "manifest.jsonl").read_text().splitlines()


def _beside(root, kind: str, n: int) -> None:
    """``n`` entries a package keeps beside its kernels, of ``kind``."""
    for i in range(n):
        Store(root).put(key_of(kind, i), "bin", b"memo", {"kind": kind, "name": f"{kind}:{i}"})


def test_ls_lists_kernels_and_counts_the_rest(tmp_path):
    root = tmp_path / "cache"
    kernels = [put(root, "matmul", size=400, seed=i) for i in range(3)]
    _beside(root, "identity", 2)
    _beside(root, "decision", 1)
    human = kc(root, "ls").stdout
    assert "identity:" not in human and "decision:" not in human
    assert "3 kernels, " in human
    assert "Not shown: 3 other entries (1 decision, 2 identity): --kind KIND lists them" in human
    doc = kc_json(root, "ls")
    assert {e["key"] for e in doc["entries"]} == {a.key for a in kernels}
    assert doc["hidden"] == {"decision": 1, "identity": 2} and doc["kinds"] == ["kernel"]
    only = kc_json(root, "ls", "--kind", "identity")
    assert [e["kind"] for e in only["entries"]] == ["identity", "identity"]
    assert only["hidden"] == {"decision": 1, "kernel": 3}
    assert kc_json(root, "ls", "--kind", "all")["count"] == 6
    bad = kc(root, "ls", "--kind", "Not A Kind")
    assert bad.returncode == 2 and "invalid kind" in bad.stderr


def test_kind_takes_the_words_ls_prints_and_refuses_others(tmp_path):
    """--kind takes the summary's words (``kernels``) and the EXT column's (``ident``); a
    word that names no kind of the root is a usage error that lists the kinds it takes."""
    root = tmp_path / "cache"
    for i in range(3):
        put(root, "matmul", size=400, seed=i)
    for i in range(2):
        Store(root).put(key_of("memo", i), "ident", b"memo", {"kind": "identity", "name": "m"})
    plural = kc(root, "ls", "--kind", "kernels")
    assert plural.returncode == 0 and "3 kernels, " in plural.stdout, plural.stdout
    assert kc_json(root, "ls", "--kind", "kernels")["count"] == 3
    by_ext = kc_json(root, "ls", "--kind", "ident")
    assert [e["kind"] for e in by_ext["entries"]] == ["identity", "identity"]
    assert by_ext["hidden"] == {"kernel": 3}
    assert kc_json(root, "ls", "--kind", "cubin")["count"] == 3
    for args in (["--kind", "bogus"], ["--kind", "kernels", "--kind", "decisions"]):
        proc = kc(root, "ls", *args)
        assert proc.returncode == 2, proc.stdout
        said = " ".join(proc.stderr.split())
        assert f"unknown kind {args[-1]!r}" in said, said
        assert "identity, kernel" in said and "cubin, ident" in said and "or all" in said
        assert "(no entries)" not in proc.stdout
    doc = json.loads(kc(root, "ls", "--kind", "bogus", "--json").stdout)
    assert "unknown kind 'bogus'" in doc["error"]


def test_stats_leads_with_kernels_and_breaks_the_rest_down_on_request(tmp_path):
    root = tmp_path / "cache"
    for i in range(3):
        put(root, "matmul", size=400, seed=i)
    _beside(root, "identity", 2)
    human = kc(root, "stats").stdout
    assert re.search(r"^Kernels: +3$", human, re.M), human
    assert re.search(r"^Entries: +5 \(3 kernels, 2 identity\)$", human, re.M), human
    assert "Memoized values" not in human and "PTX companions" not in human
    assert "EXTENSION" not in human and "KERNEL " in human and "stats --all" in human
    every = kc(root, "stats", "--all").stdout
    assert "Memoized values" in every and "EXTENSION" in every and "KIND" in every
    assert kc_json(root, "stats")["by_kind"]["kernel"]["entries"] == 3  # JSON has everything


def test_warm_ls_and_stats_count_the_same_kernels(tmp_path):
    root, manifest = tmp_path / "cache", tmp_path / "add.jsonl"
    manifest.write_text(EXAMPLES[0] + "\n")
    warm = kc(root, "warm", str(manifest), "--target", "cuda:90", cwd=REPO)
    assert warm.returncode == 0, warm.stderr
    compiled = int(re.search(r"compiled +(\d+)", warm.stdout).group(1))
    listed = kc_json(root, "ls")
    stats = kc(root, "stats").stdout
    assert compiled == listed["count"] >= 1, (warm.stdout, json.dumps(listed))
    assert re.search(rf"^Kernels: +{compiled}$", stats, re.M), stats
    assert listed["hidden"], "the PTX and the memoized values are kept beside, not listed"


def test_a_warm_rerun_that_finds_everything_is_all_hits(tmp_path):
    """Each kernel a re-run finds present is a build avoided: a hit, so the hit rate is not
    left at 0% by a warm that compiles nothing."""
    root, manifest = tmp_path / "cache", tmp_path / "add.jsonl"
    manifest.write_text(EXAMPLES[0] + "\n")
    assert kc(root, "warm", str(manifest), "--target", "cuda:90", cwd=REPO).returncode == 0
    first = kc_json(root, "stats")["counters"]
    again = kc(root, "warm", str(manifest), "--target", "cuda:90", cwd=REPO)
    present = int(re.search(r"already present +(\d+)", again.stdout).group(1))
    assert present >= 1, again.stdout
    after = kc_json(root, "stats")
    assert after["counters"]["hits"] == first["hits"] + present
    assert after["counters"]["misses"] == first["misses"] and after["hit_rate"] > 0
