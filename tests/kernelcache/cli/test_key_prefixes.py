"""The key prefixes ``ls`` prints are ones ``show`` accepts: an entry and its companions (a
cubin and its PTX, a program and its lowering) share their first 16 digits, so ``ls`` prints
as many more as tell them apart, and an ambiguous prefix names the candidates. A prefix of a
kernel's group names the kernel, shown with its companions; ``show`` also takes
``<key>.<ext>`` and the path of an entry's file under the root."""

from __future__ import annotations

from pathlib import Path

from cli_support import kc, kc_json, put, put_companion

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


def test_show_takes_a_kernels_group_prefix_and_lists_its_companions(tmp_path):
    root = tmp_path / "cache"
    kernel = put(root, "matmul", key=GROUP + "3" * 48).key
    ptx = put_companion(root, kernel).key
    ident = put_companion(root, kernel, "ident", "identity").key
    put(root, "softmax", key="f" * 64)
    for prefix in (GROUP, GROUP[:6]):  # the nearest entry `explain` names; a short prefix
        doc = kc_json(root, "show", prefix)
        assert doc["key"] == kernel and doc["ext"] == "cubin" and doc["status"] == "ok"
        listed = {(c["key"], c["ext"], c["kind"]) for c in doc["companions"]}
        assert listed == {(ptx, "ptx", "ptx"), (ident, "ident", "identity")}
    text = kc(root, "show", GROUP)
    assert text.returncode == 0, text.stderr
    assert "companions" in text.stdout and ptx in text.stdout and ident in text.stdout
    # a companion shown by its own key lists its kernel
    assert kernel in {c["key"] for c in kc_json(root, "show", ptx[:20])["companions"]}
    assert kc_json(root, "show", "f" * 16)["companions"] == []


def test_show_takes_key_dot_ext_and_an_entry_path(tmp_path):
    root = tmp_path / "cache"
    kernel = put(root, "matmul", key=GROUP + "3" * 48).key
    ptx = put_companion(root, kernel).key
    assert kc_json(root, "show", f"{kernel}.cubin")["key"] == kernel
    assert kc_json(root, "show", f"{ptx}.ptx")["key"] == ptx
    assert kc_json(root, "show", f"{GROUP}.ptx")["key"] == ptx  # a prefix, with its extension
    assert kc_json(root, "show", str(root / f"{kernel}.cubin"))["key"] == kernel
    assert kc_json(root, "show", str(root / f"{ptx}.json"))["key"] == ptx
    missing = kc(root, "show", f"{kernel}.hsaco")
    assert missing.returncode == 1 and "no entry" in missing.stderr
    elsewhere = tmp_path / "other"
    elsewhere.mkdir()
    (elsewhere / f"{kernel}.cubin").write_bytes(b"x")
    outside = kc(root, "show", str(elsewhere / f"{kernel}.cubin"))
    assert outside.returncode == 2 and f"is not in the cache root {root}" in outside.stderr


def test_show_takes_the_path_verify_prints(tmp_path):
    root = tmp_path / "cache"
    bad = put(root, "matmul", size=400)
    Path(bad.path).write_bytes(b"\0" * 400)  # same size, wrong digest
    (problem,) = kc_json(root, "verify", code=1)["problems"]
    doc = kc_json(root, "show", problem["path"], code=1)
    assert doc["key"] == bad.key and doc["status"] == "corrupt"
    assert kc_json(root, "show", str(root / problem["path"]), code=1)["key"] == bad.key
