"""The bridge's entry kinds (:class:`bridge.entries.kinds.EntryKind`, each declared by the module
of ``bridge.entries`` that owns its documents) store and look up every entry under the key,
extension, counting, wait and metadata they always had: a change to any of them orphans every
stored entry of that kind, so each is pinned here for one owner key, both as each kind declares
it and as the modules that store entries call the cache. Every declared kind is pinned here (a
new one fails until it is), and each takes an extension no other kind has.

The expected values below were computed once from the code before the kinds were one type;
they never change with a refactoring, only with a deliberate change of the on-disk format.
"""

from __future__ import annotations

import copy
import hashlib
import importlib
import json
import pickle
import pkgutil
import zlib
from types import SimpleNamespace
from typing import Any

import pytest

import bridge.entries
import kernelcache
from bridge.cli import tune
from bridge.compile import fetch
from bridge.entries import decisions, failures, kernels, kinds, lowerings, memos, samples
from bridge.entries.decisions import Decision
from bridge.entries.lowerings import Lowered
from bridge.entries.samples import Sample

#: the key every entry below belongs to (a kernel, lowering or decision key)
OWNER = "0123456789abcdef" * 4
#: another key, for the variants of an autotuned call
OTHER = "fedcba9876543210" * 4

#: the key of each kind's entry of OWNER (a lowering's and a sample's: of their first state)
PTX_KEY = "0123456789abcdefc7254e9be5a4bd9ac7c92ff51e318073735ab5bc898103ed"
FAILURE_KEY = "0123456789abcdef6132bf4eae71764a45b6d1a9381cf45fd247977107a546de"
LOWERING_KEY = "0123456789abcdef7509a12aa5ba1f150ee64e1c36410d54143318c5e7bc676e"
LOWERING_1_KEY = "0123456789abcdefd397f144748a1e04b78c442a3fe368e8998ac0385e3d41c4"
VARIANTS_KEY = "0123456789abcdef66550a769fd47ef5b5eaa6f8c758be7f98ec178afbd64ced"
PROGRAM_KEY = "0123456789abcdefb3b8a6ae1f9a55a8822e00d1506d816bb917004a49e139b6"
SAMPLE_0_KEY = "0123456789abcdefad557da2cab821dd1655a48df6f974849e677e52a8f52ce7"
SAMPLE_1_KEY = "0123456789abcdef27f679582f38e84d9f6520675be220f5be7eafc79a466793"
#: (since the memo key is the digest of named steps, kernelcache.keys.digest_of: a memo stored
#: before is recomputed once)
MEMO_KEY = "c83491f5fad2bfa5e4ba919856134af822c32e99974ef9d284aaa4c1f05423d7"


#: each kind as declared: its extension, the key of OWNER's entry (of its first part, with
#: that part; a memo's owner is its own key), how a lookup is counted, how long a put waits,
#: and whether it is usually absent
DECLARED = {
    "PTX": ("ptx", None, PTX_KEY, "companion", None, False),
    "FAILURE": ("failure", None, FAILURE_KEY, False, None, True),
    "LOWERING": ("lowering", lowerings.EVERY, LOWERING_KEY, False, 0, False),
    "VARIANTS": ("variants", None, VARIANTS_KEY, False, 0, False),
    "PROGRAM": ("program", None, PROGRAM_KEY, False, 0, False),
    "DECISION": ("decision", None, OWNER, False, None, True),
    "SAMPLE": ("sample", 0, SAMPLE_0_KEY, False, None, True),
    "MEMO": ("ident", None, OWNER, "memo", None, True),
    "KERNELS[cubin]": ("cubin", None, OWNER, True, None, False),
    "KERNELS[hsaco]": ("hsaco", None, OWNER, True, None, False),
}


def named_kinds() -> dict[str, kinds.EntryKind]:
    """Every declared kind, by the name its module declares it under (``PTX = EntryKind(...)``)."""
    declared = kinds.declared_kinds()
    named = {}
    for info in pkgutil.iter_modules(bridge.entries.__path__, "bridge.entries."):
        for name, value in vars(importlib.import_module(info.name)).items():
            if isinstance(value, kinds.EntryKind):
                named[name] = value
    for ext, kind in kernels.KERNELS.items():  # (one per vendor's machine code)
        named[f"KERNELS[{ext}]"] = kind
    assert set(named.values()) == set(declared), "declare each kind in a module of entries/"
    return named


