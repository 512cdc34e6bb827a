"""``kernelcache audit MANIFEST`` through the real command line: it reruns Triton's frontend for
every recorded call and says whether the entry under each key was compiled from today's IR
(``exact``), from other IR (``hole``: a change the key did not see; the audit fails), or whether
the kernel is open (keyed by its IR) and why. It writes nothing."""

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
def open_kernel(x_ptr, n, out_ptr, ACT: tl.constexpr, BLOCK: tl.constexpr):
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
for kernel, kw in ((K.exact_kernel, {}), (K.open_kernel, {"ACT": "double"})):
    fn = lambda x, kernel=kernel, kw=kw: bridge.triton_call(
        x, x.size, kernel=kernel, out_shape=x, grid=(4,), BLOCK=1024, target="cuda:90", **kw)
    jax.jit(fn).trace(x).lower(lowering_platforms=("cuda",))
"""
#: the kernelcache command where the kernel's code is not part of its key: an analysis with a
#: hole, as a change it cannot see would make one
#: the kernelcache command with a key blind to the kernel's code
KEY_BLIND = """
import sys
from bridge.identity import kernel_keys
kernel_keys.code_digest = lambda fn: "blind"
from kernelcache.cli import main
sys.exit(main(sys.argv[1:]))
"""
#: ... and a witness blind to what the frontend read
BLIND = KEY_BLIND.replace(
    "from kernelcache.cli",
    "from bridge.identity import read_sets\nread_sets.stale = lambda *a, **k: None\nfrom kernelcache.cli",
)


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


def test_exact_and_open_kernels_are_told_apart_and_nothing_is_written(project):
    before = _listing(project["root"])
    doc = audit(project["root"], project, code=0)
    assert _listing(project["root"]) == before  # (no memo, no stamp, no statistics)
    assert (doc["command"], doc["exact"], doc["open"], doc["hole"]) == ("audit", 1, 1, 0)
    by_kernel = {r["kernel"].rpartition(":")[2]: r for r in doc["results"]}
    assert by_kernel["exact_kernel"]["status"] == "exact"
    assert by_kernel["exact_kernel"]["ir"] == by_kernel["exact_kernel"]["entry_ir"]
    opened = by_kernel["open_kernel"]
    assert opened["status"] == "open" and "getattr(ops, ACT)" in opened["reason"]
    # --strict fails on an open kernel too
    assert audit(project["root"], project, "--strict", code=1)["open"] == 1
    # explain says it too, and finds the open kernel's entry (keyed by its IR)
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
    notes = {
        r["kernel"].rpartition(":")[2]: (r["status"], r["notes"])
        for r in json.loads(explained.stdout)["results"]
    }
    status, said = notes["open_kernel"]
    assert status == "hit" and any("open, keyed by the IR" in n for n in said)
    assert notes["exact_kernel"] == ("hit", [])


def test_a_change_the_key_does_not_see_is_a_hole(project, tmp_path):
    """An analysis blind to the kernel's code (its key and the witness of its reads) keys the
    edited kernel as before: the entry under that key was compiled from other IR, and the
    audit says so, and fails. With the key alone blind, the witness sees the change: the entry
    a lowering would use is another, not yet compiled."""
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
        witnessed = audit(root, project, code=0, prelude=KEY_BLIND)
        honest = audit(root, project, code=0)
    finally:
        cfg.write_text(text)
    (hole,) = [r for r in doc["results"] if r["status"] == "hole"]
    assert hole["kernel"].endswith(":exact_kernel") and hole["ir"] != hole["entry_ir"]
    # the real key sees the change: nothing is cached under it, nothing is wrong
    statuses = {r["kernel"].rpartition(":")[2]: r["status"] for r in honest["results"]}
    assert statuses == {"exact_kernel": "uncached", "open_kernel": "open"}
    # (the open kernel, its code blind, is keyed like the entry it was warmed as: its reads hold)
    statuses = {r["kernel"].rpartition(":")[2]: r["status"] for r in witnessed["results"]}
    assert statuses == {"exact_kernel": "uncached", "open_kernel": "exact"}


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
    assert statuses == {"exact_kernel": "exact", "open_kernel": "open"}
    # the same IR, other machine code: both entries differ, and the audit fails
    changed = audit(project["root"], project, "--compile", code=1, prelude=RESTAMPED)
    differs = {r["kernel"].rpartition(":")[2]: r for r in changed["results"]}
    assert {name: r["status"] for name, r in differs.items()} == {
        "exact_kernel": "differs",
        "open_kernel": "differs",
    }
    assert "first different at byte" in differs["exact_kernel"]["reason"]
    assert differs["exact_kernel"]["ir"] == differs["exact_kernel"]["entry_ir"]
    # the IR alone cannot see it
    assert audit(project["root"], project, code=0, prelude=RESTAMPED)["differs"] == 0
