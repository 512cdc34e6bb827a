"""``kernelcache warm`` end to end, in real processes: record in one, warm in another for other
targets, lower in a third with the warmed root read-only (zero Triton compiles, the same opaque as
a direct compile); re-runs compile nothing; kernels that vanished, changed, fail to compile or
crash the compiler are reported with their reasons; the README's main job works as written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import command_server
import pytest
from bridge_helpers import COUNT_COMPILES, REPO, run_child
from cli_support import KERNELCACHE, files_under
from support import CAN_UNSHARE, child_env, run_in_namespace, run_on_a_terminal

from kernelcache.stats import read_logs

# Lowers the example ops (Triton, autotuned Triton with 4 configs, Gluon) for a target and
# returns the sha256 of each custom call's opaque.
OPS = """
import hashlib, json, os
import jax, jax.numpy as jnp
from bridge_helpers import custom_calls, lowered_module
from examples import ops

f32 = jax.ShapeDtypeStruct((4096,), jnp.float32)
bf16 = jax.ShapeDtypeStruct((128, 128), jnp.bfloat16)

def lower(target, **kw):
    kw = dict(kw, target=target, embed="inline")
    platform = "cuda" if target.startswith("cuda") else "rocm"
    cases = {
        "add": (lambda x, y: ops.add(x, y, **kw), (f32, f32)),
        "matmul": (lambda a, b: ops.matmul(a, b, **kw), (bf16, bf16)),
        "gluon": (lambda x: ops.gluon_scale(x, 2.0, **kw), (f32,)),
    }
    out = {}
    for name, (fn, avals) in cases.items():
        (call,) = custom_calls(lowered_module(fn, *avals, platform=platform))
        out[name] = hashlib.sha256(call["opaque"]).hexdigest()
    return out
"""

# Process 1: records a cuda:90 run, then (recording off) compiles hip:gfx942 directly into a
# fresh cache: the reference opaques.
RECORD = (
    COUNT_COMPILES
    + OPS
    + """
recorded = lower("cuda:90")
del os.environ["KERNELCACHE_RECORD"]
direct = lower("hip:gfx942", cache=os.environ["DIRECT_ROOT"])
print(json.dumps({"recorded": recorded, "direct": direct}))
"""
)

# Process 3: lowers for hip:gfx942 with whatever cache the environment configures.
LOWER = (
    COUNT_COMPILES
    + OPS
    + """
import kernelcache
from bridge.compile import compiler as bridge_compile
opaques = lower("hip:gfx942")
print(json.dumps({"opaques": opaques, "counts": counts,
                  "compiles": bridge_compile.compile_count(),
                  "stats": kernelcache.process_stats()}))
"""
)


def kc(
    root: Path | None, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the installed console script from the repository root, as the README does."""
    if KERNELCACHE is None:
        pytest.fail("the kernelcache console script is not installed: pip install -e '.[bridge]'")
    given = ["--root", str(root)] if root is not None else []
    return command_server.run(
        KERNELCACHE, [*given, *args], child_env(**(env or {})), timeout=300, cwd=REPO
    )


def warm_json(root: Path | None, *args: str, code: int, env: dict[str, str] | None = None) -> Any:
    proc = kc(root, "warm", *args, "--json", env=env)
    assert proc.returncode == code, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    assert "\r" not in proc.stderr  # no progress bar when piped (plain lines at most)
    return json.loads(proc.stdout)


def statuses(doc: dict[str, Any]) -> dict[tuple[str, str], list[str]]:
    out: dict[tuple[str, str], list[str]] = {}
    for r in doc["results"]:
        out.setdefault((r["kernel"].split(":")[1], r["target"]), []).append(r["status"])
    return out


@pytest.fixture(scope="module")
def warmed(tmp_path_factory) -> dict[str, Any]:
    """Record (process 1), then warm for hip:gfx942 with the CLI (process 2)."""
    tmp = tmp_path_factory.mktemp("warm")
    manifest = tmp / "manifest.jsonl"
    first = run_child(
        RECORD,
        KERNELCACHE_DIR=str(tmp / "recording"),
        KERNELCACHE_RECORD=str(manifest),
        DIRECT_ROOT=str(tmp / "direct"),
    )
    image = tmp / "image"
    doc = warm_json(image, str(manifest), "--target", "hip:gfx942", code=0)
    return {"tmp": tmp, "manifest": manifest, "image": image, "first": first, "warm": doc}