def test_every_kind_declares_the_key_extension_counting_wait_and_sparseness_it_always_had():
    named, declared = named_kinds(), {}
    for name, (_, part, *_) in DECLARED.items():
        kind = named[name]
        got = kind.ext, part, kind.key(OWNER, part), kind.counted, kind.wait, kind.sparse
        declared[name] = got
    assert declared == DECLARED
    tests_own = {k for ext, k in kernels.KERNELS.items() if f"KERNELS[{ext}]" not in DECLARED}
    pinned = {named[name] for name in DECLARED}  # (tests_own: of vendors tests register)
    assert set(kinds.declared_kinds()) - tests_own == pinned, "pin a new kind here"
    assert lowerings.LOWERING.key(OWNER, "1") == LOWERING_1_KEY
    assert samples.SAMPLE.key(OWNER, 1) == SAMPLE_1_KEY
    assert memos.memo_key("ptxas", "fingerprint") == MEMO_KEY
    assert lowerings.LOWERING.corrupt == "a lowering entry that does not decode"
    assert lowerings.PROGRAM.corrupt == "a program entry that does not decode"


def test_a_key_takes_a_part_exactly_where_its_kind_has_several_entries_per_owner():
    with pytest.raises(TypeError, match="needs a part"):
        lowerings.LOWERING.key(OWNER)
    with pytest.raises(TypeError, match="takes no part"):
        kernels.PTX.key(OWNER, "1")
    with pytest.raises(TypeError, match="takes no part"):
        decisions.DECISION.key(OWNER, 0)


class Recorder:
    """A cache that records every call the bridge makes of it, then makes it: what each call
    means (a lookup's counting and a put's wait with the cache's defaults filled in), not how
    it is spelled."""

    def __init__(self, cache: kernelcache.Cache) -> None:
        self.cache = cache
        self.calls: list[tuple[Any, ...]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.cache, name)

    def get(self, key, ext, **kw):
        self.calls.append(("get", key, ext, kw.get("counted", True)))
        return self.cache.get(key, ext, **kw)

    def put(self, key, ext, data, meta, **kw):
        self.calls.append(("put", key, ext, dict(meta), kw.get("wait")))
        return self.cache.put(key, ext, data, meta, **kw)

    def replace(self, key, ext, data, meta, **kw):
        self.calls.append(("replace", key, ext, dict(meta), kw.get("wait")))
        return self.cache.replace(key, ext, data, meta, **kw)

    def quarantine(self, art, reason):
        self.calls.append(("quarantine", art.key, art.ext, reason))
        return self.cache.quarantine(art, reason)

    def _built(self, key, ext, build):
        def run():
            data, meta = build()
            self.calls.append(("built", key, ext, dict(meta)))
            return data, meta

        return run

    def get_or_create(self, key, ext, build):
        self.calls.append(("get_or_create", key, ext))
        return self.cache.get_or_create(key, ext, self._built(key, ext, build))

    def get_or_create_many(self, items):
        self.calls.append(("get_or_create_many", [(i.key, i.ext) for i in items]))
        return self.cache.get_or_create_many(
            [kernelcache.BuildItem(i.key, i.ext, self._built(i.key, i.ext, i.build)) for i in items]
        )

    def rebuild(self, key, ext, build, *, stale):
        self.calls.append(("rebuild", key, ext, stale.key))
        return self.cache.rebuild(key, ext, self._built(key, ext, build), stale=stale)

    def take(self) -> list[tuple[Any, ...]]:
        calls, self.calls = self.calls, []
        return calls


@pytest.fixture
def cache(tmp_path):
    return Recorder(kernelcache.Cache(tmp_path / "root", readonly_roots=(), remote=""))


ABOUT = {"name": "k", "kernel": "m:k", "target": "cuda:90"}
CALL = SimpleNamespace(parts=SimpleNamespace(name="k", qualname="m:k"))
PTX = ".version 8.4\n.target sm_90\n.visible .entry k()\n{\n\tret;\n}\n"
LOWERING_META = {"kind": "lowering", "name": "k", "kernel": "m:k", "target": "cuda:90"}


