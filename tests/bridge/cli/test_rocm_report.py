"""``kernelcache doctor``'s report of a ROCm job (:mod:`bridge.cli.rocm_report`): the embedding
its kernels get on the installed jaxlib and whether JAX's persistent cache can hit, checked
against what a lowering for hip:gfx942 in a process started the same way hands jaxlib (the
canonical hand-off path, the same in two processes; or, where a process cannot hold the
descriptor, each process's own directory); and what it says under other jaxlibs and settings.
"""

from __future__ import annotations

import json
import re
import resource
import subprocess
import sys
import textwrap

import pytest
from cli_support import KERNELCACHE, kc_json
from support import HELPERS, REPO, child_env

from bridge import versions
from bridge.cli import rocm_report
from bridge.embed.handoff import HANDOFF_FD

#: a process lowering ``ops.add`` for hip:gfx942 (embedding as its environment says): the
#: paths its kernels are handed over by, none when inline
LOWER = f"""
import json, sys
sys.path.insert(0, {str(HELPERS)!r})
import jax, jax.numpy as jnp
from bridge.lowering import proto
from bridge_helpers import custom_calls, kernels_of, lowered_module
from examples import ops

x = jax.ShapeDtypeStruct((4096,), jnp.float32)
fn = lambda x, y: ops.add(x, y, target="hip:gfx942")
(call,) = custom_calls(lowered_module(fn, x, x, platform="rocm"))
kernels = kernels_of(proto.decode_opaque(call["opaque"]))
print(json.dumps(sorted({{k.ptx for k in kernels if not k.HasField("module_image")}})))
"""
_, HARD = resource.getrlimit(resource.RLIMIT_NOFILE)
#: whether this machine lets a process hold the hand-off descriptor
CAN_HOLD = HARD == resource.RLIM_INFINITY or HARD > HANDOFF_FD
INLINE_HERE = versions.honours_module_image(versions.jaxlib_version())
#: a limit on open files too low for the hand-off descriptor (ample for a job otherwise)
LOW = 512


def _started(argv: list[str], limit: int | None, **env: str) -> subprocess.CompletedProcess:
    """Run ``argv`` as a fresh process (its open-file limits ``limit``, when given)."""

    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))

    proc = subprocess.run(
        argv,
        env=child_env(**env),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=limited if limit else None,
    )
    assert proc.returncode in (0, 1), proc.stderr
    return proc


def _doctor(root, limit: int | None = None) -> dict:
    assert KERNELCACHE is not None
    argv = [KERNELCACHE, "--root", str(root), "doctor", "--json"]
    doc = json.loads(_started(argv, limit).stdout)
    (check,) = [c for c in doc["checks"] if c["name"] == "rocm embedding"]
    return {**doc["rocm"], "check": check}


def _handed_over(root, limit: int | None = None) -> list[str]:
    proc = _started([sys.executable, "-c", textwrap.dedent(LOWER)], limit, KERNELCACHE_DIR=root)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(INLINE_HERE, reason="this jaxlib loads HSACO inline: nothing is handed over")
@pytest.mark.skipif(not CAN_HOLD, reason=f"this machine's open-file hard limit is {HARD}")
def test_the_handoff_path_doctor_names_is_the_one_every_process_lowers(tmp_path):
    found = _doctor(tmp_path / "root")
    assert found["embed"] == "path" and found["asked"] == "auto"
    assert found["jax_cache_can_hit"] is True and found["check"]["status"] == "ok"
    assert found["handoff_path"] == f"/proc/self/fd/{HANDOFF_FD}/<sha256>.hsaco"
    assert "can hit" in found["check"]["detail"] and versions.jaxlib_version() in found["jaxlib"]
    pattern = re.escape(found["handoff_path"]).replace(re.escape("<sha256>"), "[0-9a-f]{64}")
    one = _handed_over(str(tmp_path / "one"))
    assert one and all(re.fullmatch(pattern, path) for path in one), one
    assert _handed_over(str(tmp_path / "two")) == one  # (another process, another root)