def test_warm_compiles_every_recorded_specialization_for_another_target(warmed):
    doc = warmed["warm"]
    assert doc["schema"] == 1 and doc["command"] == "warm" and doc["ok"] is True
    assert doc["targets"] == ["hip:gfx942"] and doc["root"] == str(warmed["image"])
    # add, 4 autotune configs of matmul, Gluon: recorded as 6 lines, 3 calls
    assert (doc["records"], doc["calls"], doc["kernels"]) == (6, 3, 3)
    assert (doc["compiled"], doc["present"], doc["failed"]) == (6, 0, 0)
    assert doc["workers"] >= 1 and doc["failures"] == [] and doc["changed"] == []
    assert statuses(doc) == {
        ("add_kernel", "hip:gfx942"): ["compiled"],
        ("matmul_kernel", "hip:gfx942"): ["compiled"] * 4,
        ("gluon_scale_kernel", "hip:gfx942"): ["compiled"],
    }
    for r in doc["results"]:
        assert r["ext"] == "hsaco" and (warmed["image"] / f"{r['key']}.hsaco").is_file()
    # the Gluon kernel was recorded with NVIDIA's 32 threads per warp and warmed with gfx942's 64
    lines = [json.loads(line) for line in warmed["manifest"].read_text().splitlines()]
    gluon = next(r for r in lines if r["language"] == "gluon")
    assert gluon["arguments"]["WARP_SIZE"] == 32 and gluon["target_params"] == {
        "WARP_SIZE": "warp_size"
    }
    (entry,) = (r for r in doc["results"] if r["kernel"].endswith("gluon_scale_kernel"))
    meta = json.loads((warmed["image"] / f"{entry['key']}.json").read_text())
    assert meta["warp_size"] == 64 and meta["target"] == "hip:gfx942"


def test_a_job_with_the_warm_image_layer_read_only_compiles_nothing(warmed, tmp_path):
    image = warmed["image"]
    before = files_under(image)
    job_root = tmp_path / "job"
    if CAN_UNSHARE:  # a real read-only bind mount: no process can write the layer
        proc = run_in_namespace(
            f'mount --bind "{image}" "{image}"; mount -o remount,ro,bind "{image}" "{image}"\n'
            f'export KERNELCACHE_DIR="{job_root}" KERNELCACHE_READONLY_DIRS="{image}"',
            LOWER,
            timeout=240,
        )
        out = json.loads(proc.stdout.strip().splitlines()[-1])
    else:  # files and directories made unwritable, passed as a read-only root
        for path in [image, *image.rglob("*")]:
            path.chmod(path.stat().st_mode & ~0o222)
        try:
            out = run_child(
                LOWER, KERNELCACHE_DIR=str(job_root), KERNELCACHE_READONLY_DIRS=str(image)
            )
        finally:
            for path in [image, *image.rglob("*")]:
                path.chmod(path.stat().st_mode | 0o200)
    assert out["counts"] == {"make_ir": 0, "compile": 0, "triton_key": 0}
    assert out["compiles"] == 0
    assert out["stats"]["builds"] == 0 and out["stats"]["misses"] == 0
    # byte-identical to what a direct compile in a fresh cache embeds
    assert out["opaques"] == warmed["first"]["direct"]
    assert files_under(image) == before  # the layer was only read


def test_rerun_compiles_nothing(warmed):
    image = warmed["image"]
    builds = read_logs(str(image))[0]["builds"]
    assert builds == 6
    doc = warm_json(image, str(warmed["manifest"]), "--target", "hip:gfx942", code=0)
    assert (doc["compiled"], doc["present"], doc["failed"]) == (0, 6, 0)
    assert doc["workers"] == 0  # nothing to compile: no worker process started
    assert {r["layer"] for r in doc["results"]} == {"local"}
    assert read_logs(str(image))[0]["builds"] == builds  # no process built anything


