"""A kernel entry whose launch metadata says it cannot be launched through this jaxlib (more
threads than a block holds, a cluster larger than one can be, a profile scratch buffer; also
global scratch jaxlib lacks) is compiled again before the lowering says so: a forged entry (its
digests made again, as anyone who writes a shared root can) costs a compile, never the job, and
the lowering embeds what a fresh root's compile embeds. So does a failure entry of a kernel that
compiles, where it would leave the call no config."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from bridge_helpers import forget_lowerings, kernel_module, kernel_source, opaque

from kernelcache.schema.document import encode_metadata, entry_digest

FORGED = {
    "too-many-threads": {"num_warps": 64},
    "a-profile-scratch-buffer": {"profile_scratch_size": 16},
    "a-cluster-larger-than-a-cluster-can-be": {"num_ctas": 1024},
}


@pytest.fixture(scope="module")
def honest(tmp_path_factory):
    """A kernel lowered once into a root, and the opaque a fresh root's lowering embeds."""
    base = tmp_path_factory.mktemp("forged-launch")
    module = kernel_module(base, "forged_launch", kernel_source("", "x * 3.0"))
    root = base / "root"
    return module.kernel, root, opaque(module.kernel, root), base


@pytest.mark.parametrize("fields", FORGED.values(), ids=FORGED.keys())
def test_a_forged_launch_field_is_compiled_again_not_raised(honest, fields, caplog):
    kernel, root, expected, base = honest
    forged = base / f"forged-{len(list(base.iterdir()))}"
    shutil.copytree(root, forged)
    forget_lowerings(forged)
    (meta_path,) = [p.with_suffix(".json") for p in Path(forged).glob("*.cubin")]
    doc = json.loads(meta_path.read_bytes())
    doc.update(fields)
    doc["entry_digest"] = entry_digest(doc)
    meta_path.write_bytes(encode_metadata(doc))
    assert opaque(kernel, forged) == expected
    assert "compiling it again in memory" in caplog.text


def test_a_forged_failure_entry_of_a_kernel_that_compiles_is_compiled_again(honest, caplog):
    """A failure entry says the kernel cannot compile: where that would leave the call no
    config at all, the kernel is compiled again first, and it runs."""
    import kernelcache
    from bridge.entries import failures

    kernel, root, expected, base = honest
    forged = base / "forged-failure"
    shutil.copytree(root, forged)
    forget_lowerings(forged)
    (binary,) = Path(forged).glob("*.cubin")
    key = binary.stem
    for path in Path(forged).glob(f"{key}.*"):
        path.unlink()
    about = {"name": "kernel", "kernel": "forged_launch.kernel", "target": "cuda:90"}
    failures.remember(kernelcache.Cache(str(forged)), key, "out of resource: shared memory", about)
    assert failures.remembered(kernelcache.Cache(str(forged)), key) is not None
    assert opaque(kernel, forged) == expected
    assert "but it compiles here" in caplog.text
