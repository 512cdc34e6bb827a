"""``verify --repair`` of many corrupt entries is a summary: problems by kind and the first
few (``-v``: every one), what the repair did, and what the quarantine holds afterwards (moved,
not freed) with how to empty it; no line per entry on standard error."""

from __future__ import annotations

from pathlib import Path

from cli_support import kc, kc_json, put

CORRUPT = 40


def _damaged(root: Path) -> None:
    for i in range(CORRUPT):
        art = put(root, "matmul", size=2000, seed=i)
        Path(art.path).write_bytes(b"\0" * 2000)  # same size, wrong digest
    put(root, "fine", size=500)


def test_a_repair_of_many_entries_is_a_summary(tmp_path):
    root = tmp_path / "cache"
    _damaged(root)
    proc = kc(root, "verify", "--repair")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) <= 16, proc.stdout
    assert f"Problems ({CORRUPT}): {CORRUPT} corrupt" in proc.stdout
    assert f"... and {CORRUPT - 10} more problems (-v lists every one)" in proc.stdout
    assert f"Repaired: {CORRUPT} corrupt entries moved to .quarantine/." in proc.stdout
    assert "freed 0 B" in proc.stdout and "KiB freed" not in proc.stdout
    (said,) = [line for line in lines if line.startswith("Quarantine: ")]
    held = sorted((root / ".quarantine").iterdir())
    assert said.startswith(f"Quarantine: {len(held)} files, ") and len(held) >= CORRUPT
    assert "`kernelcache prune --quarantine-age 0s` empties it now" in said
    assert "quarantined" not in proc.stderr, proc.stderr  # no warning per entry


def test_v_lists_every_problem_and_json_has_the_quarantine(tmp_path):
    root = tmp_path / "cache"
    _damaged(root)
    shown = kc(root, "verify", "-v").stdout
    assert sum(" artifact digest mismatch" in line for line in shown.splitlines()) == CORRUPT
    doc = kc_json(root, "verify", "--repair", code=0)
    assert doc["repair"]["freed_bytes"] == 0 and doc["repair"]["quarantined_bytes"] > 0
    files = sorted((root / ".quarantine").iterdir())
    assert doc["quarantine"] == {"files": len(files), "bytes": sum(f.stat().st_size for f in files)}
    emptied = kc_json(root, "prune", "--quarantine-age", "0s")
    assert emptied["result"]["freed_bytes"] == doc["quarantine"]["bytes"]
    assert not list((root / ".quarantine").iterdir())
    assert "Quarantine:" not in kc(root, "verify").stdout