def test_present_in_a_read_only_layer_counts_as_present(warmed, tmp_path):
    """A second image layer warmed on top of the first compiles only what is missing."""
    upper = tmp_path / "upper"
    doc = warm_json(
        upper,
        str(warmed["manifest"]),
        "--target",
        "hip:gfx942",
        "--target",
        "cuda:80",
        code=0,
        env={"KERNELCACHE_READONLY_DIRS": str(warmed["image"])},
    )
    assert doc["readonly_roots"] == [str(warmed["image"])]
    by_target = {}
    for r in doc["results"]:
        by_target.setdefault(r["target"], set()).add((r["status"], r["layer"]))
    assert by_target == {"hip:gfx942": {("present", "readonly")}, "cuda:80": {("compiled", None)}}
    assert not any(upper.glob("*.hsaco")) and len(list(upper.glob("*.cubin"))) == 6


# -- kernels that vanished, changed, do not compile, or crash the compiler ------------------
KERNELS_V1 = """
import os
import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl


if os.environ.get("KC_TEST_CRASH"):
    # the AMD backend dies on k_crash, inside the compiler, like a segfault in LLVM would
    from triton.backends.amd.compiler import HIPBackend

    _make_llir = HIPBackend.make_llir

    def _dying(src, *args, **kwargs):
        if src.get_entry_func_name() == "k_crash":
            os._exit(3)
        return _make_llir(src, *args, **kwargs)

    HIPBackend.make_llir = staticmethod(_dying)


@triton.jit
def k_changes(x_ptr, n, out_ptr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 2, mask=mask)


@triton.jit
def k_ok(x_ptr, n, out_ptr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) - 1, mask=mask)


@triton.jit
def k_crash(x_ptr, n, out_ptr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask), mask=mask)


@gluon.jit
def k_gluon(x_ptr, n, out_ptr, BLOCK: gl.constexpr, TPW: gl.constexpr):
    # the warp size under a name warm does not know: it is replayed as recorded (32)
    layout: gl.constexpr = gl.BlockedLayout([4], [TPW], [gl.num_warps()], [0])
    offs = gl.program_id(0) * BLOCK + gl.arange(0, BLOCK, layout=layout)
    mask = offs < n
    gl.store(out_ptr + offs, gl.load(x_ptr + offs, mask=mask), mask=mask)


@triton.jit
def k_removed(x_ptr, n, out_ptr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + 1, mask=mask)
"""

RECORD_DEMO = """
import json, sys
import jax, jax.numpy as jnp
import bridge
from bridge.compile import compiler as bridge_compile
import kcwarm_demo.kernels as K

x = jax.ShapeDtypeStruct((4096,), jnp.float32)
names = sys.argv[1].split(",")
extra = {"k_gluon": {"TPW": 32}}
keys = []
remove = bridge.on_lowered(lambda r: keys.append(r["key"]))
for name in names:
    fn = lambda x, name=name: bridge.triton_call(
        x, x.size, kernel=getattr(K, name), out_shape=x, grid=(4,), BLOCK=1024,
        target="cuda:90", num_warps=4, **extra.get(name, {}))
    jax.jit(fn).trace(x).lower(lowering_platforms=("cuda",))
print(json.dumps({"keys": keys, "compiles": bridge_compile.compile_count()}))
"""


def _demo_env(pkg_root: Path, **extra: str) -> dict[str, str]:
    return {
        "PYTHONPATH": f"{pkg_root}{os.pathsep}{REPO}",
        "PYTHONDONTWRITEBYTECODE": "1",  # the module is rewritten within the same second
        **extra,
    }


