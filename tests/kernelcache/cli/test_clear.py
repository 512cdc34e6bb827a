"""``kernelcache clear``, ``kernelcache stats --zero`` and patterns in ``--kernel``/``--target``,
through the real console script (a pseudo-terminal for clear's confirmation)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from cli_support import answer_on_a_terminal, files_under, kc, kc_json, put
from support import child_env, run_py


@pytest.fixture
def populated(tmp_path: Path) -> Path:
    root = tmp_path / "cache"
    for i in range(4):
        put(root, "matmul_a", "cuda:90", size=1000 + i)
    for i in range(2):
        put(root, "matmul_b", "cuda:80", size=2000 + i)
    for i in range(3):
        put(root, "softmax", "hip:gfx942", "hsaco", size=3000 + i)
    return root


# -- patterns -------------------------------------------------------------------------------
def keys_of(doc: dict) -> set[tuple[str, str]]:
    return {(e["kernel"], e["target"]) for e in doc["entries"]}


def test_patterns_select_in_ls_prune_and_export(populated, tmp_path):
    assert kc_json(populated, "ls", "--target", "cuda:*")["count"] == 6
    assert kc_json(populated, "ls", "--kernel", "matmul_?", "--target", "cuda:[8]0")["count"] == 2
    assert kc_json(populated, "ls", "--kernel", "soft*", "--kernel", "matmul_a")["count"] == 7
    assert kc_json(populated, "ls", "--target", "rocm:*")["count"] == 0
    bundle = tmp_path / "b.tar"
    assert kc_json(populated, "export", str(bundle), "--kernel", "*_b")["entries"] == 2
    doc = kc_json(populated, "prune", "--target", "hip:gfx9*")
    assert doc["result"]["counts"] == {"done": 3}
    assert keys_of(kc_json(populated, "ls")) == {("matmul_a", "cuda:90"), ("matmul_b", "cuda:80")}


@pytest.mark.parametrize("pattern", ["cuda::*", "*:", ":*", "cuda:[%]", "-*x", "a" * 70 + "*"])
def test_a_target_pattern_no_target_could_match_is_a_usage_error(populated, pattern):
    for command in (["ls"], ["prune", "--dry-run"], ["export", "/dev/null"]):
        proc = kc(populated, *command, f"--target={pattern}")
        assert proc.returncode == 2, (command, proc.stderr)
        assert f"invalid target pattern {pattern!r}: no target could match it" in proc.stderr


def test_warm_needs_each_target_named(tmp_path):
    proc = kc(tmp_path, "warm", "manifest.jsonl", "--target", "cuda:*")
    assert proc.returncode == 2
    assert "'cuda:*' is a pattern: name each target" in proc.stderr


# -- clear ----------------------------------------------------------------------------------
def test_clear_dry_run_then_clear_without_a_terminal(populated, tmp_path):
    image = tmp_path / "image"
    put(image, "baked")
    baked = files_under(image)
    env = {"KERNELCACHE_READONLY_DIRS": str(image)}
    kc_json(populated, "ls")  # (a scan writes the scan index under .stats/)
    before = files_under(populated)
    doc = kc_json(populated, "clear", "--dry-run", env=env)
    assert doc["dry_run"] and doc["result"] is None
    assert doc["plan"]["summary"]["delete-entry"]["count"] == 9
    assert files_under(populated) == before
    text = kc(populated, "clear", "--dry-run").stdout
    assert "Would remove 9 entries" in text and "nothing was changed" in text
    # standard input is not a terminal: no question (as pip cache purge)
    proc = kc(populated, "clear", env=env)
    assert proc.returncode == 0, proc.stderr
    assert "9 done" in proc.stdout
    assert kc_json(populated, "ls")["count"] == 0
    assert files_under(image) == baked
    # a read-only root is refused, even when named as the root
    proc = kc(image, "clear", "--yes", env=env)
    assert proc.returncode == 2 and "read-only root" in proc.stderr
    assert files_under(image) == baked


def clear_on_a_terminal(root: Path, answer: str | None, *args: str) -> tuple[int, str]:
    """Run ``kernelcache clear`` with standard input on a pseudo-terminal; type ``answer``
    once the question shows (None: expect no question)."""
    return answer_on_a_terminal(root, answer, "clear", *args)


def test_clear_asks_on_a_terminal(populated):
    code, shown = clear_on_a_terminal(populated, "n")
    assert "Remove 9 entries" in shown and "[y/N]" in shown
    assert code == 2 and "not confirmed: nothing was removed" in shown  # 2: nothing was done
    assert kc_json(populated, "ls")["count"] == 9
    code, shown = clear_on_a_terminal(populated, "y")
    assert code == 0, shown
    assert kc_json(populated, "ls")["count"] == 0


def test_clear_yes_does_not_ask(populated):
    code, shown = clear_on_a_terminal(populated, None, "--yes", "--json")
    assert code == 0 and "[y/N]" not in shown
    assert json.loads(shown[shown.index("{") :])["result"]["counts"] == {"done": 9}
    assert kc_json(populated, "ls")["count"] == 0


# -- stats --zero ---------------------------------------------------------------------------
WRITER = """
import hashlib, sys, time
import kernelcache
from kernelcache import stats
cache = kernelcache.Cache()
key = hashlib.sha256(b"k").hexdigest()
cache.put(key, "bin", b"x" * 100, {})
print("ready", flush=True)
for line in sys.stdin:  # one hit per line, flushed at once
    cache.get(key, "bin")
    stats.flush()
    print("done", flush=True)
"""


def test_stats_zero_while_a_process_writes(tmp_path):
    root = tmp_path / "cache"
    run_py(
        """
        import hashlib, kernelcache
        cache = kernelcache.Cache()
        for i in range(3):
            key = hashlib.sha256(str(i).encode()).hexdigest()
            cache.put(key, "bin", b"y" * 10, {})
            cache.get(key, "bin")
        """,
        KERNELCACHE_DIR=str(root),
    )
    kc_json(root, "prune")  # folds the finished process's log into the summary
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER],
        env=child_env(KERNELCACHE_DIR=str(root)),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert writer.stdout.readline().strip() == "ready"
        for _ in range(2):
            writer.stdin.write("hit\n")
            writer.stdin.flush()
            assert writer.stdout.readline().strip() == "done"
        counters = kc_json(root, "stats")["counters"]
        assert counters["hits"] == 5 and counters["puts"] == 4
        doc = kc_json(root, "stats", "--zero")
        assert doc["zeroed"] >= 2 and doc["problems"] == []  # the summary and the live log
        assert kc_json(root, "stats")["counters"]["hits"] == 0
        writer.stdin.write("hit\n")
        writer.stdin.flush()
        assert writer.stdout.readline().strip() == "done"
        counters = kc_json(root, "stats")["counters"]
        assert counters["hits"] == 1 and counters["puts"] == 0  # only what came after
        assert kc_json(root, "stats")["entries"] == 4  # entries stay
    finally:
        writer.stdin.close()
        writer.wait(timeout=60)
    text = kc(root, "stats", "-z").stdout
    assert text.startswith(f"Statistics zeroed under {root}")
