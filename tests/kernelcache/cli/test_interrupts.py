"""Ctrl-C, as a terminal sends it (SIGINT to the command's process group), in the middle of a
long operation: the command ends with exit 130 and says exactly what was kept. An export
writes its bundle whole or not at all, an import publishes all or nothing: neither says "what
was done is kept" where nothing was.

Each command runs with a progress line per step (``KERNELCACHE_PROGRESS_INTERVAL=0``) on a pipe
this test stops reading after the first: with more steps than the pipe holds lines, the
command cannot finish before the signal, whatever the machine's load."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest
from cli_support import KERNELCACHE, kc, kc_json, put
from support import child_env

#: more entries than a pipe holds progress lines (64 KiB of about 50-byte lines)
ENTRIES = 2000


def _interrupt(root: Path, *args: str, at: str) -> tuple[int, str]:
    """Run ``kernelcache --root ROOT ARGS``, send SIGINT to its process group once its stderr
    says ``at``, and return its exit code and its stderr."""
    assert KERNELCACHE is not None
    proc = subprocess.Popen(
        [KERNELCACHE, "--root", str(root), *args],
        env=child_env(KERNELCACHE_PROGRESS_INTERVAL="0"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert proc.stderr is not None
    said = ""
    while at not in said:
        line = proc.stderr.readline()
        assert line, f"it ended before {at!r}: {said}"
        said += line
    os.killpg(proc.pid, signal.SIGINT)
    _, rest = proc.communicate(timeout=120)  # (generous: it ends at once; a hang fails here)
    return proc.returncode, said + rest


@pytest.fixture(scope="module")
def many(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("interrupts") / "many"
    for i in range(ENTRIES):
        put(root, "matmul", seed=i, size=400)
    return root


@pytest.fixture(scope="module")
def bundle(many, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("bundle") / "many.tar"
    kc_json(many, "export", str(path))
    return path


def _last(said: str) -> str:
    return said.strip().splitlines()[-1]


def test_an_interrupted_export_writes_no_bundle_and_says_so(many, tmp_path):
    target = tmp_path / "out.tar"
    code, said = _interrupt(many, "export", str(target), at="kernelcache: exporting: ")
    assert code == 130, said
    last = _last(said)
    assert last.startswith("kernelcache: interrupted while exporting, after ")
    assert f"of {ENTRIES:,} entries; no bundle was written ({target} was not made)" in last
    assert "what was done is kept" not in said
    assert list(tmp_path.iterdir()) == []  # nor a partial file


def test_an_interrupted_export_over_a_bundle_leaves_it_as_it_was(many, tmp_path):
    target = tmp_path / "out.tar"
    target.write_bytes(b"the bundle of before")
    code, said = _interrupt(many, "export", str(target), "--force", at="kernelcache: exporting: ")
    assert code == 130, said
    assert f"no bundle was written ({target} is as it was)" in _last(said)
    assert target.read_bytes() == b"the bundle of before"
    assert [p.name for p in tmp_path.iterdir()] == ["out.tar"]


def test_an_interrupted_import_imports_nothing_and_says_so(bundle, tmp_path):
    root = tmp_path / "into"
    code, said = _interrupt(root, "import", str(bundle), at="kernelcache: importing: ")
    assert code == 130, said
    first = said.splitlines()[0]
    assert first.startswith("kernelcache: importing: ") and f"/{ENTRIES} (" in first  # a total
    last = _last(said)
    assert last.startswith("kernelcache: interrupted while importing, after ")
    assert "; nothing was imported (the " in last and " it published were removed again)" in last
    assert "what was done is kept" not in said
    assert kc_json(root, "ls", "--kind", "all")["count"] == 0


def test_an_interrupted_verify_changed_nothing_and_says_so(many):
    code, said = _interrupt(many, "verify", at="kernelcache: verifying: ")
    assert code == 130, said
    last = _last(said)
    assert last.startswith("kernelcache: interrupted while verifying, after ")
    assert last.endswith(
        f"of {ENTRIES:,} entries; nothing was changed: run the command again to finish"
    )


def test_an_interrupted_prune_keeps_what_it_removed(many, tmp_path):
    root = tmp_path / "pruned"
    shutil.copytree(many, root)
    code, said = _interrupt(
        root, "prune", "--older-than", "0s", "--yes", at="kernelcache: pruning: "
    )
    assert code == 130, said
    assert "what was done is kept: run the command again to finish" in _last(said)
    left = kc_json(root, "ls")["count"]
    assert 0 < left < ENTRIES
    assert kc(root, "verify").returncode == 0  # what is left is whole
    assert json.loads(kc(root, "prune", "--older-than", "0s", "--yes", "--json").stdout)
