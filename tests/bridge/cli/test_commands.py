"""The bridge's commands (``warm``, ``tune``, ``explain``) and entries as a new user meets them,
through the real command line: kernels of the user's own package imported from the working
directory, a core-only install told what to install, ``tune`` on a machine without a GPU,
``show`` of an autotune decision, and ``ls`` of a program entry that holds several kernels."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from cli_support import kc as run_kc
from support import REPO, child_env

pytest.importorskip("jax", reason="records and replays bridge calls")

KERNELS = """
import triton
import triton.language as tl


@triton.autotune(configs=[triton.Config({"BLOCK": 64}), triton.Config({"BLOCK": 128})], key=["n"])
@triton.jit
def tuned(x_ptr, n, out_ptr, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + i, tl.load(x_ptr + i, mask=i < n) * 2, mask=i < n)


@triton.jit
def plain(x_ptr, n, out_ptr, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + i, tl.load(x_ptr + i, mask=i < n) + 1, mask=i < n)
"""
# One program calling both kernels, lowered for each target given (no GPU needed).
RECORD = """
import sys
import jax, jax.numpy as jnp, triton
import bridge
from myproj.kernels import plain, tuned


def program(x, target):
    y = bridge.triton_call(
        x, x.size, kernel=plain, out_shape=x, grid=(x.size // 256,), BLOCK=256, target=target
    )
    grid = lambda meta: (triton.cdiv(x.size, meta["BLOCK"]),)
    return bridge.triton_call(y, y.size, kernel=tuned, out_shape=y, grid=grid, target=target)


x = jax.ShapeDtypeStruct((1024,), jnp.float32)
for target in sys.argv[1:]:
    platform = bridge.parse_target(target).platform
    jax.jit(program, static_argnums=1).trace(x, target).lower(lowering_platforms=(platform,))
"""


def kc(cwd: Path, *args: str, code: int, **env: str) -> subprocess.CompletedProcess[str]:
    """``kernelcache ARGS...`` in ``cwd``, which must exit with ``code``."""
    proc = run_kc(None, *args, env=env, timeout=300, cwd=cwd)
    assert proc.returncode == code, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def as_json(proc: subprocess.CompletedProcess[str]) -> Any:
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> dict[str, Path]:
    """A user's project (``myproj``, importable from its directory only), a manifest of one
    program recorded for cuda:90 and hip:gfx942, and a root the program was lowered into."""
    proj = tmp_path_factory.mktemp("proj")
    (proj / "myproj").mkdir()
    (proj / "myproj" / "__init__.py").write_text("")
    (proj / "myproj" / "kernels.py").write_text(KERNELS)
    manifest, root = proj / "manifest.jsonl", proj / "recorded"
    # recorded, then lowered again as a job would (a recording run stores no lowerings)
    for env in ({"KERNELCACHE_RECORD": str(manifest)}, {}):
        proc = subprocess.run(
            [sys.executable, "-c", RECORD, "cuda:90", "hip:gfx942"],
            env=child_env(KERNELCACHE_DIR=str(root), **env),
            capture_output=True,
            text=True,
            timeout=600,
            cwd=str(proj),
        )
        assert proc.returncode == 0, proc.stderr
    return {"proj": proj, "manifest": manifest, "root": root}


def test_tune_and_explain_import_the_users_kernels_from_the_working_directory(project, tmp_path):
    proj, manifest = project["proj"], str(project["manifest"])
    root = str(tmp_path / "root")
    pinned = as_json(
        kc(
            proj,
            "--root",
            root,
            "tune",
            manifest,
            "--pin",
            "myproj.kernels:tuned=1",
            "--json",
            code=0,
        )
    )
    assert {(r["target"], r["status"]) for r in pinned["results"]} == {
        ("cuda:90", "pinned"),
        ("hip:gfx942", "pinned"),
    }
    explained = as_json(
        kc(proj, "--root", str(project["root"]), "explain", manifest, "--json", code=0)
    )
    assert explained["problem"] == 0 and explained["hit"] == len(explained["results"]) > 0
    assert not any("No module named" in n for r in explained["results"] for n in r["notes"])


def test_show_says_what_a_decision_decided(project, tmp_path):
    proj, manifest = project["proj"], str(project["manifest"])
    root = tmp_path / "root"
    kc(
        proj,
        "--root",
        str(root),
        "tune",
        manifest,
        "--pin",
        "tuned=1",
        "--target",
        "cuda:90",
        code=0,
    )
    (entry,) = [
        e
        for e in as_json(
            kc(proj, "--root", str(root), "ls", "--kind", "decision", "--json", code=0)
        )["entries"]
        if e["kind"] == "decision"
    ]
    doc = as_json(kc(proj, "--root", str(root), "show", entry["key"], "--json", code=0))
    content = doc["content"]
    assert (content["chosen"], content["pinned"], content["device"]) == (1, True, "*")
    assert content["configs"][1].startswith("BLOCK: 128")
    text = kc(proj, "--root", str(root), "show", entry["key"], code=0).stdout
    assert "decision: config 1 (BLOCK: 128" in text and "pinned for every device" in text
    # a measured decision: the device, the margin and each config's time
    import kernelcache
    from bridge.entries.decisions import Decision

    pinned = Decision(**{k: v for k, v in _decision_fields(content).items()})
    measured = Decision(
        kernel=pinned.kernel,
        target=pinned.target,
        device="NVIDIA H200",
        variants=pinned.variants,
        configs=pinned.configs,
        chosen=0,
        times=(12.5e-6, 19.0e-6),
        margin=0.52,
        noise=0.01,
    )
    key = "7" * 64
    kernelcache.Cache(root, readonly_roots=()).put(
        key, "decision", measured.to_bytes(), measured.metadata()
    )
    text = kc(proj, "--root", str(root), "show", key, code=0).stdout
    assert "decision: config 0 (BLOCK: 64" in text and "measured on NVIDIA H200" in text
    assert "margin 52.0%" in text and "noise 1.0%" in text
    assert "*   0      12.5 us  BLOCK: 64" in text and "    1      19.0 us  BLOCK: 128" in text
    # a document that is not a usable decision is said to be one, never a crash
    kernelcache.Cache(root, readonly_roots=()).put("8" * 64, "decision", b"{}", measured.metadata())
    shown = as_json(kc(proj, "--root", str(root), "show", "8" * 64, "--json", code=0))
    assert "problem" in shown["content"]


def _decision_fields(doc: dict[str, Any]) -> dict[str, Any]:
    fields = ("kernel", "target", "device", "chosen", "margin", "noise", "pinned")
    out = {k: doc[k] for k in fields}
    out.update(
        variants=tuple(doc["variants"]), configs=tuple(doc["configs"]), times=tuple(doc["times"])
    )
    return out


def test_tune_without_a_gpu_says_that_pin_needs_none(project, tmp_path):
    proj, manifest = project["proj"], str(project["manifest"])
    root = str(tmp_path / "root")
    proc = kc(
        proj, "--root", root, "tune", manifest, "--target", "cuda:90", code=1, JAX_PLATFORMS="cpu"
    )
    assert "myproj.kernels:plain on cuda:90: single" in proc.stdout  # not autotuned
    skipped = [line for line in proc.stdout.splitlines() if line.startswith("myproj.kernels:tuned")]
    assert len(skipped) == 1 and "skipped: no cuda:90 device here" in skipped[0], proc.stdout
    assert "--pin myproj.kernels:tuned=INDEX decides without a GPU" in skipped[0]


def test_ls_and_prune_name_every_kernel_a_program_entry_holds(project):
    proj, root = project["proj"], str(project["root"])
    listed = as_json(kc(proj, "--root", root, "ls", "--kind", "all", "--json", code=0))
    programs = [e for e in listed["entries"] if e["ext"] == "program"]
    assert "cuda:90" in {p["target"] for p in programs}
    for entry in programs:
        assert entry["kernel"] == "plain, tuned"
        assert entry["qualname"] == "myproj.kernels:plain, myproj.kernels:tuned"
    assert "plain, tuned" in kc(proj, "--root", root, "ls", "--kind", "lowering", code=0).stdout
    for name in ("tuned", "myproj.kernels:tuned"):
        plan = as_json(
            kc(proj, "--root", root, "prune", "--kernel", name, "--dry-run", "--json", code=0)
        )
        doomed = {a["key"] for a in plan["plan"]["actions"] if a["action"] == "delete-entry"}
        assert {p["key"] for p in programs} <= doomed


def _core_only_site(site: Path) -> None:
    """A site of a core-only install (``pip install kernelcache``): kernelcache and the bridge's
    code, the core dependencies, and the package's entry point; no jax, triton, numpy."""
    site.mkdir()
    for name in ("kernelcache", "bridge"):
        (site / name).symlink_to(REPO / name)
    for name in ("xxhash", "platformdirs", "packaging", "filelock"):
        spec = importlib.util.find_spec(name)
        assert spec is not None and spec.submodule_search_locations
        (site / name).symlink_to(next(iter(spec.submodule_search_locations)))
    info = site / "kernelcache-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: kernelcache\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text("[kernelcache.commands]\nwarm = bridge.cli:register\n")


def test_a_core_only_install_says_what_to_install(project, tmp_path):
    site = tmp_path / "site"
    _core_only_site(site)
    manifest = str(project["manifest"])
    env = {k: v for k, v in child_env().items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(site)

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                sys.executable,
                "-S",
                "-m",
                "kernelcache.cli",
                "--root",
                str(tmp_path / "root"),
                *args,
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            cwd=str(tmp_path),
        )

    assert run("stats").returncode == 0  # the core commands work
    for args in (
        ["warm", manifest, "--target", "cuda:90"],
        ["tune", manifest, "--pin", "tuned=0"],
        ["explain", manifest],
    ):
        proc = run(*args)
        assert proc.returncode == 2, (args, proc.stderr)
        assert "pip install 'kernelcache[bridge]'" in proc.stderr, proc.stderr
        assert "numpy" in proc.stderr and "Traceback" not in proc.stderr
        doc = json.loads(run(*args, "--json").stdout)
        assert "kernelcache[bridge]" in doc["error"]
    assert not os.path.exists(tmp_path / "root") or not os.listdir(tmp_path / "root")
