"""What a lowering embeds depends on what the kernel is, never on which entry of the cache served
it: a kernel whose reads changed is kept under a key chained from its first, and its custom call
is byte for byte the one a fresh root's compile of the same code gives (jaxlib's module cache and
JAX's persistent cache key on those bytes)."""

from __future__ import annotations

from bridge_helpers import REPO, kernel_source, run_child


def source(scale: str) -> str:
    """A kernel that reads the global ``SCALE`` (``scale``)."""
    return kernel_source(f"SCALE = tl.constexpr({scale})", "x * SCALE")


CHILD = """
import json, sys
sys.path[:0] = [{directory!r}, {helpers!r}]
from bridge.compile import compiler
from bridge_helpers import opaque
import marked_kernel
print(json.dumps({{
    "opaques": [opaque(marked_kernel.kernel, root) for root in {roots!r}],
    "compiles": compiler.compile_count(),
}}))
"""


def test_a_kernel_served_from_a_chained_key_embeds_what_a_fresh_compile_embeds(tmp_path):
    code = tmp_path / "code"
    code.mkdir()
    root, fresh = str(tmp_path / "root"), str(tmp_path / "fresh")

    def lower(scale: str, *roots: str) -> dict:
        (code / "marked_kernel.py").write_text(source(scale))
        helpers = str(REPO / "tests" / "helpers")
        return run_child(CHILD.format(directory=str(code), helpers=helpers, roots=list(roots)))

    before = lower("2.0", root)
    # its reads find 3.0: compiled and kept under a key chained from the first; then the same
    # code compiled into an empty root
    after = lower("3.0", root, fresh)
    assert after["compiles"] == 2
    chained, compiled = after["opaques"]
    assert chained != before["opaques"][0]
    assert chained == compiled
    assert lower("3.0", root) == {"opaques": [compiled], "compiles": 0}