def _run_demo(pkg_root: Path, names: str, **env: str) -> Any:
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(RECORD_DEMO), names],
        env=child_env(**_demo_env(pkg_root, **env)),
        capture_output=True,
        text=True,
        timeout=240,
        cwd=str(REPO),
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_vanished_changed_failing_and_crashing_kernels(tmp_path):
    pkg = tmp_path / "src" / "kcwarm_demo"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    module = pkg / "kernels.py"
    module.write_text(KERNELS_V1)
    root, manifest = tmp_path / "cache", tmp_path / "manifest.jsonl"
    recorded = _run_demo(
        tmp_path / "src",
        "k_changes,k_removed,k_ok,k_crash,k_gluon",
        KERNELCACHE_DIR=str(root),
        KERNELCACHE_RECORD=str(manifest),
    )
    assert recorded["compiles"] == 5
    old_key = recorded["keys"][0]  # k_changes for cuda:90, compiled into the root
    assert (root / f"{old_key}.cubin").is_file()

    # the kernels change: one is edited, one removed
    source = KERNELS_V1.replace("mask=mask) * 2", "mask=mask) * 3")
    source = source[: source.index("@triton.jit\ndef k_removed")]  # the last: no line moves
    module.write_text(source)

    env = _demo_env(tmp_path / "src", KC_TEST_CRASH="1")
    args = (str(manifest), "--target", "cuda:90", "--target", "hip:gfx942", "--jobs", "2")
    doc = warm_json(root, *args, code=1, env=env)
    assert doc["ok"] is False
    failures = {(f["kind"], f["kernel"].split(":")[1], f["target"]): f for f in doc["failures"]}
    assert set(failures) == {
        ("missing-kernel", "k_removed", None),
        ("source-changed", "k_changes", None),
        ("compile", "k_gluon", "hip:gfx942"),
    }
    assert "has no attribute 'k_removed'" in failures["missing-kernel", "k_removed", None]["detail"]
    assert "record the manifest again" in failures["missing-kernel", "k_removed", None]["detail"]
    changed = failures["source-changed", "k_changes", None]
    assert "source changed" in changed["detail"] and "--allow-changed" in changed["detail"]
    assert changed["lines"] == [1]
    # the compiler's own diagnostic is the reason
    assert "32 threads per warp" in failures["compile", "k_gluon", "hip:gfx942"]["detail"]
    assert doc["failed"] == 3
    # a compiler that dies fails its kernel, not the worker: left out, saying how it died
    (crashed,) = [r for r in doc["results"] if r["status"] == "left-out"]
    assert crashed["kernel"].endswith(":k_crash") and crashed["target"] == "hip:gfx942"
    assert crashed["error"] == "the compiler exited with status 3"
    assert statuses(doc) == {
        ("k_ok", "cuda:90"): ["present"],
        ("k_ok", "hip:gfx942"): ["compiled"],
        ("k_crash", "cuda:90"): ["present"],
        ("k_crash", "hip:gfx942"): ["left-out"],
        ("k_gluon", "cuda:90"): ["present"],
        ("k_gluon", "hip:gfx942"): ["failed"],
    }
    # nothing stale is served: the changed kernel's key changed with its source, so a lowering
    # compiles it even though the root still holds the recorded kernel
    lowered = _run_demo(tmp_path / "src", "k_changes", KERNELCACHE_DIR=str(root))
    assert lowered["compiles"] == 1
    assert lowered["keys"] != [old_key] and (root / f"{old_key}.cubin").is_file()

    # --allow-changed compiles the current source for the recorded calls
    doc = warm_json(
        root, *args[:-2], "--jobs", "1", "--allow-changed", code=1, env=_demo_env(tmp_path / "src")
    )
    assert [(c["kind"], c["kernel"]) for c in doc["changed"]] == [
        ("source-changed", "kcwarm_demo.kernels:k_changes")
    ]
    assert {f["kind"] for f in doc["failures"]} == {"missing-kernel", "compile"}
    assert statuses(doc)["k_changes", "cuda:90"] == ["present"]  # the lowering above built it
    assert statuses(doc)["k_changes", "hip:gfx942"] == ["compiled"]
    assert statuses(doc)["k_crash", "hip:gfx942"] == ["left-out"]  # remembered: not compiled again
    assert doc["workers"] == 1

    # the summary for people names each failure, where it was recorded, and what to do
    human = kc(root, "warm", *args[:-2], "--jobs", "1", env=_demo_env(tmp_path / "src"))
    assert human.returncode == 1
    assert "[missing-kernel] kcwarm_demo.kernels:k_removed [line 2]:" in human.stdout
    assert "[source-changed] kcwarm_demo.kernels:k_changes [line 1]:" in human.stdout
    assert "[compile] kcwarm_demo.kernels:k_gluon for hip:gfx942 [line 5]:" in human.stdout


