"""An entry is verified whole: its launch metadata is covered by a digest, every metadata value
is checked against one schema wherever it enters (disk, ``put``, bundles), odd values are corrupt
entries that no command crashes on, entries of older versions are misses, and imports are
all-or-nothing."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tarfile
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from artifact_images import PTX, elf_image, launch
from bundle_files import write_bundle
from cli_support import kc, kc_json, put
from support import child_env, key_of, run_py

import bridge.entries.metadata  # noqa: F401  (importing bridge declares its fields)
import kernelcache
from kernelcache import stats
from kernelcache.bundle import import_bundle
from kernelcache.errors import BundleError
from kernelcache.schema import FORMAT_VERSION, LAUNCH_FIELDS, entry_digest
from kernelcache.store import Store, digest, make_metadata

PAYLOAD = elf_image(bytes(range(256)) * 64)  # a whole cubin of 16 KiB and some
KERNEL_META = launch()  # name, target, num_warps, num_ctas, shared: what a cubin must hold

#: values that put, an import or a Redis value used to accept, and that broke every command
ODD_VALUES: dict[str, tuple[str, Any]] = {
    "created-400-digits": ("created", 10**400),
    "created-infinity": ("created", math.inf),
    "created-nan": ("created", math.nan),
    "name-lone-surrogate": ("name", "\ud800"),
    "name-list": ("name", [1, 2]),
    "producer-int": ("producer", 5),
    "producer-str": ("producer", "abc"),
}


def _edit_metadata(root: Path, key: str, **fields: Any) -> None:
    """Rewrite ``<key>.json`` with ``fields`` changed, as a damaged disk or an editor would
    (no digest recomputed). ``json.dumps`` writes NaN, Infinity, huge integers and lone
    surrogates (as ``\\ud800``) as they are."""
    path = root / f"{key}.json"
    doc = json.loads(path.read_text())
    doc.update(fields)
    path.write_text(json.dumps(doc))


def _quarantined(root: Path) -> list[str]:
    q = root / ".quarantine"
    return sorted(p.name for p in q.iterdir()) if q.exists() else []


# -- launch metadata is covered --------------------------------------------------------------
def test_edited_launch_metadata_is_never_served(tmp_path):
    """num_warps 4 -> 8 and shared 0 -> 8 in place, same file size: verify reports it, and a
    fresh process gets a miss (the entry is quarantined), never the edited launch."""
    root = tmp_path / "cache"
    key = key_of("launch-edit")
    Store(root).put(key, "cubin", PAYLOAD, KERNEL_META)
    path = root / f"{key}.json"
    raw = path.read_bytes()
    edited = raw.replace(b'"num_warps":4', b'"num_warps":8').replace(b'"shared":0', b'"shared":8')
    assert edited != raw and len(edited) == len(raw)
    path.write_bytes(edited)
    doc = kc_json(root, "verify", code=1)
    (problem,) = doc["problems"]
    assert (problem["kind"], problem["path"]) == ("corrupt", f"{key}.json")
    assert "digest" in problem["detail"]
    proc = run_py(
        f"""
        import kernelcache
        art = kernelcache.Cache({str(root)!r}, readonly_roots=(), remote="").get({key!r}, "cubin")
        print("MISS" if art is None else art.meta["num_warps"])
        """
    )
    assert proc.stdout.split() == ["MISS"]
    assert any(name.startswith(f"{key}.json") for name in _quarantined(root))


@pytest.mark.parametrize("field", sorted((LAUNCH_FIELDS | {"name"}) - {"ptx_sha256"}))
def test_every_launch_field_is_covered(root, field):
    """Changing any launch field by one notch (or adding it) makes the entry corrupt."""
    key = key_of("covered", field)
    meta = launch(name="k")
    Store(root).put(key, "cubin", PAYLOAD, meta)
    doc = json.loads((root / f"{key}.json").read_text())
    old = doc.get(field)
    if field == "tensordesc_meta":
        new: Any = [{"swizzle": 1, "elem_size": 2, "elem_type": 1, "block_size": [64]}]
    elif isinstance(old, int):
        new = old + 1
    elif field == "name":
        new = "other_kernel"
    else:  # absent: the bridge falls back to a default, so adding it changes the launch
        new = "gfx942" if field == "arch" else 2
    _edit_metadata(root, key, **{field: new})
    result = Store(root).read(key, "cubin")
    assert isinstance(result, kernelcache.store.Problem) and result.corrupt, result


def test_target_and_ptx_digest_are_covered(root):
    key = key_of("covered-target")
    meta = {**KERNEL_META, "ptx_sha256": "ab" * 32}
    for field, value in (("target", "cuda:80"), ("ptx_sha256", "cd" * 32)):
        Store(root).put(key, "cubin", PAYLOAD, meta)
        _edit_metadata(root, key, **{field: value})
        result = Store(root).read(key, "cubin")
        assert isinstance(result, kernelcache.store.Problem) and result.corrupt, field
        Store(root).delete(key)


def test_fields_outside_the_launch_set_may_change(root):
    """``created`` and the last-used stamp are not launch metadata: tools may rewrite them."""
    key = key_of("created-edit")
    Store(root).put(key, "cubin", PAYLOAD, KERNEL_META)
    _edit_metadata(root, key, created=1000.0)
    art = Store(root).read(key, "cubin")
    assert isinstance(art, kernelcache.Artifact) and art.meta["created"] == 1000.0


def test_the_bridge_is_handed_only_covered_fields(tmp_path):
    """What the bridge lowers a cached kernel from (``KernelBinary.meta``) holds only fields
    the entry digest covers, on a build and on a hit."""
    from bridge.compile.compiler import Compiled
    from bridge.compile.fetch import Request, fetch_request
    from kernelcache.schema import STORE_COVERED, covered_fields

    covered = set(STORE_COVERED) | covered_fields()

    cache = kernelcache.Cache(tmp_path / "c", readonly_roots=(), remote="")
    key = key_of("bridge-covered")

    def describe(compiled: Compiled) -> dict[str, Any]:
        return {**KERNEL_META, "kernel": "m:k", "language": "triton", "signature": {"x": "*fp32"}}

    def build() -> Compiled:
        return Compiled(elf_image(b"binary"), PTX.decode(), {"name": "add_kernel"})

    for built in (True, False):
        kb = fetch_request(cache, Request(key, "cubin", build, describe, need_ptx=True))
        assert kb.built is built
        assert set(kb.meta) <= covered, set(kb.meta) - covered
        assert kb.meta["num_warps"] == 4 and kb.meta["ptx_sha256"] and "signature" not in kb.meta
    assert "signature" in cache.get(key, "cubin").meta  # stored whole, handed over covered


# -- what a document covers is covered ---------------------------------------------------------
def _written_covering_less(root: Path, key: str, data: bytes, meta: dict[str, Any]) -> None:
    """Write the entry ``key`` as a writer whose digest covered only ``name`` and ``target``
    did (a version whose kernelcache did not know the launch fields, without the bridge)."""
    doc = make_metadata(key, "bin", data, meta)
    doc["covers"] = ["name", "target"]
    doc["entry_digest"] = entry_digest(doc)
    (root / f"{key}.bin").write_bytes(data)
    (root / f"{key}.json").write_text(json.dumps(doc))


def test_a_covers_list_edited_on_disk_is_a_corrupt_entry(root):
    """Dropping from ``covers`` a launch field the entry does not hold changes no covered
    value: only a digest over the list itself sees it (else the field could then be added,
    uncovered)."""
    key = key_of("covers-edit")
    Store(root).put(key, "bin", PAYLOAD, KERNEL_META)
    covers = json.loads((root / f"{key}.json").read_text())["covers"]
    assert "tmem_size" in covers and "tmem_size" not in KERNEL_META
    _edit_metadata(root, key, covers=[name for name in covers if name != "tmem_size"])
    found = Store(root).read(key, "bin")
    assert isinstance(found, kernelcache.store.Problem) and found.corrupt, found
    assert "covers" in found.reason


def test_a_launch_field_its_writer_did_not_cover_is_rebuilt_never_served(root):
    """A writer of an earlier version stored num_warps without covering it; edited to 32 (and
    shared to 200000), its digest still holds. A reader that requires launch fields covered
    never serves it and never covers it in its stead: a miss (not corrupt: nothing was
    quarantined), rebuilt with the reader's own fields; verify names it."""
    key = key_of("uncovered-launch")
    root.mkdir()
    _written_covering_less(root, key, PAYLOAD, KERNEL_META)
    doc = json.loads((root / f"{key}.json").read_text())
    assert doc["covers"] == ["name", "target"] and doc["num_warps"] == 4
    _edit_metadata(root, key, num_warps=32, shared=200_000)
    cache = kernelcache.Cache(root, readonly_roots=(), remote="")
    before = stats.process_stats()
    assert cache.get(key, "bin") is None
    assert stats.process_stats()["corrupt"] == before["corrupt"] and _quarantined(root) == []
    (problem,) = kc_json(root, "verify", code=1)["problems"]
    assert problem["kind"] == "outdated" and "num_warps, shared" in problem["detail"]
    art = cache.get_or_create(key, "bin", lambda: (PAYLOAD, KERNEL_META))
    assert art.meta["num_warps"] == 4 and {"num_warps", "shared"} <= set(art.meta["covers"])
    assert Store(root).read(key, "bin").meta["shared"] == 0


