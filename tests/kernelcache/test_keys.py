"""Keys and extensions are validated before any file is touched."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

import kernelcache
from kernelcache.keys import KEY_PATTERN, check_ext, check_key, split_entry_name

HEX = "0123456789abcdef"
valid_keys = st.text(alphabet=HEX, min_size=32, max_size=128)
valid_exts = st.text(
    alphabet="abcdefghijklmnopqrstuvwxyz0123456789", min_size=1, max_size=16
).filter(lambda e: e != "json")


@given(valid_keys)
def test_valid_keys_pass(key):
    assert check_key(key) == key


@given(st.text(max_size=200))
def test_arbitrary_text_is_a_key_only_if_it_matches(text):
    if KEY_PATTERN.fullmatch(text):
        assert check_key(text) == text
    else:
        with pytest.raises(ValueError, match="32 to 128 lowercase hexadecimal"):
            check_key(text)


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "a" * 31,
        "a" * 129,
        "A" * 32,
        "../" + "a" * 32,
        "a" * 32 + "/x",
        "a" * 31 + "\x00",
        "a" * 31 + "\uff41",  # fullwidth 'a', a look-alike
        "a" * 31 + "\u0430",  # Cyrillic 'a'
        "a" * 31 + "\n",
        "a" * 32 + "\n",
        b"a" * 32,
        None,
        12345678901234567890123456789012,
    ],
)
def test_bad_keys_rejected(bad):
    with pytest.raises(ValueError):
        check_key(bad)


@pytest.mark.parametrize(
    "bad",
    ["", ".cubin", "CUBIN", "a/b", "..", "json", "a" * 17, "cu bin", "ptx\x00", "hsac\u043e", 3],
)
def test_bad_exts_rejected(bad):
    with pytest.raises(ValueError):
        check_ext(bad)


@given(valid_exts)
def test_valid_exts_pass(ext):
    assert check_ext(ext) == ext


@pytest.mark.parametrize("bad_key", ["../../etc/passwd", "a" * 31 + "/", "f" * 200])
def test_cache_rejects_before_touching_files(tmp_path, bad_key):
    root = tmp_path / "never-created"
    cache = kernelcache.Cache(root)
    for op in (
        lambda: cache.get(bad_key, "cubin"),
        lambda: cache.put(bad_key, "cubin", b"x", {}),
        lambda: cache.get_or_create(bad_key, "cubin", lambda: (b"x", {})),
    ):
        with pytest.raises(ValueError, match="invalid cache key"):
            op()
    with pytest.raises(ValueError, match="invalid artifact extension"):
        cache.put("a" * 32, "../x", b"x", {})
    assert not root.exists()


def test_split_entry_name():
    key = "ab" * 16
    assert split_entry_name(f"{key}.cubin") == (key, "cubin")
    assert split_entry_name(f"{key}.json") == (key, "json")
    assert split_entry_name(f"{key}.cubin.tmp") is None
    assert split_entry_name(".tmp") is None
    assert split_entry_name(key) is None
