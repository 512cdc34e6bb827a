"""Code that imports ``jax_triton`` reaches the bridge with no edit: ``kernelcache run --
COMMAND`` (the command and every process it starts) and ``bridge.install_jax_triton()``; which
jax-triton's API it offers; what happens beside a real jax-triton; what ``doctor`` says."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from cli_support import KERNELCACHE
from support import HELPERS, child_env

#: a user's program written for jax-triton 0.3, which starts a child process that imports it too
PROGRAM = """
import hashlib, json, os, subprocess, sys
import jax, jax.numpy as jnp
import jax_triton as jt
import triton, triton.language as tl
from bridge.compile import compiler


@triton.jit
def add_kernel(x_ptr, y_ptr, n, out_ptr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)


def add(x, y):
    return jt.triton_call(x, y, x.size, kernel=add_kernel, out_shape=x,
                          grid=(jt.cdiv(x.size, 1024),), BLOCK=1024)


x = jax.ShapeDtypeStruct((4096,), jnp.float32)
text = jax.jit(add).trace(x, x).lower(lowering_platforms=("cuda",)).as_text()
child = subprocess.run([sys.executable, "-c", "import jax_triton; print(getattr(jax_triton, '__bridge__', False))"],
                       capture_output=True, text=True, check=True).stdout.strip()
print(json.dumps({"module": hashlib.sha256(text.encode()).hexdigest(),
                  "compiles": compiler.compile_count(), "bridge": getattr(jt, "__bridge__", False),
                  "version": jt.__version__, "child": child,
                  "strides": list(jt.strides_from_shape((2, 3)))}))
"""
#: a stand-in for the real jax-triton, installed with its distribution's metadata
FAKE = "REAL = True\n__version__ = '{version}'\n"


def run(*args: str, cwd: Path, code: int = 0, **env: str) -> subprocess.CompletedProcess[str]:
    assert KERNELCACHE is not None, "install the project first (pip install -e .)"
    proc = subprocess.run(
        [KERNELCACHE, *args],
        env=child_env(**env),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=str(cwd),
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == code, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


def on_path(folder: Path) -> str:
    """``PYTHONPATH`` with ``folder`` first (what this process's children have kept after it)."""
    return os.pathsep.join(filter(None, [str(folder), os.environ.get("PYTHONPATH")]))


def fake_jax_triton(where: Path, version: str) -> Path:
    """A folder holding a package ``jax_triton`` and its metadata, as pip installs one."""
    (where / "jax_triton").mkdir(parents=True)
    (where / "jax_triton" / "__init__.py").write_text(FAKE.format(version=version))
    info = where / f"jax_triton-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: jax-triton\nVersion: {version}\n")
    return where


@pytest.fixture
def program(tmp_path) -> Path:
    (tmp_path / "train.py").write_text(textwrap.dedent(PROGRAM))
    return tmp_path


def test_a_jax_triton_program_runs_unchanged_through_the_cache(program, tmp_path):
    """Under ``kernelcache run`` the program's ``import jax_triton`` (and its child process's)
    is the bridge: the kernel is compiled once into the root, and a second run compiles
    nothing and lowers the same module."""
    root = str(tmp_path / "root")
    env = {"KERNELCACHE_TARGET": "cuda:90", "JAX_PLATFORMS": "cpu"}
    first = json.loads(
        run("--root", root, "run", "--", sys.executable, "train.py", cwd=program, **env).stdout
    )
    second = json.loads(
        run("--root", root, "run", "--", sys.executable, "train.py", cwd=program, **env).stdout
    )
    assert first["bridge"] is True and first["child"] == "True"
    assert (first["compiles"], second["compiles"]) == (1, 0)
    assert first["module"] == second["module"]
    assert first["strides"] == [3, 1] and first["version"] == "0.4.1"
    assert list(Path(root).glob("*.cubin"))


