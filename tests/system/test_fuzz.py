"""Property tests (hypothesis) of every parser of outside input: arbitrary and mutated bytes
never raise anything but the documented errors.

* the metadata parser (``parse_metadata``) and ``Store.read``/``Cache.get`` on arbitrary bytes
  in ``<key>.json`` (beside arbitrary artifact bytes): a result, never an exception; whatever
  is served matches its recorded size and digest;
* Redis values (``decode_value``), the scan index, statistics logs and summary, soft-lock
  records: a result or a reported problem, never an exception;
* the bundle reader (``import_bundle``) on arbitrary bytes and on byte-level mutations of real
  bundles (tar and tar+zstd): ``BundleError`` or a verified import, nothing else;
* the manifest reader (``bridge.warm.read_manifest``) on arbitrary lines (known failures,
  reported: see the test).
"""

from __future__ import annotations

import io
import json
import os
import tarfile
import tempfile
from pathlib import Path

import pytest
import zstandard
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from support import REPO, metadata_keys

import kernelcache
from kernelcache import bundle, stats
from kernelcache.maintenance.index import INDEX_NAME
from kernelcache.maintenance.inventory import summarize
from kernelcache.maintenance.scan import scan
from kernelcache.problem import Problem
from kernelcache.remote import decode_value, encode_value
from kernelcache.stats import read_summary
from kernelcache.store import Artifact, Store, digest, make_metadata, parse_metadata
from kernelcache.store.locks import read_soft_record, soft_lock_stale

KEY = "5e" * 32
FUZZ = settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=12),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


def _valid_doc(data: bytes = b"kernel bytes") -> dict:
    return make_metadata(KEY, "bin", data, {"name": "k", "target": "cuda:90", "created": 1.0})


@st.composite
def metadata_bytes(draw) -> bytes:
    """Arbitrary bytes, arbitrary JSON, or a valid document with fields replaced or removed."""
    kind = draw(st.sampled_from(["bytes", "json", "mutated", "spliced"]))
    if kind == "bytes":
        return draw(st.binary(max_size=300))
    if kind == "json":
        return json.dumps(draw(json_values)).encode()
    doc = _valid_doc()
    if kind == "mutated":
        for name in draw(st.lists(st.sampled_from(sorted(doc)), max_size=3)):
            if draw(st.booleans()):
                doc[name] = draw(json_values)
            else:
                doc.pop(name, None)
        return json.dumps(doc).encode()
    raw = bytearray(json.dumps(doc).encode())
    at = draw(st.integers(0, len(raw)))
    return bytes(raw[:at]) + draw(st.binary(max_size=20)) + bytes(raw[at:])


@FUZZ
@given(raw=metadata_bytes())
@example(raw=b"[" * 100_000)
@example(raw=b'{"format": 1, "key": "' + KEY.encode() + b'", "ext": "bin", "size": 1e400}')
def test_parse_metadata_returns_a_document_or_a_reason(raw):
    result = parse_metadata(raw, KEY)
    assert isinstance(result, (dict, Problem))
    if isinstance(result, dict):
        assert result["key"] == KEY and isinstance(result["size"], int)


@FUZZ
@given(raw=metadata_bytes(), data=st.binary(max_size=64) | st.just(b"kernel bytes"))
@example(raw=json.dumps(_valid_doc()).encode(), data=b"kernel bytes")
def test_store_read_and_cache_get_on_arbitrary_metadata(raw, data):
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, f"{KEY}.json").write_bytes(raw)
        Path(tmp, f"{KEY}.bin").write_bytes(data)
        result = Store(tmp).read(KEY)
        assert result is None or isinstance(result, (Artifact, Problem))
        if isinstance(result, Artifact):
            assert result.data == data and result.meta["digest"] == digest(data)
        got = kernelcache.Cache(tmp, readonly_roots=()).get(KEY, "bin")
        assert got is None or (got.data == data and got.meta["size"] == len(data))


