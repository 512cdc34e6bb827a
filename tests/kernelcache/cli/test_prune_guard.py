"""One meaning of a size: ``--max-size 0`` is no size cap, as ``KERNELCACHE_MAX_SIZE=0`` is;
and a prune that would delete every entry of the root, or every kernel of it (what it keeps of
other kinds counts for nothing), asks first on a terminal, and does nothing elsewhere unless
``--yes`` says so."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_support import answer_on_a_terminal, kc, kc_json, put
from support import key_of

from kernelcache.store import Store


@pytest.fixture
def populated(tmp_path: Path) -> Path:
    root = tmp_path / "cache"
    for i in range(5):
        put(root, "matmul", "cuda:90", size=1000 + i, last_used=86400 * (3 + i))
    return root


def _count(root: Path) -> int:
    return int(kc_json(root, "ls")["count"])


def test_max_size_0_is_no_cap_as_in_the_variable(populated):
    """The line from a job script, run with the variable unset (or 0): nothing is deleted."""
    proc = kc(populated, "prune", "--max-size", "0")
    assert proc.returncode == 0, proc.stderr
    assert "--max-size 0: no size cap (as KERNELCACHE_MAX_SIZE=0)" in proc.stdout
    assert _count(populated) == 5
    doc = kc_json(populated, "prune", "--max-size", "0", "--dry-run")
    assert doc["criteria"]["max_size"] is None and doc["plan"]["kept_entries"] == 5


@pytest.mark.parametrize(
    "args", [["--older-than", "1d"], ["--max-size", "1B"], ["--kernel", "matmul"]]
)
def test_a_prune_of_every_entry_does_nothing_off_a_terminal_without_yes(populated, args):
    proc = kc(populated, "prune", *args)
    assert proc.returncode == 2, proc.stderr  # 2: nothing was done
    assert "would delete every entry of" in proc.stderr and "(5," in proc.stderr
    assert "pass --yes" in proc.stderr and "--dry-run" in proc.stderr
    assert _count(populated) == 5
    refused = kc(populated, "prune", *args, "--json")
    assert (
        refused.returncode == 2
        and "would delete every entry" in json.loads(refused.stdout)["error"]
    )
    done = kc_json(populated, "prune", *args, "--yes")
    assert done["result"]["counts"] == {"done": 5} and _count(populated) == 0


def test_a_prune_that_keeps_some_entries_does_not_ask(populated):
    doc = kc_json(populated, "prune", "--older-than", "5d")
    assert doc["result"]["counts"] == {"done": 3} and _count(populated) == 2


def test_a_prune_of_every_entry_asks_on_a_terminal(populated):
    code, shown = answer_on_a_terminal(populated, "n", "prune", "--older-than", "1d")
    assert "This prune deletes every entry of" in shown and "[y/N]" in shown
    assert code == 2 and "not confirmed: nothing was removed" in shown
    assert _count(populated) == 5
    code, shown = answer_on_a_terminal(populated, "y", "prune", "--older-than", "1d")
    assert code == 0 and "Pruned: 5 done" in shown, shown
    assert _count(populated) == 0


def test_a_prune_of_every_kernel_asks_though_entries_of_other_kinds_stay(tmp_path):
    root = tmp_path / "cache"
    for i in range(3):
        put(root, "matmul", "cuda:90", size=1000 + i)
    for i in range(4):  # memoized values a package keeps beside the kernels: no target
        Store(root).put(key_of("memo", i), "ident", b"memo", {"kind": "identity", "name": "m"})
    proc = kc(root, "prune", "--target", "*")
    assert proc.returncode == 2, proc.stdout
    said = " ".join(proc.stderr.split())
    assert "would delete every kernel of" in said and "(3 kernels in 3 entries" in said, said
    assert "pass --yes" in said
    assert _count(root) == 3
    done = kc_json(root, "prune", "--target", "*", "--yes")
    assert done["result"]["counts"] == {"done": 3} and _count(root) == 0
    assert kc_json(root, "ls", "--kind", "identity")["count"] == 4
