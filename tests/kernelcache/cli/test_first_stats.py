"""The first ``stats`` of a large root reads every metadata file to make the scan index (about
9 s at 100,000 entries, against 0.5 s once it is made): it says so first, and later runs,
which read the index, say nothing."""

from __future__ import annotations

from cli_support import put

from kernelcache.cli import app, statistics


def _stats(root, capsys) -> str:
    assert app.main(["--root", str(root), "stats", "--json"]) == 0
    return capsys.readouterr().err


def test_the_first_stats_of_a_large_root_says_it_reads_every_entry_once(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setattr(statistics, "INDEXING_NOTICE", 5)  # "large": 5 entries here
    root = tmp_path / "cache"
    for i in range(8):
        put(root, "matmul", size=300, seed=i)
    said = _stats(root, capsys)
    assert "reading the metadata of 8 entries that the scan index of" in said, said
    assert "(once: later runs read the index)" in said
    assert "reading the metadata" not in _stats(root, capsys)  # the index is made
    put(root, "matmul", size=300, seed=99)  # one new entry: read without a word
    assert "reading the metadata" not in _stats(root, capsys)


def test_a_small_root_says_nothing(tmp_path, capsys):
    root = tmp_path / "cache"
    for i in range(3):
        put(root, "matmul", size=300, seed=i)
    assert "reading the metadata" not in _stats(root, capsys)