@FUZZ
@given(
    raw=st.binary(max_size=200)
    | metadata_bytes().map(lambda m: b"KCR1" + len(m).to_bytes(4, "big") + m)
)
def test_redis_values_decode_or_say_why(raw):
    result = decode_value(raw, KEY)
    assert isinstance(result, (tuple, Problem))


@FUZZ
@given(cut=st.integers(0, 200), flip=st.integers(0, 10_000), byte=st.integers(1, 255))
def test_mutated_redis_values_never_pass_verification_wrongly(cut, flip, byte):
    data = b"kernel bytes" * 10
    raw = bytearray(encode_value(_valid_doc(data), data))
    raw[flip % len(raw)] ^= byte
    raw = bytes(raw[: len(raw) - cut])
    result = decode_value(raw, KEY)
    if isinstance(result, tuple):
        assert digest(result[0]) == result[1]["digest"] and len(result[0]) == result[1]["size"]


# -- files of the root's housekeeping directories ----------------------------------------------
@pytest.fixture(scope="module")
def populated(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("fuzz") / "cache"
    store = Store(root)
    for i in range(3):
        store.put(f"{i:02x}" * 32, "bin", b"k%d" % i, {"name": f"k{i}"})
    return root


@FUZZ
@given(raw=st.binary(max_size=400) | json_values.map(lambda v: json.dumps(v).encode()))
@example(raw=b"[" * 100_000)
def test_scan_index_is_a_cache_whatever_it_holds(populated, raw):
    index = populated / ".stats" / INDEX_NAME
    index.parent.mkdir(exist_ok=True)
    index.write_bytes(raw + b"\n" + raw)
    found = scan(str(populated), update_index=False)
    assert sorted(e.key for e in found.entries) == [f"{i:02x}" * 32 for i in range(3)]
    assert summarize(str(populated)).entries == 3


@FUZZ
@given(
    lines=st.lists(
        st.binary(max_size=80) | json_values.map(lambda v: json.dumps(v).encode()), max_size=5
    )
)
@example(lines=[b"[" * 100_000])
def test_statistics_logs_and_summary_are_read_or_reported(populated, lines):
    stats_dir = populated / ".stats"
    stats_dir.mkdir(exist_ok=True)
    log = stats_dir / "fuzzhost-1-00000000.jsonl"
    log.write_bytes(b"\n".join(lines))
    (stats_dir / "summary.jsonl").write_bytes(b"\n".join(lines))
    totals, processes, _ = stats.read_logs(str(populated))
    assert processes >= 1 and all(isinstance(v, (int, float)) for v in totals.values())
    assert read_summary(str(populated)) is None or isinstance(read_summary(str(populated)), dict)


@FUZZ
@given(raw=st.binary(max_size=300) | json_values.map(lambda v: json.dumps(v).encode()))
@example(raw=b"[" * 4096)
def test_soft_lock_records_are_read_or_ignored(populated, raw):
    locks = populated / ".locks"
    locks.mkdir(exist_ok=True)
    (locks / "fuzz.softlock").write_bytes(raw)
    dfd = os.open(locks, os.O_RDONLY | os.O_DIRECTORY)
    try:
        record = read_soft_record(dfd, "fuzz.softlock")
    finally:
        os.close(dfd)
    assert isinstance(record, dict)
    assert soft_lock_stale(record, 300) in (True, False)


# -- bundles --------------------------------------------------------------------------------------
def _real_bundle(compress: bool) -> bytes:
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp, "src"))
        for i in range(3):
            store.put(f"{i:02x}" * 32, "bin", b"code %d " % i * 50, {"name": f"k{i}"})
        entries = scan(str(Path(tmp, "src"))).entries
        path = Path(tmp, "b.tar.zst" if compress else "b.tar")
        bundle.export_bundle(str(Path(tmp, "src")), entries, str(path))
        return path.read_bytes()


PLAIN, ZSTD = _real_bundle(False), _real_bundle(True)


