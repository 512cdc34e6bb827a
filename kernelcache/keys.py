"""Validation of keys and extensions: the only names ever joined to a cache root.

A key is 32 to 128 lowercase hexadecimal characters; an extension is 1 to 16 characters of
``[a-z0-9]`` and not ``json`` (the metadata file's own extension). Both are checked before any
file is touched, so nothing from outside (a manifest, a bundle, a remote value, a command-line
argument) can name a path outside the root.

A key's first :data:`GROUP_CHARS` characters are its group (:func:`group_of`): a caller that
derives the keys of an entry's companions from it keeps them in its group, and a remote tier
keeps a group together (one Redis Cluster slot, one object-store prefix), so that a shard that
fails takes a kernel with all of its companions, or none of them. Entries of some extensions
are usually absent (autotune decisions, remembered failures, memos: declared by their owners
with :func:`declare_sparse`), so that a remote tier lets a miss of one cost little (a layered
tier does not wait long on a lower tier for one: :class:`kernelcache.remote.layered.LayeredTier`).

A key made of named steps is their digest (:func:`digest_of`), the same function for every such
key (the bridge's kernel, lowering, decision and memo keys), so two keys of different kinds
never share a formula by accident and a recorded set of components says what made the key.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Collection, Mapping

from .errors import InvalidKey

KEY_PATTERN = re.compile(r"[0-9a-f]{32,128}")
EXT_PATTERN = re.compile(r"[a-z0-9]{1,16}")
META_EXT = "json"
RESERVED_EXTS = frozenset({META_EXT})
#: the characters of a key that name its group (see the module docstring)
GROUP_CHARS = 16
#: extensions of entries that are usually absent (:func:`declare_sparse`)
SPARSE_EXTS: set[str] = set()


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def declare_sparse(*exts: str) -> None:
    """Declare entries of ``exts`` usually absent (e.g. autotune decisions, remembered
    failures, memos): a miss of one should cost little."""
    SPARSE_EXTS.update(exts)


def group_of(key: str) -> str:
    """The group of ``key`` (a valid key): its first :data:`GROUP_CHARS` characters."""
    return key[:GROUP_CHARS]


def check_key(key: object) -> str:
    """Return ``key`` if it is a valid cache key.

    Raises:
        ValueError: ``key`` is not a string of 32 to 128 lowercase hexadecimal characters.
    """
    if not isinstance(key, str) or KEY_PATTERN.fullmatch(key) is None:
        raise InvalidKey(
            f"invalid cache key {_show(key)}: a key is 32 to 128 lowercase hexadecimal "
            "characters (e.g. hashlib.sha256(...).hexdigest())"
        )
    return key


def check_ext(ext: object) -> str:
    """Return ``ext`` if it is a valid artifact extension.

    Raises:
        ValueError: ``ext`` is not 1 to 16 characters of [a-z0-9], or is reserved ("json").
    """
    if not isinstance(ext, str) or EXT_PATTERN.fullmatch(ext) is None:
        raise InvalidKey(
            f"invalid artifact extension {_show(ext)}: use 1 to 16 characters of [a-z0-9], "
            "without a leading dot (e.g. 'cubin', 'ptx', 'hsaco')"
        )
    if ext in RESERVED_EXTS:
        raise InvalidKey(f"artifact extension {ext!r} is reserved for the metadata file")
    return ext


def digest_of(components: Mapping[str, str]) -> str:
    """The 64-hex-digit key that named ``components`` make (sha256 of their sorted pairs): the
    one way a key is made of named steps (a kernel, lowering, decision or memo key), so that an
    entry that records its components lets a miss name the steps that differ."""
    return hashlib.sha256(repr(sorted(components.items())).encode()).hexdigest()


def split_entry_name(name: str) -> tuple[str, str] | None:
    """Split a file name of a root into (key, ext), or None if it is not an entry file."""
    key, dot, ext = name.partition(".")
    if not dot or KEY_PATTERN.fullmatch(key) is None:
        return None
    if ext != META_EXT and EXT_PATTERN.fullmatch(ext) is None:
        return None
    return key, ext


def all_keys(names: Collection[str]) -> bool:
    """Whether every one of ``names`` is a valid key (one pass over all of them, in C)."""
    if not names:
        return True
    lengths = set(map(len, names))
    if min(lengths) < 32 or max(lengths) > 128:
        return False
    return not "".join(names).encode().translate(None, b"0123456789abcdef")


def valid_ext(ext: str) -> bool:
    """Whether ``ext`` is a valid artifact extension (no exception)."""
    return EXT_PATTERN.fullmatch(ext) is not None and ext not in RESERVED_EXTS