# -- one schema: put ---------------------------------------------------------------------------
@pytest.mark.parametrize("case", sorted(ODD_VALUES))
def test_put_refuses_an_odd_value_naming_the_field(root, case):
    field, value = ODD_VALUES[case]
    key = key_of("put-odd", case)
    with pytest.raises(ValueError, match=repr(field)):
        Store(root).put(key, "cubin", PAYLOAD, {**KERNEL_META, field: value})
    with pytest.raises(ValueError, match=repr(field)):
        kernelcache.Cache(root, readonly_roots=(), remote="").put(
            key, "cubin", PAYLOAD, {field: value}
        )
    assert not list(root.glob("*.json")) if root.exists() else True


@pytest.mark.parametrize(
    "meta, field",
    [
        ({"num_warps": 0}, "num_warps"),
        ({"num_warps": True}, "num_warps"),
        ({"num_warps": 4.0}, "num_warps"),
        ({"shared": -1}, "shared"),
        ({"shared": 1 << 40}, "shared"),
        ({"target": "gpu:1"}, "target"),
        ({"tensordesc_meta": {"swizzle": 1}}, "tensordesc_meta"),
        ({"ptx_sha256": "xyz"}, "ptx_sha256"),
        ({"created": -5}, "created"),
        ({"producer": {"triton": 3}}, "producer"),
        ({"extra": {"deep": json.loads("[" * 20 + "1" + "]" * 20)}}, "extra"),
        ({"extra": "x" * (100 << 10)}, "extra"),
        ({"extra": object()}, "extra"),
        ({"\ud800": 1}, "\\ud800"),
        ({"entry_digest": "xxh3_128:" + "0" * 32}, "entry_digest"),
    ],
)
def test_put_checks_types_ranges_and_sizes(root, meta, field):
    with pytest.raises(ValueError, match=field.replace("\\", "\\\\")):
        Store(root).put(key_of("put-bad", field), "cubin", PAYLOAD, meta)


