"""``kernelcache show`` of a compiled kernel, as a person reads it: its read set as a count
and its first rows, its key's components one a line, a long value cut; ``-v`` every row and
value whole; ``--json`` the whole document, as stored. Through the real command line, on a
kernel ``warm`` compiled."""

from __future__ import annotations

import json

import pytest
from cli_support import kc, kc_json
from support import REPO

pytest.importorskip("triton", reason="warm compiles a kernel")

ADD = json.loads((REPO / "examples" / "manifest.jsonl").read_text().splitlines()[0])


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    base = tmp_path_factory.mktemp("show")
    manifest = base / "add.jsonl"
    manifest.write_text(json.dumps(ADD) + "\n")
    root = base / "cache"
    assert kc(root, "warm", str(manifest), "--target", "cuda:90").returncode == 0
    (entry,) = kc_json(root, "ls")["entries"]
    return root, entry["key"]


def test_show_summarizes_the_read_set_and_lists_components(kernel):
    root, key = kernel
    doc = kc_json(root, "show", key)
    rows = json.loads(doc["metadata"]["reads"])["rows"]
    components = doc["metadata"]["components"]
    assert len(rows) > 5 and len(components) > 5  # (more than a summary shows)
    text = kc(root, "show", key).stdout
    lines = text.splitlines()
    assert f"  reads: {len(rows)} reads, exact" in lines
    shown = [line for line in lines if line.startswith("    [")]
    assert len(shown) == 5 and shown[0].startswith('    [0] f "" (of the kernel): ')
    assert f"    ... {len(rows) - 5} more rows (-v shows them)" in lines
    assert f"  components: {len(components)} items" in lines
    for name, digest in components.items():
        assert f"    {name}: {digest}" in lines
    assert max(len(line) for line in lines) < 200  # no 2 KB line
    assert '"rows"' not in text


def test_show_v_shows_every_row_and_json_the_whole_document(kernel):
    root, key = kernel
    doc = kc_json(root, "show", key)
    rows = json.loads(doc["metadata"]["reads"])["rows"]
    lines = kc(root, "show", key, "-v").stdout.splitlines()
    assert len([line for line in lines if line.startswith("    [")]) == len(rows)
    assert not any("more rows" in line for line in lines)
    covers = doc["metadata"]["covers"]
    assert all(f"    - {c}" in lines for c in covers)
    stored = json.loads((root / f"{key}.json").read_text())
    assert doc["metadata"] == stored
