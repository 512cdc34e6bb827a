"""``kernelcache audit MANIFEST`` through the real command line: it reruns Triton's frontend for
every recorded call and says whether the entry a lowering would use was compiled from today's
IR (``exact``) or from other IR (``hole``: a change neither the key nor the read set saw; the
audit fails). It writes nothing."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from cli_support import kc_code
from support import child_env

KERNELS = """
import triton
import triton.language as tl
import auditcfg as cfg
import auditops as ops


@triton.jit
def exact_kernel(x_ptr, n, out_ptr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * cfg.SCALE, mask=mask)


@triton.jit
def by_name(x_ptr, n, out_ptr, ACT: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, getattr(ops, ACT)(tl.load(x_ptr + offs, mask=mask)), mask=mask)
"""
OPS = """
import triton


@triton.jit
def double(x):
    return x * 2.0
"""
RECORD = """
import jax, jax.numpy as jnp
import bridge
import auditkernels as K

x = jax.ShapeDtypeStruct((4096,), jnp.float32)
for kernel, kw in ((K.exact_kernel, {}), (K.by_name, {"ACT": "double"})):
    fn = lambda x, kernel=kernel, kw=kw: bridge.triton_call(
        x, x.size, kernel=kernel, out_shape=x, grid=(4,), BLOCK=1024, target="cuda:90", **kw)
    jax.jit(fn).trace(x).lower(lowering_platforms=("cuda",))
"""
#: the kernelcache command with a witness blind to what the frontend read: an analysis with a
#: hole, as a change it cannot see would make one
BLIND = """
import sys
from bridge.readsets import read_sets
read_sets.stale = lambda *a, **k: read_sets.Verdict(read_sets.FRESH)
from kernelcache.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> dict[str, Any]:
    src = tmp_path_factory.mktemp("audit")
    (src / "auditcfg.py").write_text("import triton.language as tl\nSCALE = tl.constexpr(2.0)\n")
    (src / "auditops.py").write_text(OPS)
    (src / "auditkernels.py").write_text(KERNELS)
    manifest, root = src / "manifest.jsonl", src / "root"
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(RECORD)],
        env=child_env(
            KERNELCACHE_DIR=str(root),
            KERNELCACHE_RECORD=str(manifest),
            PYTHONPATH=str(src),
            PYTHONDONTWRITEBYTECODE="1",
        ),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    return {"src": src, "manifest": manifest, "root": root}


def audit(root: Path, project: dict[str, Any], *more: str, code: int, prelude=None) -> Any:
    proc = kc_code(
        "--root",
        str(root),
        "audit",
        str(project["manifest"]),
        "--json",
        *more,
        code=code,
        prelude=prelude,
        PYTHONPATH=str(project["src"]),
        PYTHONDONTWRITEBYTECODE="1",
    )
    return json.loads(proc.stdout)


def _listing(root: Path) -> list[tuple[str, int, int]]:
    return sorted((str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*"))


def test_entries_built_from_todays_ir_are_exact_and_nothing_is_written(project):
    before = _listing(project["root"])
    doc = audit(project["root"], project, "--strict", code=0)
    assert _listing(project["root"]) == before  # (no memo, no stamp, no statistics)
    assert (doc["command"], doc["exact"], doc["hole"]) == ("audit", 2, 0)
    by_kernel = {r["kernel"].rpartition(":")[2]: r for r in doc["results"]}
    for name in ("exact_kernel", "by_name"):
        assert by_kernel[name]["status"] == "exact"
        assert by_kernel[name]["ir"] == by_kernel[name]["entry_ir"]
    # explain finds both entries
    explained = kc_code(
        "--root",
        str(project["root"]),
        "explain",
        str(project["manifest"]),
        "--json",
        code=0,
        PYTHONPATH=str(project["src"]),
        PYTHONDONTWRITEBYTECODE="1",
    )
    statuses = {
        r["kernel"].rpartition(":")[2]: r["status"] for r in json.loads(explained.stdout)["results"]
    }
    assert statuses == {"exact_kernel": "hit", "by_name": "hit"}


def test_a_change_the_key_does_not_see_is_a_hole(project, tmp_path):
    """An analysis blind to what the frontend read (the witness of its reads) uses the entry
    under the key of an edited helper module as before: it was compiled from other IR, and the
    audit says so, and fails. The witness sees the change: the entry a lowering would use is
    another, not yet compiled."""
    root = tmp_path / "blind"
    kc_code(
        "--root",
        str(root),
        "warm",
        str(project["manifest"]),
        "--target",
        "cuda:90",
        code=0,
        prelude=BLIND,
        PYTHONPATH=str(project["src"]),
        PYTHONDONTWRITEBYTECODE="1",
    )
    cfg = project["src"] / "auditcfg.py"
    text = cfg.read_text()
    cfg.write_text(text.replace("2.0", "3.0"))
    try:
        doc = audit(root, project, code=1, prelude=BLIND)
        honest = audit(root, project, code=0)
    finally:
        cfg.write_text(text)
    (hole,) = [r for r in doc["results"] if r["status"] == "hole"]
    assert hole["kernel"].endswith(":exact_kernel") and hole["ir"] != hole["entry_ir"]
    # the read set sees the change: nothing is cached for it yet, nothing is wrong
    statuses = {r["kernel"].rpartition(":")[2]: r["status"] for r in honest["results"]}
    assert statuses == {"exact_kernel": "uncached", "by_name": "exact"}


#: the kernelcache command where what ptxas is told of the source files differs from what a
#: compile tells it: a change after the frontend the key does not see, as a tool that changed its
#: output without changing its version would make
RESTAMPED = """
import sys
from bridge.compile import compiler
compiler.FILE_STAMPS = ", 2, 0"
from kernelcache.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_compile_compares_each_entrys_machine_code_with_a_compile_today(project):
    before = _listing(project["root"])
    doc = audit(project["root"], project, "--compile", code=0)
    assert _listing(project["root"]) == before  # compiled in memory: nothing written
    statuses = {r["kernel"].rpartition(":")[2]: r["status"] for r in doc["results"]}
    assert statuses == {"exact_kernel": "exact", "by_name": "exact"}
    # the same IR, other machine code: both entries differ, and the audit fails
    changed = audit(project["root"], project, "--compile", code=1, prelude=RESTAMPED)
    differs = {r["kernel"].rpartition(":")[2]: r for r in changed["results"]}
    assert {name: r["status"] for name, r in differs.items()} == {
        "exact_kernel": "differs",
        "by_name": "differs",
    }
    assert "first different at byte" in differs["exact_kernel"]["reason"]
    assert differs["exact_kernel"]["ir"] == differs["exact_kernel"]["entry_ir"]
    # the IR alone cannot see it
    assert audit(project["root"], project, code=0, prelude=RESTAMPED)["differs"] == 0