def test_put_stores_what_readers_will_parse(root):
    """Tuples and the like are normalized to what JSON gives back, and the document put
    returns is the one later reads return."""
    key = key_of("normalized")
    art = Store(root).put(key, "cubin", PAYLOAD, {**KERNEL_META, "extra": (1, 2)})
    again = Store(root).read(key, "cubin")
    assert isinstance(again, kernelcache.Artifact)
    assert dict(art.meta) == dict(again.meta) and again.meta["extra"] == [1, 2]


# -- one schema: disk, and every command ---------------------------------------------------------
@pytest.mark.parametrize("case", sorted(ODD_VALUES))
def test_an_odd_value_on_disk_is_a_corrupt_entry(root, case):
    field, value = ODD_VALUES[case]
    key = key_of("disk-odd", case)
    Store(root).put(key, "cubin", PAYLOAD, KERNEL_META)
    _edit_metadata(root, key, **{field: value})
    cache = kernelcache.Cache(root, readonly_roots=(), remote="")
    before = stats.process_stats()
    assert cache.get(key, "cubin") is None
    assert stats.process_stats()["corrupt"] == before["corrupt"] + 1
    assert any(name.startswith(f"{key}.json") for name in _quarantined(root))
    art = cache.get_or_create(key, "cubin", lambda: (PAYLOAD, KERNEL_META))
    assert art.path is not None and art.source == "local"