@pytest.mark.skipif(INLINE_HERE, reason="this jaxlib loads HSACO inline: nothing is handed over")
def test_without_the_descriptor_doctor_says_the_jax_cache_cannot_hit(tmp_path):
    """Under an open-file limit below the hand-off descriptor, doctor warns that JAX's cache
    cannot hit, and so it is: each process hands over a path of its own directory."""
    found = _doctor(tmp_path / "root", limit=LOW)
    assert found["embed"] == "path" and found["handoff_path"] is None
    assert found["jax_cache_can_hit"] is False and found["check"]["status"] == "warn"
    assert f"descriptor {HANDOFF_FD}" in found["check"]["detail"]
    one = _handed_over(str(tmp_path / "one"), limit=LOW)
    two = _handed_over(str(tmp_path / "one"), limit=LOW)
    assert one and not any(p.startswith("/proc/self/fd/") for p in one + two)
    assert one != two, "two processes handed over the same path: the cache could hit"


def test_doctor_reports_the_rocm_job_in_json(tmp_path):
    """(The report is one of the command's, with its own key and check.)"""
    doc = kc_json(tmp_path / "root", "doctor")
    (check,) = [c for c in doc["checks"] if c["name"] == "rocm embedding"]
    assert doc["rocm"]["jaxlib"] == versions.jaxlib_version()
    assert doc["rocm"]["embed"] == ("inline" if INLINE_HERE else "path")
    assert check["status"] in ("ok", "warn") and doc["rocm"]["target"] == "hip:gfx942"


@pytest.fixture
def env(monkeypatch):
    """The job's variables the report reads, unset (set them with ``monkeypatch``)."""
    for name in ("KERNELCACHE_EMBED", "KERNELCACHE_TARGET"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_a_jaxlib_that_honours_module_image_gets_inline_hsaco(env):
    info, (check,) = rocm_report.report("0.11.2", canonical=False)
    assert (info["embed"], info["handoff_path"], info["jax_cache_can_hit"]) == (
        "inline",
        None,
        True,
    )
    assert check.status == "ok" and "module_image" in check.detail
    info, _ = rocm_report.report("0.11.1+rocm7", canonical=False)  # (a ROCm build's version)
    assert info["embed"] == "inline"


@pytest.mark.parametrize("jaxlib", ["0.10.2", "0.11.0", "0.9.1"])
def test_an_older_jaxlib_gets_the_handoff_path(env, jaxlib):
    info, (check,) = rocm_report.report(jaxlib, canonical=True)
    assert info["embed"] == "path" and info["jax_cache_can_hit"] is True
    assert check.status == "ok" and "0.11.1" in check.detail
    info, (check,) = rocm_report.report(jaxlib, canonical=False)
    assert info["jax_cache_can_hit"] is False and check.status == "warn"


def test_the_embedding_asked_for_is_the_one_reported(env):
    env.setenv("KERNELCACHE_EMBED", "path")
    info, (check,) = rocm_report.report("0.11.2", canonical=True)
    assert (info["asked"], info["embed"]) == (
        "path",
        "path",
    ) and "KERNELCACHE_EMBED" in check.detail
    env.setenv("KERNELCACHE_EMBED", "inline")
    info, (check,) = rocm_report.report("0.10.2", canonical=True)
    assert info["embed"] == "inline" and check.status == "warn" and "0.11.1" in check.detail
    env.setenv("KERNELCACHE_EMBED", "ptx")  # (CUDA's: a ROCm job cannot lower with it)
    info, (check,) = rocm_report.report("0.10.2", canonical=True)
    assert info["embed"] is None and check.status == "warn" and "ptx" in check.detail


def test_the_target_is_the_jobs_where_it_names_a_rocm_one(env):
    env.setenv("KERNELCACHE_TARGET", "hip:gfx950")
    assert rocm_report.report("0.10.2", canonical=True)[0]["target"] == "hip:gfx950"
    env.setenv("KERNELCACHE_TARGET", "cuda:90")
    assert rocm_report.report("0.10.2", canonical=True)[0]["target"] == "hip:gfx942"
    env.setenv("KERNELCACHE_TARGET", "nonsense")
    assert rocm_report.report("0.10.2", canonical=True)[0]["target"] == "hip:gfx942"