# -- the progress bar ----------------------------------------------------------------------------
@pytest.mark.skipif(sys.platform != "linux", reason="pseudo-terminals as on Linux")
def test_progress_bar_only_on_a_terminal(tmp_path):
    lines = (REPO / "examples" / "manifest.jsonl").read_text().splitlines()
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(next(line for line in lines if "add_kernel" in line) + "\n")
    args = ["--root", str(tmp_path / "c"), "warm", str(manifest), "--target"]
    code, shown = run_on_a_terminal([KERNELCACHE, *args, "cuda:80"])
    assert code == 0 and "warming" in shown and "compiled" in shown
    code, shown = run_on_a_terminal([KERNELCACHE, *args, "cuda:86", "--json"])
    assert code == 0 and "warming" not in shown
    assert json.loads(shown)["compiled"] == 1


# -- usage errors and output ---------------------------------------------------------------
def _main(capsys, *argv: str) -> tuple[int, str, str]:
    from kernelcache.cli import main

    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    ("manifest", "target", "message"),
    [
        ("examples/manifest.jsonl", "cuda:9", "invalid target 'cuda:9'"),
        ("examples/manifest.jsonl", "gfx942", "invalid target 'gfx942'"),
        ("missing.jsonl", "cuda:90", "cannot read the manifest missing.jsonl"),
        ("examples", "cuda:90", "is not a regular file"),
        ("pyproject.toml", "cuda:90", "is not a kernelcache manifest"),
    ],
)
def test_usage_errors_exit_2_and_touch_nothing(
    capsys, tmp_path, monkeypatch, manifest, target, message
):
    monkeypatch.chdir(REPO)
    root = tmp_path / "never"
    code, out, err = _main(
        capsys, "--root", str(root), "warm", manifest, "--target", target, "--json"
    )
    assert code == 2
    doc = json.loads(out)
    assert doc["command"] == "warm" and message in doc["error"]
    assert message in err and "Traceback" not in err
    assert not root.exists()


def test_jobs_must_be_positive(capsys, tmp_path):
    code, _, err = _main(
        capsys, "--root", str(tmp_path), "warm", "m.jsonl", "--target", "cuda:90", "-j", "0"
    )
    assert code == 2 and "--jobs must be at least 1" in err