@pytest.mark.parametrize("in_a_readonly_layer", [False, True], ids=["own-root", "readonly-layer"])
def test_an_artifact_claiming_more_than_an_entry_may_hold_is_never_read(
    tmp_path, in_a_readonly_layer
):
    """A root's writer makes a kernel's file sparse and its metadata claim that size (digests
    recomputed): every reader would allocate and read it whole (a 1 TiB claim raised
    MemoryError into the job; 3 GiB took 30 s and 6 GB). A claim over what an entry may hold is
    a corrupt entry, refused before its file is read."""
    root = tmp_path / "root"
    key = key_of("sparse")
    Store(root).put(key, "cubin", PAYLOAD, KERNEL_META)
    claim = 3 << 30
    os.truncate(root / f"{key}.cubin", claim)
    doc = json.loads((root / f"{key}.json").read_text())
    doc["size"] = claim
    doc["entry_digest"] = entry_digest(doc)  # (no secret: anyone who can write can recompute it)
    (root / f"{key}.json").write_text(json.dumps(doc))
    cache = (
        kernelcache.Cache(tmp_path / "own", readonly_roots=(root,), remote="")
        if in_a_readonly_layer
        else kernelcache.Cache(root, readonly_roots=(), remote="")
    )
    started = time.process_time()  # (CPU time: reading 3 GiB would cost seconds of it, any load)
    assert cache.get(key, "cubin") is None
    assert time.process_time() - started < 1.0
    art = cache.get_or_create(key, "cubin", lambda: (PAYLOAD, KERNEL_META))
    assert art.data == PAYLOAD


COMMANDS_CHILD = textwrap.dedent(
    """
    import json, sys
    from kernelcache.cli.app import main
    codes = []
    for argv in json.loads(sys.argv[1]):
        sys.stdout.flush()
        codes.append(main(argv))
    sys.stdout.flush()
    print("\\nCODES", json.dumps(codes))
    """
)


@pytest.mark.parametrize("case", sorted(ODD_VALUES))
def test_no_command_crashes_on_an_odd_value(tmp_path, case):
    """stats, ls, show, verify, prune and export, human and JSON, on a root holding one entry
    with the odd value: each names the problem (path and reason) or skips the entry, none
    crashes; verify --repair leaves the root clean."""
    field, value = ODD_VALUES[case]
    root = tmp_path / "cache"
    good = put(root, "good", size=300)
    key = key_of("cmd-odd", case)
    Store(root).put(key, "cubin", PAYLOAD, KERNEL_META)
    _edit_metadata(root, key, **{field: value})
    r = str(root)
    commands = [
        ["--root", r, "stats"],
        ["--root", r, "stats", "--json"],
        ["--root", r, "ls"],
        ["--root", r, "ls", "--json", "--sort", "age"],
        ["--root", r, "show", key],
        ["--root", r, "show", key, "--json"],
        ["--root", r, "verify"],
        ["--root", r, "prune", "--dry-run", "--max-size", "0"],
        ["--root", r, "export", str(tmp_path / "b.tar")],
    ]
    proc = subprocess.run(
        [sys.executable, "-c", COMMANDS_CHILD, json.dumps(commands)],
        env=child_env(),
        capture_output=True,
        timeout=120,
    )
    out, err = proc.stdout.decode(errors="replace"), proc.stderr.decode(errors="replace")
    assert proc.returncode == 0, err
    codes = json.loads(out.rsplit("CODES", 1)[1])
    assert all(code in (0, 1) for code in codes), (codes, err)
    for word in ("Traceback", "rerun with", "Error:", "OverflowError", "UnicodeEncodeError"):
        assert word not in err, err
    assert codes[6] == 1  # verify found it
    doc = kc_json(root, "verify", code=1)
    assert [(p["kind"], p["path"]) for p in doc["problems"]] == [("corrupt", f"{key}.json")]
    assert field in doc["problems"][0]["detail"]
    listed = kc_json(root, "ls")
    assert listed["count"] == 1
    assert [(p["kind"], p["path"]) for p in listed["problems"]] == [("corrupt", f"{key}.json")]
    assert f"{key}.json" in kc(root, "ls").stdout
    exported = kc_json(root, "export", str(tmp_path / "c.tar"), code=1)
    assert exported["entries"] == 1 and [s["key"] for s in exported["skipped"]] == [key]
    repaired = kc_json(root, "verify", "--repair")
    assert repaired["clean"] is True
    after = kc_json(root, "verify")
    assert after["clean"] is True and after["entries_ok"] == 1
    assert Store(root).read(good.key) is not None


