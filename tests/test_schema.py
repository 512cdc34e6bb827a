"""One schema, extended by the packages built on kernelcache: declared fields and their
checks, and the entry digest over what each document says it covers."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import xxhash

import kernelcache
from kernelcache import schema
from kernelcache.store import Store

KEY = "ab" * 16
PAYLOAD = b"\x7fELF" + bytes(60)


@pytest.fixture(autouse=True)
def _declarations_undone():
    """What a test declares is undone after it (other tests share the process). The bridge's
    fields are declared first, for good: a test that imports the bridge for the first time
    would otherwise undo them for every test after it."""
    import bridge.entries.fields  # noqa: F401
    from kernelcache.schema import fields

    saved = dict(fields.FIELDS), dict(fields._INT_RANGES), set(fields._covered)
    yield
    for now, before in zip(
        (fields.FIELDS, fields._INT_RANGES, fields._covered), saved, strict=True
    ):
        now.clear()
        now.update(before)


def test_a_declared_field_is_checked_and_covered(tmp_path):
    schema.register_fields({"test_width": schema.integer(1, 8)}, covered=frozenset({"test_width"}))
    with pytest.raises(ValueError, match="test_width"):
        Store(tmp_path).put(KEY, "bin", PAYLOAD, {"test_width": 9})
    Store(tmp_path).put(KEY, "bin", PAYLOAD, {"test_width": 4, "free": 1})
    doc = json.loads((tmp_path / f"{KEY}.json").read_text())
    assert "test_width" in doc["covers"] and "free" not in doc["covers"]
    doc["free"] = 2  # not covered: may change
    (tmp_path / f"{KEY}.json").write_text(json.dumps(doc))
    assert isinstance(Store(tmp_path).read(KEY, "bin"), kernelcache.Artifact)
    doc["test_width"] = 5  # covered: damage
    (tmp_path / f"{KEY}.json").write_text(json.dumps(doc))
    found = Store(tmp_path).read(KEY, "bin")
    assert isinstance(found, kernelcache.problem.Problem) and found.corrupt


def test_a_covered_field_added_later_is_damage(tmp_path):
    schema.register_fields({"test_lanes": schema.integer(1, 64)}, covered=frozenset({"test_lanes"}))
    Store(tmp_path).put(KEY, "bin", PAYLOAD, {"name": "k"})
    path = tmp_path / f"{KEY}.json"
    doc = json.loads(path.read_text())
    path.write_text(json.dumps({**doc, "test_lanes": 32}))
    found = Store(tmp_path).read(KEY, "bin")
    assert isinstance(found, kernelcache.problem.Problem) and found.corrupt


@pytest.mark.parametrize(
    "checks, covered",
    [
        ({"digest": schema.text(8)}, frozenset()),
        ({"covers": schema.text(8)}, frozenset()),
        ({"": schema.text(8)}, frozenset()),
        ({}, frozenset({"never_declared"})),
    ],
)
def test_what_cannot_be_declared(checks, covered):
    with pytest.raises(ValueError):
        schema.register_fields(checks, covered=covered)


def test_a_refined_check_applies_both(tmp_path):
    def short(value):
        return None if len(value) <= 8 else "must be short"

    schema.register_fields({"kind": short})
    schema.register_fields({"kind": short})  # again: no-op
    with pytest.raises(ValueError, match="must be short"):
        Store(tmp_path).put(KEY, "bin", PAYLOAD, {"kind": "much-too-long"})
    with pytest.raises(ValueError, match="printable"):
        Store(tmp_path).put(KEY, "bin", PAYLOAD, {"kind": "a\x00"})


@pytest.mark.parametrize("covers", [["b", "a"], "a", ["format"], ["a"] * 2, [1]])
def test_an_odd_covers_list_is_a_corrupt_entry(tmp_path, covers):
    Store(tmp_path).put(KEY, "bin", PAYLOAD, {"name": "k"})
    path = tmp_path / f"{KEY}.json"
    doc = {**json.loads(path.read_text()), "covers": covers}
    doc["entry_digest"] = schema.entry_digest(doc) if isinstance(covers, list) else "x"
    path.write_text(json.dumps(doc))
    found = Store(tmp_path).read(KEY, "bin")
    assert isinstance(found, kernelcache.problem.Problem) and found.corrupt


def test_a_reader_that_knows_no_fields_checks_a_document_by_its_covers(tmp_path):
    """An entry of the bridge verifies in a process that never imported the bridge (an
    operator's box): the document names what its digest covers."""
    import bridge  # noqa: F401  (declares the bridge's fields)

    meta = {"name": "add_kernel", "target": "cuda:90", "num_warps": 4, "shared": 0}
    Store(tmp_path).put(KEY, "cubin", PAYLOAD, meta)
    path = tmp_path / f"{KEY}.json"
    code = (
        "import sys, kernelcache; from kernelcache.store import Store; "
        f"r = Store({str(tmp_path)!r}).read({KEY!r}, 'cubin'); "
        "print(type(r).__name__, getattr(r, 'reason', ''), 'bridge' in sys.modules)"
    )

    def read_alone() -> str:
        return subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True
        ).stdout.strip()

    assert read_alone() == "Artifact  False"
    doc = json.loads(path.read_text())
    path.write_text(json.dumps({**doc, "num_warps": 8}))
    assert read_alone().startswith("Problem entry digest mismatch")


def test_a_document_of_the_previous_format_is_a_clean_miss(tmp_path):
    """Format 1 digests did not cover the covers list: such a document is never served, nor
    quarantined; the next put replaces it. A document without a covers list is corrupt."""
    meta = {"name": "add_kernel", "target": "cuda:90", "num_warps": 4, "shared": 0}
    Store(tmp_path).put(KEY, "cubin", PAYLOAD, meta)
    path = tmp_path / f"{KEY}.json"
    doc = json.loads(path.read_text())
    older = {**doc, "format": 1}
    names = ("format", "key", "ext", "size", "digest", *doc["covers"])
    covered = {name: older[name] for name in names if name in older}
    older["entry_digest"] = schema.DIGEST_PREFIX + xxhash.xxh3_128_hexdigest(
        json.dumps(covered, sort_keys=True, separators=(",", ":")).encode()
    )  # the digest a writer of format 1 computed: its covers list outside it
    path.write_text(json.dumps(older))
    found = Store(tmp_path).get(KEY, "cubin")
    assert isinstance(found, kernelcache.problem.Problem) and found.outdated and not found.corrupt
    assert "older kernelcache" in found.reason and path.exists()  # not quarantined
    art = Store(tmp_path).put(KEY, "cubin", PAYLOAD, meta)
    assert art.meta["format"] == schema.FORMAT_VERSION
    assert isinstance(Store(tmp_path).read(KEY, "cubin"), kernelcache.Artifact)

    del doc["covers"]
    doc["entry_digest"] = schema.entry_digest(doc)
    path.write_text(json.dumps(doc))
    found = Store(tmp_path).read(KEY, "cubin")
    assert isinstance(found, kernelcache.problem.Problem) and found.corrupt
    assert "covers" in found.reason