def test_a_kernels_ptx_is_stored_and_read_as_a_companion(cache):
    kernels.store_ptx(cache, OWNER, PTX, {**ABOUT, "num_warps": 4})
    digest = hashlib.sha256(PTX.encode()).hexdigest()
    art = SimpleNamespace(data=b"\x7fELF", meta={**ABOUT, "ptx_sha256": digest})
    request = SimpleNamespace(key=OWNER, ext="cubin", usable=None, need_ptx=True)
    assert fetch._paired(cache, request, art, []).ptx == PTX
    assert cache.take() == [
        ("put", PTX_KEY, "ptx", {"kind": "ptx", "of": OWNER, **ABOUT}, None),
        ("get", PTX_KEY, "ptx", "companion"),
    ]


def test_a_failure_is_remembered_and_looked_up_uncounted(cache):
    failures.remember(cache, OWNER, "out of resources", {**ABOUT, "language": None})
    assert failures.remembered(cache, OWNER) == "out of resources"
    assert cache.take() == [
        ("put", FAILURE_KEY, "failure", {**ABOUT, "kind": "failure", "of": OWNER}, None),
        ("get", FAILURE_KEY, "failure", False),
    ]


def test_a_memo_is_stored_under_its_label_and_fingerprint_and_counted_as_a_memo(cache):
    memos.remember(cache, "ptxas", "fingerprint", "12.8")
    assert memos.lookup(cache, "ptxas", "fingerprint", str.isascii) == "12.8"
    assert cache.take() == [
        ("put", MEMO_KEY, "ident", {"kind": "identity", "name": "ptxas"}, None),
        ("get", MEMO_KEY, "ident", "memo"),
    ]


def test_lowerings_and_their_variants_never_wait_and_a_corrupt_one_is_quarantined(cache):
    done = Lowered(zlib.compress(b"opaque"), "inline", True, (0,))
    lowerings.store(cache, OWNER, CALL, "cuda:90", lowerings.EVERY, done, [OWNER, OTHER])
    lowerings.store(cache, OWNER, CALL, "cuda:90", "1", Lowered(b"cut", "inline", True), [OWNER])
    assert lowerings.lowered(cache, OWNER, lowerings.EVERY) == done
    assert lowerings.variant_keys(cache, OWNER) == [OWNER, OTHER]
    assert lowerings.lowered(cache, OWNER, "1") is None
    assert cache.take() == [
        ("put", VARIANTS_KEY, "variants", LOWERING_META, 0),
        ("put", LOWERING_KEY, "lowering", LOWERING_META, 0),
        ("put", LOWERING_1_KEY, "lowering", LOWERING_META, 0),
        ("get", LOWERING_KEY, "lowering", False),
        ("get", VARIANTS_KEY, "variants", False),
        ("get", LOWERING_1_KEY, "lowering", False),
        ("quarantine", LOWERING_1_KEY, "lowering", "a lowering entry that does not decode"),
    ]


def test_a_program_is_stored_under_its_first_calls_key_and_a_corrupt_one_is_quarantined(cache):
    done = Lowered(zlib.compress(b"opaque"), "inline", False, (0,))
    program = lowerings.Program(cache)
    assert program.lowered(OWNER, lowerings.EVERY) is None
    program.note(lowerings.Item(OWNER, lowerings.EVERY, None, done), CALL, "cuda:90")
    program.close()
    assert lowerings.Program(cache).lowered(OWNER, lowerings.EVERY) == done
    cache.replace(PROGRAM_KEY, "program", b"KCP1 not a program", LOWERING_META)
    assert lowerings.Program(cache).lowered(OWNER, lowerings.EVERY) is None
    assert cache.take() == [
        ("get", PROGRAM_KEY, "program", False),
        ("get", LOWERING_KEY, "lowering", False),
        ("put", PROGRAM_KEY, "program", LOWERING_META, 0),
        ("get", PROGRAM_KEY, "program", False),
        ("replace", PROGRAM_KEY, "program", LOWERING_META, None),
        ("get", PROGRAM_KEY, "program", False),
        ("quarantine", PROGRAM_KEY, "program", "a program entry that does not decode"),
        ("get", LOWERING_KEY, "lowering", False),
    ]