# -- entries of older versions ---------------------------------------------------------------------
def _as_written_by_an_older_version(root: Path, key: str) -> None:
    path = root / f"{key}.json"
    doc = json.loads(path.read_text())
    doc["format"] = 1
    del doc["entry_digest"]
    path.write_text(json.dumps(doc, sort_keys=True, separators=(",", ":")))


def test_an_entry_of_an_older_version_is_a_miss_then_replaced(root):
    key = key_of("older")
    Store(root).put(key, "cubin", elf_image(b"old build"), KERNEL_META)
    _as_written_by_an_older_version(root, key)
    cache = kernelcache.Cache(root, readonly_roots=(), remote="")
    before = stats.process_stats()
    assert cache.get(key, "cubin") is None
    after = stats.process_stats()
    assert after["corrupt"] == before["corrupt"] and after["misses"] == before["misses"] + 1
    assert _quarantined(root) == []  # not an attack: left for the rebuild to replace
    new = elf_image(b"new build")  # whole: verify finds the root clean
    art = cache.get_or_create(key, "cubin", lambda: (new, KERNEL_META))
    assert art.data == new and art.path is not None
    assert "entry_digest" in json.loads((root / f"{key}.json").read_text())
    assert cache.get(key, "cubin").data == new
    assert kc_json(root, "verify")["clean"] is True


def test_replacing_an_entry_of_an_older_version_does_not_list_the_root(root, monkeypatch):
    """After an upgrade every rebuilt entry replaces an older one: each must touch only its
    own files (a listing per put would make a cold start on a big root quadratic)."""
    keys = [key_of(f"older-{i}") for i in range(5)]
    for key in keys:
        Store(root).put(key, "cubin", elf_image(b"old build"), KERNEL_META)
        _as_written_by_an_older_version(root, key)
    listings = []
    real_scandir = os.scandir

    def counting_scandir(path=".", *a, **kw):
        if not isinstance(path, int) and os.fspath(path) == str(root):
            listings.append(path)
        return real_scandir(path, *a, **kw)

    monkeypatch.setattr(os, "scandir", counting_scandir)
    store = Store(root)
    new = elf_image(b"new build")
    for key in keys:
        assert store.put(key, "cubin", new, KERNEL_META).data == new
    assert listings == []
    assert sorted(p.name for p in root.glob("*.cubin")) == sorted(f"{k}.cubin" for k in keys)


def test_verify_reports_entries_of_older_versions_and_repair_removes_them(root):
    keep = put(root, "current", size=300)  # a whole cubin
    key = key_of("older-verify")
    Store(root).put(key, "cubin", PAYLOAD, KERNEL_META)
    _as_written_by_an_older_version(root, key)
    doc = kc_json(root, "verify", code=1)
    assert [(p["kind"], p["path"]) for p in doc["problems"]] == [("outdated", f"{key}.json")]
    assert kc_json(root, "stats")["problems"] == 1
    repaired = kc_json(root, "verify", "--repair")
    assert repaired["clean"] is True
    assert not (root / f"{key}.json").exists() and not (root / f"{key}.cubin").exists()
    assert _quarantined(root) == []
    assert Store(root).read(keep.key) is not None


def test_prune_removes_entries_of_older_versions(root):
    key = key_of("older-prune")
    Store(root).put(key, "cubin", PAYLOAD, KERNEL_META)
    _as_written_by_an_older_version(root, key)
    doc = kc_json(root, "prune")
    assert [a["action"] for a in doc["plan"]["actions"]] == ["delete-entry"]
    assert not (root / f"{key}.json").exists()


# -- import: validate everything, then publish ---------------------------------------------------
def _bundle(path: Path, docs: list[dict], blobs: list[bytes], **manifest_extra: Any) -> Path:
    return write_bundle(path, blobs, entries=docs, **manifest_extra)


def _four_docs() -> tuple[list[dict], list[bytes]]:
    keys = sorted(key_of("bundle-entry", i) for i in range(4))
    blobs = [PAYLOAD + bytes([i]) for i in range(4)]
    docs = [make_metadata(k, "cubin", b, KERNEL_META) for k, b in zip(keys, blobs, strict=True)]
    return docs, blobs


