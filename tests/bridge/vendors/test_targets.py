"""Targets, versions, and the lazy, actionable loading of Triton's vendor backends."""

from __future__ import annotations

import subprocess
import sys

import pytest
from support import REPO, child_env

import bridge
from bridge import versions
from bridge.embed import modes
from bridge.identity import compiler_identity
from bridge.vendors import backends
from bridge.vendors.cuda import CUDA
from bridge.vendors.hip import HIP
from bridge.vendors.targets import Target, parse_target, select_target


@pytest.mark.parametrize(
    "text, expected",
    [
        ("cuda:90", Target("cuda", 90, 32)),
        ("sm_90a", Target("cuda", 90, 32)),
        ("CUDA:100", Target("cuda", 100, 32)),
        ("hip:gfx942", Target("hip", "gfx942", 64)),
        ("rocm:gfx90a:sramecc+:xnack-", Target("hip", "gfx90a", 64)),
        ("hip:gfx1100", Target("hip", "gfx1100", 32)),
        ("hip:gfx950", Target("hip", "gfx950", 64)),
    ],
)
def test_parse_target(text, expected):
    assert parse_target(text) == expected
    assert parse_target(str(expected)) == expected


@pytest.mark.parametrize("text", ["", "cuda", "cuda:9x", "gfx942", "hip:942", "metal:1", "cuda:30"])
def test_bad_targets_say_what_is_valid(text):
    with pytest.raises(bridge.TargetError, match=r"cuda:90|older than"):
        parse_target(text)


def test_warp_sizes_follow_triton():
    from triton.backends.amd.compiler import HIPOptions

    for arch in ("gfx90a", "gfx942", "gfx950", "gfx1100", "gfx1201"):
        assert HIP.warp_size(arch) == HIPOptions(arch=arch).warp_size


def test_binary_compatibility():
    assert parse_target("cuda:80").runs_on(parse_target("cuda:86"))
    assert not parse_target("cuda:86").runs_on(parse_target("cuda:80"))
    assert not parse_target("cuda:90").runs_on(parse_target("cuda:100"))
    assert parse_target("hip:gfx942").runs_on(parse_target("hip:gfx942"))
    assert not parse_target("hip:gfx942").runs_on(parse_target("hip:gfx90a"))


def test_versions_compare_release_tuples():
    assert versions.release("0.11.2+rocm7.0.0") == (0, 11, 2)
    assert versions.honours_module_image("0.11.1")
    assert versions.honours_module_image("0.12.0.1")
    assert not versions.honours_module_image("0.11.0+git20260101")
    assert not versions.honours_module_image("0.11.0.dev20260301")
    assert versions.has_ffi_call("0.10.1") and not versions.has_ffi_call("0.10.0")
    assert versions.at_least("0.9.1.post6", (0, 9, 1))
    assert not versions.at_least("0.9.0.1", (0, 9, 1))
    with pytest.raises(ValueError, match="not a version"):
        versions.release("latest")


@pytest.mark.parametrize(
    "text",
    ["0.11.2", "3.6.0", "01.2", "7", "0.11.1rc1", "1.0.post2", "v1.2", "1!2.0", "0.11.2+rocm7"],
)
def test_a_release_tuple_is_packagings(text):
    # plain dotted numbers are read without packaging; the same tuple as packaging reads
    from packaging.version import Version

    assert versions.release(text) == Version(text).release


@pytest.mark.parametrize("text", ["", "1..2", "1.", "\u0661.\u0662", "-1.2"])
def test_a_string_of_digits_and_dots_that_is_no_version_is_refused(text):
    with pytest.raises(ValueError, match="not a version"):
        versions.release(text)


@pytest.mark.parametrize(
    "jaxlib, target, mode",
    [
        ("0.11.2", "cuda:90", "inline"),
        ("0.11.1", "hip:gfx942", "inline"),
        ("0.10.2", "cuda:90", "ptx"),
        ("0.11.0", "hip:gfx942", "path"),
        ("0.9.0", "hip:gfx90a", "path"),
    ],
)
def test_auto_embed_policy(jaxlib, target, mode):
    assert modes.choose_mode("auto", parse_target(target), jaxlib) == mode


def test_option_names_come_from_triton():
    assert {"maxnreg", "enable_fp_fusion", "num_warps"} <= backends.option_names(CUDA)
    assert {"waves_per_eu", "kpack", "matrix_instr_nonkdim"} <= backends.option_names(HIP)
    with pytest.raises(bridge.OptionError, match=r"valid options are .*maxnreg"):
        backends.check_options(parse_target("cuda:90"), {"maxnregs"})
    with pytest.raises(bridge.OptionError, match="arch"):
        backends.check_options(parse_target("cuda:90"), {"arch"})


def test_a_missing_backend_says_which(monkeypatch):
    import triton.backends

    monkeypatch.delitem(triton.backends.backends, "amd")
    backends.compiler_module.cache_clear()
    try:
        with pytest.raises(
            bridge.BackendUnavailable, match=r"no 'amd' backend.*it has: nvidia.*ROCm"
        ):
            backends.compiler_module(HIP)
        assert backends.compiler_module(CUDA).__name__ == "triton.backends.nvidia.compiler"
    finally:
        backends.compiler_module.cache_clear()