def test_torn_and_foreign_lines_are_reported_and_the_rest_is_warmed(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    lines = (REPO / "examples" / "manifest.jsonl").read_text().splitlines()
    add = next(line for line in lines if "add_kernel" in line)
    newer = json.loads(add)
    newer["version"] = 99
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(f"{add}\n\n{json.dumps(newer)}\n{add[:40]}\n{add}\n")
    code, out, _ = _main(
        capsys,
        "--root",
        str(tmp_path / "c"),
        "warm",
        str(manifest),
        "--target",
        "cuda:80",
        "--json",
        "--jobs",
        "1",
    )
    doc = json.loads(out)
    assert code == 1 and doc["records"] == 2 and doc["calls"] == 1 and doc["compiled"] == 1
    details = {tuple(f["lines"]): f["detail"] for f in doc["failures"]}
    assert set(details) == {(3,), (4,)}
    assert "newer kernelcache" in details[(3,)] and "not a JSON record" in details[(4,)]


def test_a_call_that_does_not_fit_one_target_fails_there_only(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    lines = (REPO / "examples" / "manifest.jsonl").read_text().splitlines()
    rec = json.loads(next(line for line in lines if "add_kernel" in line))
    rec["options"] = {"num_warps": 32}  # 1024 threads of 32 on NVIDIA; 2048 of 64 on gfx942
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(json.dumps(rec) + "\n")
    argv = ["--root", str(tmp_path / "c"), "warm", str(manifest), "--json", "--jobs", "1"]
    code, out, _ = _main(capsys, *argv, "--target", "cuda:80", "--target", "hip:gfx942")
    doc = json.loads(out)
    assert code == 1 and doc["compiled"] == 1 and doc["results"][0]["target"] == "cuda:80"
    (failure,) = doc["failures"]
    assert (failure["kind"], failure["target"]) == ("invalid", "hip:gfx942")
    assert "2048 threads per block" in failure["detail"]


@pytest.mark.parametrize(
    ("cpus", "cpu_max", "expected"),
    [
        ({0}, None, 1),  # a 1-core runner: compile in-process
        ({0, 1}, "max 100000", 2),
        (set(range(8)), "200000 100000", 2),  # a container limited to 2 CPUs of 8
        (set(range(8)), "50000 100000", 1),
        (set(range(8)), "garbage", 8),
    ],
)
def test_the_pool_is_sized_to_the_cpus_this_process_may_use(
    monkeypatch, tmp_path, cpus, cpu_max, expected
):
    from bridge.warm import pool

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: cpus)
    quota = tmp_path / "cpu.max"
    if cpu_max is not None:
        quota.write_text(cpu_max + "\n")
    monkeypatch.setattr(pool, "CGROUP_CPU_MAX", quota)
    assert pool.default_workers() == expected


def test_an_empty_manifest_warms_nothing(capsys, tmp_path, caplog):
    manifest = tmp_path / "empty.jsonl"
    manifest.write_text("")
    code, out, _ = _main(
        capsys, "--root", str(tmp_path / "c"), "warm", str(manifest), "--target", "cuda:80"
    )
    assert code == 0 and "0 records" in out
    assert any("holds no records" in r.getMessage() for r in caplog.records)


@pytest.mark.skipif(not CAN_UNSHARE, reason="needs a private mount namespace for a read-only mount")
def test_an_unwritable_root_fails_once_before_compiling(tmp_path):
    root = tmp_path / "ro"
    root.mkdir()
    code = f"""
import json, sys
sys.argv = ["kernelcache", "--root", {str(root)!r}, "warm", "examples/manifest.jsonl",
            "--target", "cuda:80", "--json"]
from bridge.compile import compiler as bridge_compile
from kernelcache.cli import main
code = main()
print(json.dumps({{"code": code, "compiles": bridge_compile.compile_count()}}))
"""
    proc = run_in_namespace(
        f'mount --bind "{root}" "{root}"; mount -o remount,ro,bind "{root}" "{root}"; cd "{REPO}"',
        code,
    )
    error, end = json.JSONDecoder().raw_decode(proc.stdout)
    result = json.loads(proc.stdout[end:])
    assert result == {"code": 2, "compiles": 0}  # nothing done: the root cannot be written
    assert "cannot write under" in error["error"] and "Read-only" in error["error"]
    assert proc.stderr.count("cannot write under") == 1


@pytest.mark.skipif(not CAN_UNSHARE, reason="needs a private mount namespace for a full disk")
def test_a_full_disk_during_warm_is_a_store_problem_not_a_compile_failure(tmp_path):
    """A root on a 96 KiB filesystem takes a few kernels, then the disk is full: the kernels
    that compiled but could not be stored are problems of kind `store` saying so, and none is
    called a compile failure."""
    root = tmp_path / "small"
    root.mkdir()
    code = f"""
import json, sys
sys.argv = ["kernelcache", "--root", {str(root)!r}, "warm", "examples/manifest.jsonl",
            "--target", "cuda:80", "--json", "-j", "1"]
from kernelcache.cli import main
code = main()
print("CODE", code)
"""
    proc = run_in_namespace(
        f'mount -t tmpfs -o size=96k tmpfs "{root}"; cd "{REPO}"', code, timeout=600
    )
    doc, end = json.JSONDecoder().raw_decode(proc.stdout)
    assert proc.stdout[end:].split() == ["CODE", "1"], proc.stdout[end:]
    kinds = [p["kind"] for p in doc["failures"]]
    assert "store" in kinds and "compile" not in kinds, kinds
    detail = next(p["detail"] for p in doc["failures"] if p["kind"] == "store")
    assert "could not be stored" in detail and "no space left" in detail, detail
    said = proc.stderr.splitlines()
    assert not [line for line in said if line.count("kernelcache:") > 1], proc.stderr
    assert "cannot log statistics" not in proc.stderr, "the store problems named the root"


# -- the README's main job and the shipped manifest -------------------------------------------
def test_shipped_manifest_matches_the_example_kernels():
    """examples/manifest.jsonl is regenerated by `python -m examples.record`; it must describe
    the kernels as they are (else the main job fails with source-changed)."""
    from bridge.call.kernel_objects import decompose
    from bridge.call.plain import source_digest
    from bridge.warm import import_kernel, load_manifest

    loaded = load_manifest(REPO / "examples" / "manifest.jsonl")
    assert loaded.failures == ()
    languages = set()
    for call in loaded.calls:
        parts = decompose(import_kernel(call.kernel))
        assert source_digest(parts.fn) in call.sources, (
            f"{call.kernel} changed: regenerate the manifest with `python -m examples.record`"
        )
        languages.add(parts.language)
    assert languages == {"triton", "gluon"}
    # the autotuned matmul with all of its configs
    assert max(len(c) for call in loaded.calls for c in call.configs.values()) == 4


def test_main_job_warms_the_examples_for_nvidia_and_amd_into_the_default_root(tmp_path):
    default_root = tmp_path / "default"
    env = {"KERNELCACHE_DIR": str(default_root)}
    proc = kc(
        None,
        "warm",
        "examples/manifest.jsonl",
        "--target",
        "cuda:90",
        "--target",
        "hip:gfx942",
        env=env,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "compiled            14" in proc.stdout and "failed               0" in proc.stdout
    stats = kc(None, "stats", "--json", env=env)
    doc = json.loads(stats.stdout)
    assert doc["root"] == str(default_root)
    assert doc["by_target"]["cuda:90"]["entries"] == 14  # 7 cubins and their PTX
    assert doc["by_target"]["hip:gfx942"]["entries"] == 7
    assert doc["counters"]["builds"] == 14


def test_a_job_binds_and_keys_only_its_own_variant(tmp_path, monkeypatch):
    """Compiling a job of an autotuned call specializes that variant, not every config."""
    import kernelcache
    from bridge import parse_target
    from bridge.identity import kernel_keys
    from bridge.warm import load_manifest
    from bridge.warm.planning import kernel_parts, make_plan, specializations
    from bridge.warm.pool import execute

    cache = kernelcache.Cache(root=tmp_path / "root")
    target = parse_target("cuda:90")
    loaded = load_manifest(REPO / "examples" / "manifest.jsonl")
    plan = make_plan(loaded, [target], cache, allow_changed=False)
    tuned = [j for j in plan.jobs if j.call.kernel.endswith(":matmul_kernel")]
    assert len(tuned) > 1
    keyed = []
    real = kernel_keys.kernel_key
    monkeypatch.setattr(kernel_keys, "kernel_key", lambda *a: keyed.append(1) or real(*a))
    outcomes = execute(tuned, 1, cache, lambda n: None)
    assert [o.status for o in outcomes] == ["compiled"] * len(tuned)
    assert len(keyed) == len(tuned)
    # the variant a job names is the one planning keyed
    specs = specializations(tuned[0].call, kernel_parts(tuned[0].call), target, cache)
    assert [specs[j.index].key for j in tuned] == [j.key for j in tuned]


# -- optional record fields of the wrong type ----------------------------------------------------
BAD_FIELDS = [
    ("producer", [1]),
    ("producer", {"triton": [1]}),
    ("kwargs", 5),
    ("kwargs", ["BLOCK"]),
    ("source", [1]),
    ("target_params", ["n"]),
    ("target_params", "warp_size"),
    ("target_params", {"n": 32}),
    ("config", 5),
    ("config", ["BM: 64"]),
    ("importable", "yes"),
    ("problem", {"why": 1}),
    ("variant", 5),
    ("variant", {"kwargs": 5, "options": {}}),
    ("variant", {"kwargs": {}, "options": ["num_warps"]}),
    ("target", {"x": 1}),  # (explain and audit raised "unhashable type: 'dict'")
    ("target", 90),
]


def _example_record() -> dict[str, Any]:
    return json.loads((REPO / "examples" / "manifest.jsonl").read_text().splitlines()[0])


@pytest.mark.parametrize("field, value", BAD_FIELDS)
def test_a_field_of_the_wrong_type_is_a_bad_record_of_its_line(tmp_path, field, value):
    from bridge.warm import load_manifest

    good = _example_record()
    manifest = tmp_path / "manifest.jsonl"
    lines = [good, {**good, field: value}, {**good, "arguments": {**good["arguments"], "n": 8}}]
    manifest.write_text("".join(json.dumps(rec) + "\n" for rec in lines))
    loaded = load_manifest(manifest)
    assert loaded.records == 2 and len(loaded.calls) == 2
    (failure,) = loaded.failures
    assert failure.kind == "bad-record" and failure.lines == (2,)
    assert f"line 2: field {field!r}" in failure.detail


@pytest.mark.parametrize("field, value", BAD_FIELDS)
def test_compile_record_refuses_a_field_of_the_wrong_type(tmp_path, field, value):
    from bridge import KernelArgumentError
    from bridge.warm import compile_record

    record = {**_example_record(), field: value}
    with pytest.raises(KernelArgumentError, match=f"field {field!r}"):
        compile_record(record, "cuda:90", cache=str(tmp_path / "root"))
    assert not (tmp_path / "root").exists()


def test_a_line_longer_than_a_record_may_be_is_a_bad_record_unparsed(tmp_path):
    """Every distinct record of a manifest was kept parsed: a 64 MB manifest of 200 records
    of empty lists took 932 MB."""
    from bridge.warm import load_manifest

    good = _example_record()
    padded = {**good, "arguments": {**good["arguments"], "pad": [[]] * 40_000}}
    manifest = tmp_path / "manifest.jsonl"
    manifest.write_text(json.dumps(good) + "\n" + json.dumps(padded) + "\n")
    loaded = load_manifest(manifest)
    assert loaded.records == 1
    (failure,) = loaded.failures
    assert failure.kind == "bad-record" and "longer than 64 KiB" in failure.detail


@pytest.mark.parametrize("kernel", ["unittest.__main__:main", "examples.ops:add.__globals__"])
def test_a_kernel_path_naming_a_dunder_is_never_imported(kernel):
    """`pkg.__main__` runs a program when imported: warm ran unittest's command line on its
    own arguments, whose SystemExit ended the command."""
    from bridge import KernelArgumentError
    from bridge.warm import import_kernel

    before = set(sys.modules)
    with pytest.raises(KernelArgumentError, match="dunder"):
        import_kernel(kernel)
    assert "unittest.__main__" not in set(sys.modules) - before


def test_a_module_that_exits_while_imported_is_an_error_of_its_kernel(tmp_path, monkeypatch):
    from bridge import KernelArgumentError
    from bridge.warm import import_kernel

    (tmp_path / "exits_on_import.py").write_text("raise SystemExit(3)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(KernelArgumentError, match="raised SystemExit"):
        import_kernel("exits_on_import:kernel")


def test_compile_record_and_the_manifest_build_the_same_call(tmp_path):
    """One way from a record to a RecordedCall: what compile_record compiles is what warm plans."""
    from bridge.warm import compile_manifest, compile_record

    record = _example_record()
    manifest = tmp_path / "manifest.jsonl"
    manifest.write_text(json.dumps(record) + "\n")
    (key,) = compile_manifest(manifest, ["hip:gfx942"], cache=str(tmp_path / "a"))["hip:gfx942"]
    assert compile_record(record, "hip:gfx942", cache=str(tmp_path / "b")) == key


READS_V1 = """
import triton
import triton.language as tl

SCALE = tl.constexpr(2.0)


@triton.jit
def k_reads(x_ptr, n, out_ptr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * SCALE, mask=mask)
"""


def test_an_entry_whose_reads_find_something_else_is_not_present(tmp_path):
    """A kernel's source is the same, but a global it reads changed: the entry under its key is
    not what a lowering would use, so warm compiles the new version (under the key chained from
    the first, where a lowering looks), and the job then compiles nothing."""
    pkg = tmp_path / "src" / "kcwarm_demo"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "kernels.py").write_text(READS_V1)
    root, manifest = tmp_path / "cache", tmp_path / "manifest.jsonl"
    recorded = _run_demo(
        tmp_path / "src", "k_reads", KERNELCACHE_DIR=str(root), KERNELCACHE_RECORD=str(manifest)
    )
    assert recorded["compiles"] == 1
    (pkg / "kernels.py").write_text(READS_V1.replace("(2.0)", "(3.0)"))
    args = (str(manifest), "--target", "cuda:90")
    env = _demo_env(tmp_path / "src")
    assert statuses(warm_json(root, *args, code=0, env=env)) == {
        ("k_reads", "cuda:90"): ["compiled"]
    }
    lowered = _run_demo(tmp_path / "src", "k_reads", KERNELCACHE_DIR=str(root))
    assert lowered["compiles"] == 0 and lowered["keys"] == recorded["keys"]
    assert statuses(warm_json(root, *args, code=0, env=env)) == {
        ("k_reads", "cuda:90"): ["present"]
    }