@pytest.mark.parametrize("case", sorted(ODD_VALUES))
def test_import_with_an_odd_fourth_entry_publishes_nothing(tmp_path, case):
    field, value = ODD_VALUES[case]
    docs, blobs = _four_docs()
    docs[3] = {**docs[3], field: value}
    bundle = _bundle(tmp_path / "b.tar", docs, blobs)
    dest = tmp_path / "dest"
    dry = kc(dest, "import", str(bundle), "--dry-run")
    real = kc(dest, "import", str(bundle))
    for proc in (dry, real):
        assert proc.returncode == 2, proc.stdout + proc.stderr  # refused whole: nothing done
        assert docs[3]["key"] in proc.stderr and field in proc.stderr, proc.stderr
        assert "nothing was imported" in proc.stderr and "Traceback" not in proc.stderr
    assert not list(dest.glob("*.json")) if dest.exists() else True


def test_import_failure_while_publishing_rolls_back(tmp_path):
    """The bundle is damaged in place after the verifying pass, while the publishing pass has
    published three entries: the fourth fails its digest, the three are removed again, and
    the error says nothing was imported."""
    keys = sorted(key_of("rollback", i) for i in range(4))
    blobs = [elf_image(bytes([i]) * (1 << 20)) for i in range(4)]  # far apart in the archive
    docs = [make_metadata(k, "cubin", b, KERNEL_META) for k, b in zip(keys, blobs, strict=True)]
    bundle = _bundle(tmp_path / "b.tar", docs, blobs)
    with tarfile.open(bundle) as tar:
        last = tar.getmember(f"entries/{keys[3]}.cubin").offset_data
    dest = tmp_path / "dest"
    seen: list[int] = []

    def damage_at_the_fourth(n: int) -> None:
        seen.append(n)
        if len(seen) == 3:  # before the fourth member is read: another writer changes it
            with open(bundle, "r+b") as f:
                f.seek(last + 500_000)  # past any read-ahead
                f.write(b"damage")

    with pytest.raises(BundleError, match="changed while being imported") as info:
        import_bundle(Store(dest), str(bundle), progress=damage_at_the_fourth)
    assert info.value.imported == 0
    assert not list(dest.glob("*.json")) and not list(dest.glob("*.cubin"))


def test_import_keeps_entries_that_were_already_there_when_it_rolls_back(tmp_path):
    docs, blobs = _four_docs()
    dest = tmp_path / "dest"
    Store(dest).put(docs[0]["key"], "cubin", blobs[0], KERNEL_META)
    docs[3] = {**docs[3], "producer": 5}
    bundle = _bundle(tmp_path / "b.tar", docs, blobs)
    with pytest.raises(BundleError, match="producer"):
        import_bundle(Store(dest), str(bundle))
    assert sorted(p.name for p in dest.glob("*.json")) == [f"{docs[0]['key']}.json"]


def test_import_of_a_fifo_does_not_hang(tmp_path):
    fifo = tmp_path / "bundle.tar"
    os.mkfifo(fifo)
    started = time.monotonic()
    proc = kc(tmp_path / "dest", "import", str(fifo), timeout=60)
    assert time.monotonic() - started < 30
    assert proc.returncode == 2 and "not a regular file" in proc.stderr, proc.stderr
    dry = kc(tmp_path / "dest", "import", str(fifo), "--dry-run", timeout=60)
    assert dry.returncode == 2 and "not a regular file" in dry.stderr


def test_a_manifest_larger_than_its_entries_justify_is_refused_unread(tmp_path):
    """One 16 KiB entry and a 3 MiB manifest: refused from the tar header, before reading it."""
    docs, blobs = _four_docs()
    bundle = _bundle(tmp_path / "b.tar", docs[:1], blobs[:1], padding="x" * (3 << 20))
    with pytest.raises(BundleError, match=r"manifest\.json.*oversized"):
        import_bundle(Store(tmp_path / "dest"), str(bundle), dry_run=True)


def test_manifest_entries_are_checked_against_the_schema_and_digest(tmp_path):
    docs, blobs = _four_docs()
    docs[2] = {**docs[2], "num_warps": 8}  # a launch field changed, entry digest not updated
    bundle = _bundle(tmp_path / "b.tar", docs, blobs)
    with pytest.raises(BundleError, match=f"{docs[2]['key']}.*digest"):
        import_bundle(Store(tmp_path / "dest"), str(bundle), dry_run=True)


