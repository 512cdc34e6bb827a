"""Explained misses, through the real command line: ``kernelcache warm`` in a process whose
toolchain differs in one component (another Triton version, faked in the child; or an edited
copy of the kernel's source), then ``kernelcache explain`` here names exactly that component,
and ``kernelcache import --dry-run`` counts which entries this machine would look up, and why
not the others. Entries without recorded components are still hits."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from cli_support import kc_code
from support import REPO

# the kernelcache command, in a process that believes its Triton is another release
FAKE_TRITON = """
import sys, triton
triton.__version__ = "3.9.0"
from kernelcache.cli import main
sys.exit(main(sys.argv[1:]))
"""
# the kernelcache command, in a process where Triton cannot be imported
NO_TRITON = """
import sys
sys.modules["triton"] = None
from kernelcache.cli import main
sys.exit(main(sys.argv[1:]))
"""
# the first record of the example manifest: add_kernel, recorded for cuda:90
RECORD = (REPO / "examples" / "manifest.jsonl").read_text().splitlines()[0]


def as_json(proc: subprocess.CompletedProcess[str]) -> Any:
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def other_triton(tmp_path_factory) -> dict[str, Path]:
    """A root warmed for cuda:90 by a process that believes its Triton is 3.9.0."""
    tmp = tmp_path_factory.mktemp("explain")
    manifest = tmp / "manifest.jsonl"
    manifest.write_text(RECORD + "\n")
    root = tmp / "root"
    kc_code(
        "--root",
        str(root),
        "warm",
        str(manifest),
        "--target",
        "cuda:90",
        code=0,
        prelude=FAKE_TRITON,
    )
    return {"tmp": tmp, "manifest": manifest, "root": root}


def test_explain_names_the_triton_version_that_differs(other_triton):
    root, manifest = str(other_triton["root"]), str(other_triton["manifest"])
    doc = as_json(kc_code("--root", root, "explain", manifest, "--json", code=1))
    assert (doc["command"], doc["hit"], doc["miss"]) == ("explain", 0, 1)
    (result,) = doc["results"]
    assert result["status"] == "miss" and result["target"] == "cuda:90"
    nearest = result["nearest"]
    assert nearest["layer"] == "local" and nearest["components_recorded"] is True
    # exactly the one component faked: the compiler identity it implies is not named again
    assert nearest["differences"] == [
        {
            "component": "triton",
            "here": "3.6.0",
            "entry": "3.9.0",
            "detail": "Triton version 3.6.0 here vs 3.9.0 in the entry",
        }
    ]
    text = kc_code("--root", root, "explain", manifest, code=1).stdout
    assert "Triton version 3.6.0 here vs 3.9.0 in the entry" in text
    assert "0 hit, 1 missed" in text
    # the same toolchain as the warm run: a hit
    same = as_json(
        kc_code("--root", root, "explain", manifest, "--json", code=0, prelude=FAKE_TRITON)
    )
    assert [r["status"] for r in same["results"]] == ["hit"]


def test_import_dry_run_says_which_entries_this_machine_would_look_up(other_triton):
    tmp, root = other_triton["tmp"], str(other_triton["root"])
    # one more kernel, for hip:gfx942, warmed with this machine's Triton
    kc_code("--root", root, "warm", str(other_triton["manifest"]), "--target", "hip:gfx942", code=0)
    bundle = str(tmp / "bundle.tar")
    kc_code("--root", root, "export", bundle, "--force", code=0)
    empty = str(tmp / "empty")
    doc = as_json(
        kc_code(
            "--root",
            empty,
            "import",
            "--dry-run",
            bundle,
            "--json",
            code=0,
            KERNELCACHE_TARGET="cuda:90",
        )
    )
    lookup = doc["lookup"]
    assert lookup["toolchain"] == "bridge: Triton 3.6.0, cuda:90"
    reasons = {r["reason"]: r["entries"] for r in lookup["not_looked_up"]}
    # the 3.9.0 cubin and its PTX companion; the hip kernel; the other installation's memos
    assert reasons == {
        "Triton 3.9.0 (here 3.6.0)": 2,
        "target hip:gfx942 (here cuda:90)": 1,
        "memo of another installation's compiler identity (recomputed here)": 2,
    }
    # this machine's own identity memo (written by the hip warm run) is looked up
    assert lookup["looked_up"] == doc["entries"] - sum(reasons.values()) >= 1
    text = kc_code(
        "--root", empty, "import", "--dry-run", bundle, code=0, KERNELCACHE_TARGET="cuda:90"
    ).stdout
    assert (
        "  2 Triton 3.9.0 (here 3.6.0)" in text and "  1 target hip:gfx942 (here cuda:90)" in text
    )
    assert not os.path.exists(empty) or not os.listdir(empty)  # a dry run writes nothing
    # without the bridge's dependencies: said so, the rest of the dry run as before
    bare = as_json(
        kc_code("--root", empty, "import", "--dry-run", bundle, "--json", code=0, prelude=NO_TRITON)
    )
    assert bare["lookup"]["looked_up"] is None and bare["entries"] == doc["entries"]
    assert "which entries this machine would look up is not known" in bare["lookup"]["toolchain"]


def test_explain_names_an_edited_source_and_serves_entries_without_components(tmp_path):
    package = tmp_path / "edited"
    package.mkdir()
    (package / "__init__.py").write_text("")
    kernels = package / "kernels.py"
    source = (REPO / "examples" / "kernels.py").read_text()
    kernels.write_text(source)
    record = json.loads(RECORD)
    record["kernel"] = "edited.kernels:add_kernel"
    manifest = tmp_path / "manifest.jsonl"
    manifest.write_text(json.dumps(record) + "\n")
    env = {"PYTHONPATH": f"{REPO}{os.pathsep}{tmp_path}"}
    common = ("--root", str(tmp_path / "root"))
    kc_code(*common, "warm", str(manifest), "--target", "cuda:90", code=0, **env)

    def explain(code: int) -> dict[str, Any]:
        (result,) = as_json(kc_code(*common, "explain", str(manifest), "--json", code=code, **env))[
            "results"
        ]
        return result

    # edit the kernel's body: its key changes; explain names the source, and only the source
    edited = source.replace("    mask = offs < n\n", "    mask = offs < n  # edited\n", 1)
    assert edited != source
    kernels.write_text(edited)
    result = explain(code=1)
    assert result["status"] == "miss" and result["nearest"]["components_recorded"] is True
    assert [d["component"] for d in result["nearest"]["differences"]] == ["code"]
    assert "the kernel's source changed since the manifest was recorded" in result["notes"]
    text = kc_code(*common, "explain", str(manifest), code=1, **env).stdout
    assert (
        "code digest (the kernel's source, settings and first line, and its JIT helpers') differs"
        in text
    )
    # an entry written before entries recorded components: still a hit, and as the nearest
    # entry compared by what it records (target, Triton version)
    (meta,) = [p for p in (tmp_path / "root").glob("*.json") if '"components"' in p.read_text()]
    doc = json.loads(meta.read_text())
    del doc["components"]
    meta.write_text(json.dumps(doc))
    result = explain(code=1)
    assert result["nearest"]["components_recorded"] is False
    assert result["nearest"]["differences"] == []
    assert (
        "components not recorded"
        in kc_code(*common, "explain", str(manifest), code=1, **env).stdout
    )
    kernels.write_text(source)
    assert explain(code=0)["status"] == "hit"


def test_explain_takes_target_patterns_and_names_only_the_target_that_differs(tmp_path):
    """``--target`` takes names and patterns that select among the recorded targets, as
    ``tune`` and ``prune`` do; an entry of another target differs in the target (and what the
    target implies), not in an options digest."""
    manifest = tmp_path / "manifest.jsonl"
    manifest.write_text(RECORD + "\n")  # recorded for cuda:90
    common = ("--root", str(tmp_path / "root"))
    kc_code(*common, "warm", str(manifest), "--target", "cuda:80", code=0)
    doc = as_json(
        kc_code(*common, "explain", str(manifest), "--target", "cuda:*", "--json", code=1)
    )
    (result,) = doc["results"]
    assert result["target"] == "cuda:90" and result["status"] == "miss"
    assert result["nearest"]["target"] == "cuda:80"
    assert [d["component"] for d in result["nearest"]["differences"]] == ["target"]
    named = as_json(
        kc_code(*common, "explain", str(manifest), "--target", "cuda:80", "--json", code=0)
    )
    assert [r["status"] for r in named["results"]] == ["hit"]
    none = kc_code(*common, "explain", str(manifest), "--target", "hip:*", code=2)
    assert "--target hip:* matches no target" in none.stderr and "cuda:90" in none.stderr


def _files(root: Path) -> dict[str, int]:
    """Every file under ``root`` but the statistics logs and index, with its size."""
    if not root.exists():
        return {}
    return {
        str(p.relative_to(root)): p.stat().st_size
        for p in root.rglob("*")
        if p.is_file() and ".stats" not in p.parts
    }


def test_explain_writes_nothing(tmp_path):
    """Explaining does not change the cache it explains: a mistyped root is not created, and
    a warm one gets no new entry (the compiler's identity memos included)."""
    manifest = tmp_path / "manifest.jsonl"
    manifest.write_text(RECORD + "\n")
    typo = tmp_path / "rot"
    kc_code("--root", str(typo), "explain", str(manifest), code=1)
    assert not typo.exists(), sorted(_files(typo))
    root = tmp_path / "root"
    kc_code("--root", str(root), "warm", str(manifest), "--target", "cuda:90", code=0)
    before = _files(root)
    doc = as_json(kc_code("--root", str(root), "explain", str(manifest), "--json", code=0))
    assert [r["status"] for r in doc["results"]] == ["hit"]
    assert _files(root) == before


def test_what_another_triton_implies_is_not_named_again():
    """Another Triton version is another compiler, backend, signature specialization, options
    class and environment: a miss names the version, and what it does not imply (the code)."""
    from bridge.cli.explain import differences

    here = {
        "triton": "3.6.0",
        "compiler": "a",
        "target": "cuda:90",
        "backend": "b",
        "code": "c",
        "signature": "s",
        "options": "o",
        "environment": "e",
    }
    entry = {**{k: v + "'" for k, v in here.items()}, "target": "cuda:90"}
    entry["triton"] = "3.9.0"
    assert [d.component for d in differences(here, entry)] == ["triton", "code"]
    only_target = {**here, "target": "cuda:80", "backend": "b'", "options": "o'"}
    assert [d.component for d in differences(here, only_target)] == ["target"]
    only_options = {**here, "options": "o'"}
    assert [d.component for d in differences(here, only_options)] == ["options"]
