"""A bridge variable that cannot be used stops only the commands that read it: the operator's
commands (``ls``, ``stats``, ``verify``, ...) run, ``doctor`` fails that variable's own check
and no other, and the bridge's commands that compile or look up kernels (``warm``) refuse it
as before. Through the real command line."""

from __future__ import annotations

import subprocess
import sys

import pytest
from cli_support import kc, kc_json, put
from support import REPO, child_env

BOGUS = {"KERNELCACHE_EMBED": "bogus"}


@pytest.mark.parametrize("args", [["ls"], ["stats"], ["verify"], ["prune", "--dry-run"]])
def test_operator_commands_do_not_read_the_bridge_variables(tmp_path, args):
    root = tmp_path / "cache"
    put(root, "matmul")
    proc = kc(root, *args, env=BOGUS)
    assert proc.returncode == 0, proc.stderr
    assert "KERNELCACHE_EMBED" not in proc.stderr


def test_doctor_fails_the_variable_alone(tmp_path):
    root = tmp_path / "cache"
    put(root, "matmul")
    doc = kc_json(root, "doctor", code=1, env=BOGUS)
    checks = {c["name"]: c for c in doc["checks"]}
    embed = checks["KERNELCACHE_EMBED"]
    assert embed["status"] == "fail" and "KERNELCACHE_EMBED='bogus'" in embed["detail"]
    failed = [c for c in doc["checks"] if c["status"] == "fail"]
    assert failed == [embed], failed  # jax_triton and the rest do not read it
    assert "EMBED" not in checks["jax_triton"]["detail"]


def test_a_command_that_reads_them_still_refuses_one(tmp_path):
    manifest = tmp_path / "manifest.jsonl"
    manifest.write_text("")
    proc = kc(tmp_path / "cache", "warm", str(manifest), "--target", "cuda:90", env=BOGUS)
    assert proc.returncode == 2
    assert "KERNELCACHE_EMBED='bogus': not one of" in proc.stderr


def test_kernelcache_variables_stop_the_commands_that_use_them(tmp_path):
    root = tmp_path / "cache"
    put(root, "matmul")
    proc = kc(root, "verify", env={"KERNELCACHE_TRUST": "bogus"})
    assert proc.returncode == 2 and "KERNELCACHE_TRUST='bogus'" in proc.stderr
    listed = kc(root, "ls", env={"KERNELCACHE_TRUST": "bogus"})  # said; the strictest applies
    assert listed.returncode == 0 and "KERNELCACHE_TRUST='bogus'" in listed.stderr


# a job lowering for a GPU it does not have, its target's variable set to what is no target
UNUSABLE_TARGET_JOB = """
import jax, jax.numpy as jnp
from examples import ops

x = jnp.ones(8, jnp.float32)
jax.jit(ops.add).trace(x, x).lower(lowering_platforms=("cuda",))
"""


def test_a_job_whose_target_variable_cannot_be_used_is_told_to_fix_it_not_to_set_it(tmp_path):
    pytest.importorskip("jax", reason="a job lowers a call")
    env = child_env(KERNELCACHE_TARGET="cuda9O", KERNELCACHE_DIR=str(tmp_path / "kc"))
    argv = [sys.executable, "-c", UNUSABLE_TARGET_JOB]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]  # what a CI log shows last: the error itself
    assert last.startswith("bridge.exceptions.TargetError: no cuda device here"), proc.stderr
    assert "KERNELCACHE_TARGET='cuda9O': invalid target 'cuda9O'" in last
    assert last.endswith(": fix it, or pass target=")
    assert "set KERNELCACHE_TARGET" not in last