@st.composite
def mutated_bundles(draw) -> bytes:
    kind = draw(st.sampled_from(["arbitrary", "plain", "zstd", "zstd-inner"]))
    if kind == "arbitrary":
        return draw(st.binary(max_size=2000))
    raw = bytearray(PLAIN if kind in ("plain", "zstd-inner") else ZSTD)
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "cut", "insert", "zero-block"]))
        at = draw(st.integers(0, max(len(raw) - 1, 0)))
        if op == "flip" and raw:
            raw[at] ^= draw(st.integers(1, 255))
        elif op == "cut":
            del raw[at : at + draw(st.integers(1, 600))]
        elif op == "insert":
            raw[at:at] = draw(st.binary(min_size=1, max_size=40))
        else:
            raw[at : at + 512] = bytes(min(512, len(raw) - at))
    if kind == "zstd-inner":  # damaged tar inside a valid zstd frame
        return zstandard.ZstdCompressor().compress(bytes(raw))
    return bytes(raw)


@settings(FUZZ, max_examples=250)
@given(raw=mutated_bundles())
@example(raw=PLAIN)
@example(raw=ZSTD)
def test_bundle_reader_rejects_or_imports_verified_entries(raw):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp, "in.tar")
        path.write_bytes(raw)
        dest = Path(tmp, "dest")
        try:
            result = bundle.import_bundle(Store(dest), str(path))
        except bundle.BundleError as e:
            assert e.imported == 0  # rejected by the first pass: nothing written
            assert not dest.exists() or not [p for p in dest.iterdir() if p.suffix == ".json"]
            return
        reader = Store(dest)
        for key in metadata_keys(dest):
            assert isinstance(reader.read(key), Artifact), key
        assert result.imported + result.present + len(result.conflicts) == result.entries


def test_every_tar_member_kind_written_by_tarfile_is_handled():
    """A bundle made by another tar writer: long names as GNU or PAX records."""
    for fmt in (tarfile.GNU_FORMAT, tarfile.PAX_FORMAT):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=fmt) as tar:
            info = tarfile.TarInfo("entries/" + "ab" * 64 + ".bin")  # a 128-digit key
            info.size = 3
            tar.addfile(info, io.BytesIO(b"abc"))
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp, "b.tar")
            path.write_bytes(buf.getvalue())
            with pytest.raises(bundle.BundleError, match=r"manifest"):
                bundle.import_bundle(Store(Path(tmp, "dest")), str(path))


# -- the manifest reader (bridge.warm) -------------------------------------------
@settings(max_examples=60, deadline=None)
@given(lines=st.lists(st.text(max_size=60) | json_values.map(json.dumps), min_size=1, max_size=4))
@example(lines=["[" * 5000])
@example(lines=["[1, 2]"])
@example(lines=['{"kernel": "examples.kernels:add_kernel"}'])
def test_manifest_reader_raises_only_value_errors(lines):
    from bridge import warm

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp, "manifest.jsonl")
        path.write_text("\n".join(lines), encoding="utf-8")
        try:
            records = warm.read_manifest(path)
        except ValueError:
            return  # a bad manifest, said clearly
        assert isinstance(records, list)


_RECORD_FIELDS = ("producer", "kwargs", "source", "target_params", "config", "importable")
_RECORD_FIELDS += ("variant", "problem", "options", "arguments", "kernel", "version")


@settings(max_examples=150, deadline=None)
@given(fields=st.dictionaries(st.sampled_from(_RECORD_FIELDS), json_values, max_size=3))
def test_manifest_loader_reports_any_field_of_a_record(fields):
    """A record with arbitrary values in any of its fields is loaded or reported as a bad
    record of its line; nothing else happens."""
    from bridge import warm

    good = json.loads((REPO / "examples" / "manifest.jsonl").read_text().splitlines()[0])
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp, "manifest.jsonl")
        path.write_text(json.dumps(good) + "\n" + json.dumps({**good, **fields}) + "\n")
        loaded = warm.load_manifest(path)
        assert loaded.records + len(loaded.failures) == 2
        assert all(f.kind == "bad-record" and f.lines == (2,) for f in loaded.failures)
