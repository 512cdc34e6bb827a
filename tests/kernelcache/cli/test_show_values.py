"""``kernelcache show`` of any entry: a mapping one item a line, a long list counted with its
first rows, a long text cut with its length; ``-v`` each whole; ``--json`` the document as
stored."""

from __future__ import annotations

import json

from artifact_images import launch, sized
from cli_support import kc, kc_json

from kernelcache import Store


def test_long_values_are_cut_and_v_shows_them_whole(tmp_path):
    root = tmp_path / "cache"
    name = "k_" + "x" * 300  # a kernel name of 302 characters
    meta = launch("cubin", name=name, target="cuda:90", num_warps=4)
    meta["components"] = {f"part{i}": f"{i:064x}" for i in range(9)}
    art = Store(root).put("ab" * 32, "cubin", sized("cubin", 400, b"k", name), meta)
    lines = kc(root, "show", art.key).stdout.splitlines()
    assert f"  name: {name[:100]}... (302 characters; -v shows it whole)" in lines
    assert "  components: 9 items" in lines
    assert f"    part8: {8:064x}" in lines
    assert max(len(line) for line in lines) < 200
    whole = kc(root, "show", art.key, "-v").stdout.splitlines()
    assert f"  name: {name}" in whole
    doc = kc_json(root, "show", art.key)
    assert doc["metadata"] == json.loads((root / f"{art.key}.json").read_text())