def test_triton_identity_is_memoized_in_the_cache(tmp_path, monkeypatch):
    import triton.runtime.cache as rc

    import kernelcache

    calls = []
    real = compiler_identity.triton_digest

    def counting():
        calls.append(1)
        return real()

    def never():
        raise AssertionError("triton_key() computed")

    monkeypatch.setattr(compiler_identity, "triton_digest", counting)
    monkeypatch.setattr(rc, "triton_key", never)
    compiler_identity._memo.clear()
    cache = kernelcache.Cache(root=tmp_path)
    first = compiler_identity.triton_identity(cache)
    compiler_identity._memo.clear()
    second = compiler_identity.triton_identity(cache)
    assert first == second and len(calls) == 1
    assert len(first) == 32


def test_triton_digest_covers_the_contents_of_what_triton_key_reads(tmp_path, monkeypatch):
    """The identity changes with the bytes of any file triton_key() reads, even where size
    and mtime stay the same (a rebuilt libtriton, an edited backend)."""
    import pkgutil

    import triton

    base, rows = compiler_identity._triton_rows()
    files = {f"{base}/{row[0]}" for row in rows}
    walked = set()
    for sub in ("compiler", "backends", "language"):
        for lib in pkgutil.walk_packages([f"{base}/{sub}"], prefix=f"triton.{sub}."):
            walked.add(lib.module_finder.find_spec(lib.name).origin)
    assert walked <= set(files)  # every source file triton_key() hashes
    assert any(f.endswith((".so", ".pyd")) and "libtriton" in f for f in files)
    before = compiler_identity.triton_digest()
    target = f"{base}/language/core.py"
    real_open = open

    def altered(path, *args, **kwargs):
        if path == target:
            copy = tmp_path / "core.py"
            data = bytearray(real_open(path, "rb").read())
            data[-1] ^= 1  # same size, one byte different
            copy.write_bytes(bytes(data))
            return real_open(copy, *args, **kwargs)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr("builtins.open", altered)
    assert compiler_identity.triton_digest() != before
    monkeypatch.setattr("builtins.open", real_open)
    assert compiler_identity.triton_digest() == before
    assert triton.__version__


def test_fingerprint_changes_with_the_installation(monkeypatch):
    import os

    import triton

    compiler_identity.triton_fingerprint.cache_clear()
    before = compiler_identity.triton_fingerprint()
    path = os.path.join(os.path.dirname(triton.__file__), "language", "core.py")
    real_stat = os.stat

    def touched(p, *a, **k):
        result = real_stat(p, *a, **k)
        if os.path.abspath(p) == path:  # as if the file had been rewritten
            return os.stat_result(tuple(result[:10]), {"st_mtime_ns": result.st_mtime_ns + 1})
        return result

    monkeypatch.setattr(os, "stat", touched)
    compiler_identity.triton_fingerprint.cache_clear()
    assert compiler_identity.triton_fingerprint() != before
    monkeypatch.setattr(os, "stat", real_stat)
    compiler_identity.triton_fingerprint.cache_clear()
    assert compiler_identity.triton_fingerprint() == before


def test_a_missing_target_names_a_misspelt_variable(monkeypatch):
    monkeypatch.setenv("KERNELCACHE_TARGT", "hip:gfx942")
    with pytest.raises(bridge.TargetError) as raised:
        select_target(None, "rocm")  # (no ROCm device here, nor on an NVIDIA machine)
    said = str(raised.value)
    assert (
        "KERNELCACHE_TARGT is not a variable kernelcache reads; did you mean KERNELCACHE_TARGET?"
        in said
    )
    monkeypatch.delenv("KERNELCACHE_TARGT")
    with pytest.raises(bridge.TargetError) as raised:
        select_target(None, "rocm")
    assert "did you mean" not in str(raised.value)  # nothing misspelt: nothing said of it


# a job lowering for a GPU it does not have, with the target's variable misspelt
MISSPELT_JOB = """
import jax, jax.numpy as jnp
from examples import ops

x = jnp.ones(8, jnp.float32)
jax.jit(ops.add).trace(x, x).lower(lowering_platforms=("rocm",))
"""


def test_a_job_whose_target_variable_is_misspelt_is_told_so(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-c", MISSPELT_JOB],
        env=child_env(KERNELCACHE_TARGT="hip:gfx942", KERNELCACHE_DIR=str(tmp_path / "kc")),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=str(REPO),
    )
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]  # what a CI log shows last: the error itself
    assert last.startswith("bridge.exceptions.TargetError: no rocm device here"), proc.stderr
    assert "KERNELCACHE_TARGT is not a variable kernelcache reads" in last
    assert "did you mean KERNELCACHE_TARGET?" in last


@pytest.mark.parametrize("name", ["name", "min_compute_capability", "not_a_field"])
def test_a_vendor_refuses_every_assignment(name):
    from dataclasses import FrozenInstanceError

    from bridge.vendors.cuda import CUDA
    from bridge.vendors.hip import HIP

    for vendor in (CUDA, HIP):
        with pytest.raises(FrozenInstanceError):
            setattr(vendor, name, 30)
        with pytest.raises(FrozenInstanceError):
            delattr(vendor, "name")
    assert CUDA.min_compute_capability == 50 and not hasattr(HIP, "not_a_field")