def test_a_decision_is_stored_under_its_own_key_and_looked_up_uncounted(cache):
    made = Decision("m:k", "cuda:90", "*", (OWNER, OTHER), ("a", "b"), 1, pinned=True)
    tune._store(cache, OWNER, made)
    assert decisions.find(cache, [OWNER], [OWNER, OTHER]) == made
    meta = {"kind": "decision", "name": "k", "kernel": "m:k", "target": "cuda:90"}
    assert cache.take() == [
        ("replace", OWNER, "decision", meta, None),
        ("get", OWNER, "decision", False),
    ]


@pytest.mark.parametrize("reasons", [None, {1: "out of resources"}])
def test_a_decision_copies_and_pickles_whole(reasons):
    more = {} if reasons is None else {"reasons": reasons}
    made = Decision("m:k", "cuda:90", "*", (OWNER, OTHER), ("a", "b"), 1, **more)
    again = pickle.loads(pickle.dumps(made))
    assert again == made and type(again) is Decision and copy.deepcopy(made) == made
    assert dict(again.reasons) == (reasons or {})


def test_samples_are_built_once_under_their_decisions_key_and_rebuilt_when_unusable(cache):
    cache.put(SAMPLE_1_KEY, "sample", json.dumps({"format": 1}).encode(), {"kind": "sample"})
    cache.take()

    def screen(i: int) -> Sample:
        return Sample(i, 1e-3, 10, 12, 0.01, "node/gpu0")

    found = samples.gather(cache, OWNER, [OWNER, OTHER], "G", [0, 1], screen)
    assert [s.index for s in found] == [0, 1]
    assert cache.take() == [
        ("get_or_create_many", [(SAMPLE_0_KEY, "sample"), (SAMPLE_1_KEY, "sample")]),
        ("built", SAMPLE_0_KEY, "sample", {"kind": "sample", "name": "sample 0"}),
        ("rebuild", SAMPLE_1_KEY, "sample", SAMPLE_1_KEY),
        ("built", SAMPLE_1_KEY, "sample", {"kind": "sample", "name": "sample 1"}),
    ]


def test_failures_decisions_samples_and_memos_are_declared_usually_absent():
    from kernelcache.keys import SPARSE_EXTS

    kinds.declared_kinds()
    assert {"failure", "decision", "sample", "ident"} <= SPARSE_EXTS
    assert not {"ptx", "lowering", "variants", "program"} & SPARSE_EXTS


@pytest.fixture
def registry(monkeypatch):
    """The registry of kinds and the remote tiers' sparse extensions, as they are now; what a
    test declares is forgotten after it."""
    from kernelcache import keys

    kinds.declared_kinds()
    monkeypatch.setattr(kinds, "_BY_EXT", dict(kinds._BY_EXT))
    monkeypatch.setattr(keys, "SPARSE_EXTS", set(keys.SPARSE_EXTS))
    return keys


def test_a_kind_is_declared_when_made_and_a_sparse_one_to_the_remote_tiers(registry):
    dense = kinds.EntryKind("test-dense", role="test-dense")
    sparse = kinds.EntryKind("test-sparse", role="test-sparse", sparse=True)
    assert {dense, sparse} <= set(kinds.declared_kinds())
    assert "test-sparse" in registry.SPARSE_EXTS and "test-dense" not in registry.SPARSE_EXTS


@pytest.mark.parametrize("ext", ["ptx", "decision", "test-dense"])
def test_a_second_kind_with_a_taken_extension_is_refused(registry, ext):
    if ext == "test-dense":
        kinds.EntryKind("test-dense", role="test-dense")
    before, sparse = kinds.declared_kinds(), set(registry.SPARSE_EXTS)
    with pytest.raises(ValueError, match=f"'{ext}' is declared already.*needs its own extension"):
        kinds.EntryKind(ext, role="other", sparse=True)
    assert kinds.declared_kinds() == before and registry.SPARSE_EXTS == sparse
