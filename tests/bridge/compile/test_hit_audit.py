"""Auditing hits in a job (``KERNELCACHE_AUDIT``): a cached kernel compiled from other IR than
its frontend gives now is said loudly and compiled again for the process.

The stale entry is made by hand, as a blind spot of the key and the witness would make it: the
entry the code of now would be stored under (its key, its reads), holding the machine code and
IR of the code of before."""

from __future__ import annotations

import hashlib
import json
import logging

import pytest
import triton.language as tl
from bridge_helpers import kernel_module, machine_code

import kernelcache
from bridge.entries import kernels
from bridge.entries.kernels import PTX
from kernelcache.schema import COVERS_FIELD, RESERVED_FIELDS

SOURCE = """
SCALE = tl.constexpr(2.0)


@triton.jit
def kernel(x_ptr, n, out_ptr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * SCALE, mask=mask)
"""


def _entries(root) -> dict[str, dict]:
    return {
        p.stem: json.loads(p.read_text())
        for p in root.glob("*.json")
        if json.loads(p.read_text()).get("ext") == "cubin"
    }


@pytest.fixture
def stale_root(tmp_path):
    """A root whose entry for the kernel with SCALE 9 holds the kernel with SCALE 2, and the
    module (its SCALE 9)."""
    tag = hashlib.sha256(str(tmp_path).encode()).hexdigest()[:8]
    module = kernel_module(tmp_path, f"hit_audit_{tag}", SOURCE)
    before = machine_code(module.kernel, tmp_path / "A")
    module.SCALE = tl.constexpr(9.0)
    machine_code(module.kernel, tmp_path / "B")
    ((_, old),) = _entries(tmp_path / "A").items()
    ((key, new),) = _entries(tmp_path / "B").items()
    meta = {k: v for k, v in new.items() if k not in RESERVED_FIELDS and k != COVERS_FIELD}
    meta.update(ir=old["ir"], ptx_sha256=old["ptx_sha256"])
    stale = kernelcache.Cache(str(tmp_path / "stale"))
    stale.put(key, "cubin", before, meta)
    ptx = PTX.get(kernelcache.Cache(str(tmp_path / "A")), old["key"])
    kernels.store_ptx(stale, key, ptx.data.decode(), new)
    return module, tmp_path / "stale", before


def test_without_the_audit_the_blind_spot_serves_the_stale_kernel(stale_root, monkeypatch):
    """(What the audit is for: the entry is served as it is.)"""
    module, root, before = stale_root
    monkeypatch.delenv("KERNELCACHE_AUDIT", raising=False)
    assert machine_code(module.kernel, root) == before


def test_an_audited_hit_compiled_from_other_ir_is_said_and_compiled_again(
    stale_root, monkeypatch, caplog, tmp_path
):
    module, root, before = stale_root
    monkeypatch.setenv("KERNELCACHE_AUDIT", "1")
    with caplog.at_level(logging.WARNING):
        now = machine_code(module.kernel, root)
    assert now != before
    assert now == machine_code(module.kernel, tmp_path / "fresh")
    said = [r.getMessage() for r in caplog.records if "AUDIT FAILED" in r.getMessage()]
    assert len(said) == 1 and module.kernel.__qualname__ in said[0], said


def test_the_audit_fraction_is_checked(monkeypatch):
    from bridge.settings import job_settings

    monkeypatch.setenv("KERNELCACHE_AUDIT", "0.25")
    assert job_settings().audit == 0.25