def test_a_bundle_of_an_older_version_is_refused_saying_what_to_do(tmp_path):
    """Bundles of entry format 1 (digests that do not cover the covers list, or none): the
    importer would have to rebuild their documents with its own covered fields, which no
    reader does; it refuses them, naming the format and the remedy, and writes nothing."""
    docs, blobs = _four_docs()
    for doc in docs:
        doc["format"] = 1
        del doc["entry_digest"]
    bundle = _bundle(tmp_path / "b.tar", docs, blobs, compatibility={"entry_format": 1})
    with pytest.raises(BundleError, match=r"entry format 1 .* export the entries again"):
        import_bundle(Store(tmp_path / "dest"), str(bundle))
    assert not (tmp_path / "dest").exists() or not any((tmp_path / "dest").glob("*.json"))


# -- the command's last resort --------------------------------------------------------------------
def test_unexpected_errors_point_at_the_flag_that_shows_the_traceback(
    tmp_path, monkeypatch, capsys
):
    from kernelcache.cli import app, statistics

    def broken(args: Any, out: Any) -> int:
        raise RuntimeError("a bug")

    monkeypatch.setattr(statistics, "cmd_stats", broken)
    assert app.main(["--root", str(tmp_path), "stats"]) == 1
    err = capsys.readouterr().err
    assert "RuntimeError: a bug" in err and "rerun with -vv" in err


def test_digest_is_still_the_artifact_digest(root):
    art = Store(root).put(key_of("digest"), "cubin", PAYLOAD, KERNEL_META)
    assert art.meta["digest"] == digest(PAYLOAD)
    assert art.meta["entry_digest"].startswith("xxh3_128:") and art.meta["format"] == FORMAT_VERSION


def test_a_planted_scan_index_with_odd_values_is_ignored(tmp_path):
    """The scan index is a cache of what metadata said: one whose rows hold values the schema
    refuses (a lone surrogate, Infinity) is ignored and rebuilt, never shown."""
    root = tmp_path / "cache"
    art = put(root, "kern", size=300)
    assert kc(root, "stats").returncode == 0
    index = root / ".stats" / "index.json"
    head, _, body = index.read_bytes().partition(b"\n")
    doc = json.loads(body)
    doc["strings"] = ["\ud800" if s == "kern" else s for s in doc["strings"]]
    doc["created"] = [math.inf]
    index.write_bytes(head + b"\n" + json.dumps(doc).encode())
    for args in (["ls"], ["ls", "--sort", "age"], ["stats"]):
        proc = kc(root, *args)
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    listed = kc_json(root, "ls")["entries"]
    assert [(e["key"], e["kernel"]) for e in listed] == [(art.key, "kern")]
    assert listed[0]["created"] == art.meta["created"]


def test_a_forged_scan_index_with_the_listings_signature_is_not_trusted(tmp_path):
    """The index's header names the listing it was made from; anyone who can list the root can
    compute that, so an index that hides entries (or names ones that are not there, or keys
    that are not keys) is never used, whatever its header says."""
    root = tmp_path / "cache"
    arts = [put(root, f"kern{i}", size=300) for i in range(3)]  # whole cubins
    for _ in range(2):  # the second scan sees .stats/ and signs the listing it then has
        assert kc(root, "stats").returncode == 0
    index = root / ".stats" / "index.json"
    head, _, body = index.read_bytes().partition(b"\n")
    doc = json.loads(body)
    columns = ("inode", "ext", "size", "meta_size", "kernel", "target", "created", "kind")
    hidden = {**doc, "keys": "", **{c: [] for c in columns}}  # "this root is empty"
    index.write_bytes(head + b"\n" + json.dumps(hidden).encode())
    checked = kc_json(root, "verify")
    assert checked["entries_checked"] == 3 and checked["clean"]
    assert sorted(e["key"] for e in kc_json(root, "ls")["entries"]) == sorted(a.key for a in arts)
    bad_key = {**doc, "keys": doc["keys"].replace(arts[0].key, "../" + arts[0].key[3:], 1)}
    index.write_bytes(head + b"\n" + json.dumps(bad_key).encode())
    assert kc_json(root, "stats")["entries"] == 3
