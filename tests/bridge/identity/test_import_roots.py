"""A source file as the binary's debug information names it: relative to the longest
``sys.path`` entry that holds it (:func:`bridge.identity.static_reads.relative_path`), answered
again as ``sys.path`` and the working directory change within one process."""

from __future__ import annotations

import os
import sys

from bridge.identity.static_reads import relative_path


def test_the_longest_import_root_holding_a_file_names_it(tmp_path, monkeypatch):
    deep = tmp_path / "src" / "pkg"
    deep.mkdir(parents=True)
    path = str(deep / "k.py")
    monkeypatch.setattr(sys, "path", [str(tmp_path)])
    assert relative_path(path) == os.path.join("src", "pkg", "k.py")
    sys.path.insert(0, str(tmp_path / "src"))  # (the same process, a deeper root added)
    assert relative_path(path) == os.path.join("pkg", "k.py")
    sys.path[:] = ["/nowhere"]
    assert relative_path(path) == os.path.join("pkg", "k.py")  # no root: its directory's name


def test_a_relative_entry_is_relative_to_the_working_directory_now(tmp_path, monkeypatch):
    (tmp_path / "a" / "pkg").mkdir(parents=True)
    (tmp_path / "b").mkdir()
    path = str(tmp_path / "a" / "pkg" / "k.py")
    monkeypatch.setattr(sys, "path", [""])
    monkeypatch.chdir(tmp_path / "a")
    assert relative_path(path) == os.path.join("pkg", "k.py")
    monkeypatch.chdir(tmp_path / "b")
    assert relative_path(path) == os.path.join("pkg", "k.py")  # (no root holds it: its dir)
    monkeypatch.chdir(tmp_path)
    assert relative_path(path) == os.path.join("a", "pkg", "k.py")
    monkeypatch.setattr(sys, "path", [tmp_path / "a"])  # (a path-like entry)
    assert relative_path(path) == os.path.join("pkg", "k.py")
