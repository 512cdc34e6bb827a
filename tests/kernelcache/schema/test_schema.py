"""One schema, extended by the packages built on kernelcache: declared fields and their
checks, and the entry digest over what each document says it covers."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import xxhash
from artifact_images import elf_image, launch

import kernelcache
from kernelcache import schema
from kernelcache.store import Store

KEY = "ab" * 16
PAYLOAD = b"\x7fELF" + bytes(60)  # for entries of an extension without a structure ("bin")
CUBIN = elf_image(b"code")


@pytest.fixture(autouse=True)
def _declarations_undone():
    """What a test declares is undone after it (other tests share the process). The bridge's
    fields are declared first, for good: a test that imports the bridge for the first time
    would otherwise undo them for every test after it."""
    import bridge.entries.metadata  # noqa: F401
    from kernelcache.schema import fields

    saved = dict(fields.FIELDS), dict(fields._INT_RANGES), set(fields.COVERED)
    yield
    for now, before in zip((fields.FIELDS, fields._INT_RANGES, fields.COVERED), saved, strict=True):
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

    meta = launch(kernel="m:add_kernel", language="triton")  # the bridge's own fields too
    Store(tmp_path).put(KEY, "cubin", CUBIN, meta)
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
    meta = launch()
    Store(tmp_path).put(KEY, "cubin", CUBIN, meta)
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
    art = Store(tmp_path).put(KEY, "cubin", CUBIN, meta)
    assert art.meta["format"] == schema.FORMAT_VERSION
    assert isinstance(Store(tmp_path).read(KEY, "cubin"), kernelcache.Artifact)

    del doc["covers"]
    doc["entry_digest"] = schema.entry_digest(doc)
    path.write_text(json.dumps(doc))
    found = Store(tmp_path).read(KEY, "cubin")
    assert isinstance(found, kernelcache.problem.Problem) and found.corrupt
    assert "covers" in found.reason


# -- the launch metadata of machine code is kernelcache's own ------------------------------------
def test_the_launch_fields_are_kernelcaches_own_and_declaring_them_again_is_a_no_op():
    """The launch fields are declared by kernelcache (a process without the bridge checks and
    covers them); a package declaring the same checks again (as the bridge did) changes
    nothing and raises nothing."""
    from kernelcache.schema import fields

    launch_fields = {"name", "target", "num_warps", "num_ctas", "shared", "global_scratch_size"}
    assert launch_fields <= schema.OWN_FIELDS and launch_fields <= schema.covered_fields()
    before = dict(fields.FIELDS)
    schema.register_fields(
        {
            "num_warps": schema.integer(1, 1024),
            "shared": schema.integer(0, (1 << 32) - 1),
            "global_scratch_align": schema.power_of_two(1 << 20),
            "tensordesc_meta": schema.objects(64),
        },
        covered=frozenset({"num_warps", "shared"}),
    )
    assert fields.FIELDS == before  # the same check objects: nothing wrapped
    assert schema.REQUIRED["cubin"] == {"name", "target", "num_warps", "num_ctas", "shared"}


def test_a_stricter_check_of_an_integer_field_applies_to_every_value(tmp_path):
    """A package that narrows a declared integer field narrows it for values inside the wider
    range too (the fast path of the wider range used to let them through)."""
    schema.register_fields({"num_warps": schema.integer(1, 64)})
    with pytest.raises(ValueError, match="'num_warps' must be between 1 and 64, not 128"):
        Store(tmp_path).put(KEY, "cubin", CUBIN, launch(num_warps=128))
    assert Store(tmp_path).put(KEY, "cubin", CUBIN, launch(num_warps=32)).meta["num_warps"] == 32
    schema.register_fields({"shared": lambda value: None if value % 2 == 0 else "must be even"})
    with pytest.raises(ValueError, match="must be even"):
        Store(tmp_path).put("cd" * 16, "cubin", CUBIN, launch(shared=3))