def test_beside_a_real_jax_triton_the_bridge_takes_its_place_and_its_api(program, tmp_path):
    site = fake_jax_triton(tmp_path / "site", "0.3.1")
    env = {"PYTHONPATH": on_path(site), "KERNELCACHE_TARGET": "cuda:90", "JAX_PLATFORMS": "cpu"}
    under = run(
        "run",
        "--",
        sys.executable,
        "train.py",
        cwd=program,
        **env,
        KERNELCACHE_DIR=str(tmp_path / "r"),
    )
    found = json.loads(under.stdout)
    assert found["bridge"] is True and found["version"] == "0.3.1"  # (the installed one's API)
    plain = subprocess.run(
        [sys.executable, "-c", "import jax_triton; print(jax_triton.REAL, jax_triton.__version__)"],
        env=child_env(PYTHONPATH=on_path(site)),
        capture_output=True,
        text=True,
        check=True,
    )
    assert plain.stdout.split() == ["True", "0.3.1"]  # (not changed: only hidden)
    # doctor says which one a process gets
    doc = json.loads(run("doctor", "--json", cwd=program, PYTHONPATH=on_path(site)).stdout)
    (check,) = [c for c in doc["checks"] if c["name"] == "jax_triton"]
    assert check["status"] == "warn" and "real jax-triton 0.3.1" in check["detail"]
    doc = json.loads(
        run(
            "run", "--", KERNELCACHE, "doctor", "--json", cwd=program, PYTHONPATH=on_path(site)
        ).stdout
    )
    (check,) = [c for c in doc["checks"] if c["name"] == "jax_triton"]
    assert check["status"] == "ok" and "gives the bridge" in check["detail"]


def test_install_jax_triton_in_the_program_or_a_clear_error(tmp_path):
    code = """
    import bridge
    bridge.install_jax_triton()
    import jax_triton
    print(jax_triton.__bridge__, jax_triton.__version__)
    """
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=child_env(KERNELCACHE_JAX_TRITON="0.3"),
        capture_output=True,
        text=True,
        check=True,
    )
    assert proc.stdout.split() == ["True", "0.3.1"]
    site = fake_jax_triton(tmp_path / "site", "0.4.1")
    late = """
    import jax_triton, bridge
    try:
        bridge.install_jax_triton()
    except ImportError as e:
        print(type(e).__name__, e)
    """
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(late)],
        env=child_env(PYTHONPATH=on_path(site)),
        capture_output=True,
        text=True,
        check=True,
    )
    assert proc.stdout.startswith("MasqueradeError") and "before anything imports" in proc.stdout


def test_the_04_api_reads_out_shape_as_out_type(tmp_path):
    code = """
    import warnings
    import jax, jax.numpy as jnp
    import bridge
    bridge.install_jax_triton()
    import jax_triton as jt
    from te_primitives import scale_kernel
    x = jax.ShapeDtypeStruct((4096,), jnp.float32)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        jax.jit(lambda x: jt.triton_call(x, kernel=scale_kernel, out_shape=x, grid=(4,), n=4096,
                                         S=2.0, BLOCK=1024)).trace(x).lower(lowering_platforms=("cuda",))
    print(any("out_type" in str(w.message) for w in said))
    """
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=child_env(
            KERNELCACHE_JAX_TRITON="0.4",
            KERNELCACHE_TARGET="cuda:90",
            KERNELCACHE_DIR=str(tmp_path / "root"),
            JAX_PLATFORMS="cpu",
            PYTHONPATH=on_path(HELPERS),
        ),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split()[-1] == "True"


def test_usage_errors_are_named(tmp_path):
    assert "name the command" in run("run", cwd=tmp_path, code=2).stderr
    assert (  # as a shell says it, with a shell's exit code
        "no-such-command: command not found"
        in run("run", "--", "no-such-command", cwd=tmp_path, code=127).stderr
    )
    bad = run("run", "--", "true", cwd=tmp_path, code=2, KERNELCACHE_JAX_TRITON="0.9")
    assert "KERNELCACHE_JAX_TRITON" in bad.stderr and "0.3, 0.4" in bad.stderr
