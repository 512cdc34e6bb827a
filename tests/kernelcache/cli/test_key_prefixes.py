"""The key prefixes ``ls`` prints are ones ``show`` accepts: an entry and its companions (a
cubin and its PTX, a program and its lowering) share their first 16 digits, so ``ls`` prints
as many more as tell them apart, and an ambiguous prefix names the candidates."""

from __future__ import annotations

from cli_support import kc, kc_json, put

GROUP = "0123456789abcdef"


def test_every_prefix_ls_prints_is_one_show_accepts(tmp_path):
    root = tmp_path / "cache"
    cubin = put(root, "matmul", key=GROUP + "1" * 48)
    ptx = put(root, "matmul", ext="ptx", key=GROUP + "2" * 48)
    other = put(root, "softmax", key="f" * 64)
    listed = kc(root, "ls").stdout.splitlines()[1:-1]
    prefixes = [line.split()[0] for line in listed]
    assert len(prefixes) == 3 and {len(p) for p in prefixes} == {17}, listed
    for prefix in prefixes:
        shown = kc_json(root, "show", prefix)
        assert shown["key"].startswith(prefix)
    assert {kc_json(root, "show", p)["key"] for p in prefixes} == {cubin.key, ptx.key, other.key}


def test_keys_apart_in_16_digits_are_shown_with_16(tmp_path):
    root = tmp_path / "cache"
    put(root, "a", key="1" * 64)
    put(root, "b", key="2" * 64)
    assert [len(line.split()[0]) for line in kc(root, "ls").stdout.splitlines()[1:-1]] == [16, 16]


def test_an_ambiguous_prefix_names_each_candidate_with_what_show_accepts(tmp_path):
    root = tmp_path / "cache"
    put(root, "matmul", key=GROUP + "1" * 48)
    put(root, "matmul", ext="ptx", key=GROUP + "2" * 48)
    proc = kc(root, "show", GROUP)
    assert proc.returncode == 2
    assert f"{GROUP}1 (cubin), {GROUP}2 (ptx)" in proc.stderr, proc.stderr
    assert "give one of these" in proc.stderr
