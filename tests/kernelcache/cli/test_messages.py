"""What the commands say adds up and fits what was asked: verify's counts and the bytes its
repair moved, the interruption
of a read-only verify, another tool's command word, a command ``run`` cannot run (as a shell
says it), the command a JSON error names, and an export of nothing."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from cli_support import kc, kc_json, put


def _damaged(root: Path) -> None:
    """15 entries: one with a wrong digest, two whose metadata cannot be read."""
    arts = [put(root, "matmul", seed=i) for i in range(15)]
    Path(arts[0].path).write_bytes(b"\0" * Path(arts[0].path).stat().st_size)
    for art in arts[1:3]:
        Path(art.path).with_suffix(".json").write_text("{not json")


def test_verify_repair_says_every_byte_it_moved_to_the_quarantine(tmp_path):
    """A PTX entry whose metadata cannot be read counts with its artifact (the scan knows its
    metadata file alone), as a cubin with a wrong digest does."""
    root = tmp_path / "cache"
    cubin = put(root, "matmul", size=20_000)
    ptx = put(root, "matmul", ext="ptx", size=15_000)
    Path(cubin.path).write_bytes(b"\0" * 20_000)
    meta = Path(ptx.path).with_suffix(".json")
    meta.write_text("{not json")
    files = [Path(cubin.path), Path(cubin.path).with_suffix(".json"), Path(ptx.path), meta]
    moving = sum(f.stat().st_size for f in files)
    doc = kc_json(root, "verify", "--repair", code=0)
    assert doc["repair"]["quarantined_bytes"] == moving
    again = kc_json(root, "verify")
    assert again["clean"] and again["quarantine"]["bytes"] > moving  # (and the notes of why)
    for f in files:
        assert not f.exists()
    root2 = tmp_path / "again"
    put(root2, "matmul", ext="ptx", size=15_000)
    (meta2,) = root2.glob("*.json")
    meta2.write_text("{not json")
    text = kc(root2, "verify", "--repair").stdout
    assert "Moved 14.7 KiB to the quarantine" in text  # 15,000 + 9 bytes


def test_verify_counts_every_entry_it_checked_and_they_add_up(tmp_path):
    root = tmp_path / "cache"
    _damaged(root)
    shown = kc(root, "verify")
    assert shown.returncode == 1
    first = shown.stdout.splitlines()[0]
    assert first == (
        f"Checked 15 entries under {root} (each one's metadata, size and digest): 12 ok, 3 corrupt."
    ), first
    doc = kc_json(root, "verify", code=1)
    assert doc["entries_checked"] == 15 and doc["entries_ok"] == 12
    assert doc["entries_checked"] == doc["entries_ok"] + doc["counts"]["corrupt"]


def test_an_interrupted_read_only_verify_says_nothing_was_changed(tmp_path, monkeypatch, capsys):
    from kernelcache.cli import app
    from kernelcache.maintenance import verify as verifying

    root = tmp_path / "cache"
    put(root, "matmul")

    def interrupted_verify(store, base, *, progress):
        progress(1)
        raise KeyboardInterrupt

    monkeypatch.setattr(verifying, "verify", interrupted_verify)
    for args in (["verify"], ["verify", "--repair"]):  # (--repair: before any repair began)
        assert app.main(["--root", str(root), *args]) == 130
        said = capsys.readouterr().err.strip().splitlines()[-1]
        assert said == (
            "kernelcache: interrupted while verifying, after 1 of 1 entries; nothing was "
            "changed: run the command again to finish"
        ), said


def test_pip_cache_purge_is_answered_with_clear(tmp_path):
    proc = kc(tmp_path, "purge")
    assert proc.returncode == 2
    assert "did you mean 'clear'? (`pip cache purge` is `kernelcache clear`)" in proc.stderr
    assert "'prune'" not in proc.stderr.split("did you mean")[1]
    assert "did you mean 'stats'?" in kc(tmp_path, "stast").stderr  # a typo: the nearest


def test_run_exits_as_a_shell_does_when_the_command_cannot_be_run(tmp_path):
    missing = kc(tmp_path, "run", "--", "no-such-command-here")
    assert missing.returncode == 127
    assert "no-such-command-here: command not found" in missing.stderr
    script = tmp_path / "script.sh"
    script.write_text("#!/bin/sh\nexit 0\n")
    os.chmod(script, 0o644)  # not executable
    denied = kc(tmp_path, "run", "--", str(script))
    assert denied.returncode == 126 and f"{script}: cannot run it: " in denied.stderr
    doc = json.loads(kc(tmp_path, "--json", "run", "--", "no-such-command-here").stdout)
    assert doc["command"] == "run" and doc["error"].endswith("command not found")
    doc = json.loads(kc(tmp_path, "--json", "run").stdout)
    assert doc["command"] == "run" and "name the command to run" in doc["error"]


@pytest.mark.parametrize(
    "filters, why",
    [
        ([], "{root} holds no entries"),
        (["--kernel", "nope"], "no entry matches --kernel nope"),
        (["--kernel", "matmul", "--target", "hip:*"], "no entry matches --target hip:*"),
    ],
)
def test_an_export_of_nothing_says_so_and_why(tmp_path, filters, why):
    root = tmp_path / "cache"
    if filters:
        put(root, "matmul")
    else:
        root.mkdir()
    out = tmp_path / "b.tar"
    proc = kc(root, "export", str(out), *filters)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0] == (
        f"Nothing was exported: {why.format(root=root)}; {out} (uncompressed tar) holds an "
        "empty bundle."
    ), proc.stdout


@pytest.mark.parametrize(
    "options, hint, not_said",
    [
        (
            ["--older-than", "0s"],
            "(--older-than 0s selects every entry not used for 0s: give a longer AGE to keep "
            "the recent ones, e.g. 30d)",
            "--max-size",
        ),
        (
            ["--max-size", "1K"],
            "(--max-size 1.0 KiB keeps only what fits in it: give a larger SIZE; --max-size 0 "
            "means no size cap)",
            "--older-than",
        ),
    ],
)
def test_a_prune_refused_for_deleting_everything_hints_at_the_option_used(
    tmp_path, options, hint, not_said
):
    root = tmp_path / "cache"
    for i in range(3):
        put(root, "matmul", seed=i, size=2000)
    proc = kc(root, "prune", *options)
    assert proc.returncode == 2
    said = proc.stderr.strip().splitlines()[-1]
    assert said.endswith(hint), said
    assert not_said not in said
    assert kc_json(root, "ls")["count"] == 3  # nothing was done
