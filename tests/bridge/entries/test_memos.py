"""Values memoized in the kernel cache (:mod:`bridge.entries.memos`) are the word of whoever could
write the root, a read-only layer or a bundle: a memo of the wrong form (deeply nested JSON, a
5,000-digit release, a control character where a digest belongs, bytes that are not text) is
computed again as if it were absent, never raised into the lowering that reads it and never
put into a key."""

from __future__ import annotations

import stat

import pytest

import kernelcache
from bridge.embed import ptxisa
from bridge.entries import memos
from bridge.identity import compiler_identity as ci
from bridge.vendors.targets import parse_target

DEEP = b"[" * 30000 + b"]" * 30000  # (within MAX_VALUE: json.loads recurses past the limit)


def _forge(cache: kernelcache.Cache, label: str, fingerprint: str, value: bytes) -> None:
    memos.MEMO.put(
        cache, memos.memo_key(label, fingerprint), value, {"kind": "identity", "name": label}
    )


@pytest.fixture
def cache(tmp_path):
    return kernelcache.Cache(tmp_path / "root")


@pytest.fixture
def forgotten(monkeypatch):
    """This process's own memory of the identities, emptied (so the cache is asked)."""
    monkeypatch.setattr(ci, "_memo", {})
    monkeypatch.setattr(ci, "_known", {})


@pytest.mark.parametrize(
    "value",
    [DEEP, b"5", b'{"TRITON_X": 1}', b'["NOT A NAME"]', b"[1, 2]", b"\xff\xfe", b"[" * 70000],
    ids=["deep", "a-number", "a-dict", "a-bad-name", "not-names", "not-text", "too-long"],
)
def test_an_environment_memo_of_another_form_is_scanned_again(cache, forgotten, value):
    expected = ci.environment_variables(None)
    ci._known.clear()
    _forge(cache, ci.ENVIRONMENT_LABEL, ci.environment_fingerprint(), value)
    assert ci.environment_variables(cache) == expected


@pytest.mark.parametrize(
    "value", [b"\x00", b"a" * 5000, b"not a digest", b"0" * 65], ids=["nul", "long", "text", "65"]
)
def test_a_triton_files_memo_that_is_no_digest_is_computed_again(cache, forgotten, value):
    _forge(cache, "triton_files", ci.triton_fingerprint(), value)
    assert ci.triton_identity(cache) == ci.triton_digest()


def test_a_backend_memo_with_control_characters_is_computed_again(cache, forgotten):
    class Backend:
        def hash(self) -> str:
            return "ptxas 12.8\nrelease-90"

    target = parse_target("cuda:90")
    fingerprint = target.vendor.backend_fingerprint(target.arch)
    if fingerprint is None:
        pytest.skip("this vendor's backend identity is not memoized")
    _forge(cache, f"backend:{target}", fingerprint, b"\x1b[2J" * 10)
    assert ci.backend_identity(cache, target, Backend()) == "ptxas 12.8\nrelease-90"


@pytest.fixture
def ptxas(tmp_path):
    path = tmp_path / "ptxas"
    path.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 12.8, V12.8.93'\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


@pytest.mark.parametrize(
    "value",
    [b"9" * 5000 + b".0.0", b"12.8", b"\xd9\xa1\xd9\xa2.8.93"],
    ids=["digits", "two", "arabic"],
)
def test_a_ptxas_release_memo_of_another_form_runs_ptxas_again(cache, ptxas, value):
    _forge(cache, "ptxas-release", ptxisa._fingerprint(ptxas), value)
    assert ptxisa._release(ptxas, cache) == (12, 8, 93)


def test_a_memo_of_the_right_form_is_used(cache, ptxas):
    _forge(cache, "ptxas-release", ptxisa._fingerprint(ptxas), b"13.0.88")
    assert ptxisa._release(ptxas, cache) == (13, 0, 88)  # (not what running it says)
