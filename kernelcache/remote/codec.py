"""An entry as one remote value, the same bytes for every tier: ``b"KCR1"``, the metadata's
length (uint32, big endian), the store's metadata JSON, the artifact bytes; or, compressed (the
default, where it is smaller: machine code and its metadata shrink to a fifth to a third),
``b"KCZ1"`` and one zstd frame of that value, its size in its header.

Invariants: a decoded value is used only if its header, its metadata (the one schema and the
entry digest), the artifact's size and xxh3-128 digest and the contract of an entry (its
artifact whole for its extension, its launch metadata there:
:func:`~kernelcache.schema.entry_problem`) check out; with a signing key, only if its HMAC does
too. A value is made only of a whole entry. Readers take both forms; a compressed value is
inflated only where its frame says its size and that size is one an entry may have
(:data:`MAX_INFLATED`), and only if the frame ends the value and inflates to exactly that size.
Nothing here raises for what a server returns: a refused value is a
:class:`~kernelcache.problem.Problem`. An entry's document travels as written: a value made of
a document (a backfill, an entry read from a root) carries its fields, ``covers`` and entry
digest unchanged (:func:`~kernelcache.schema.written_document`), so a reader never widens what
a writer covered, and the same document under the same key is the same value (zstd at one
level is deterministic: :mod:`kernelcache.store.compression`).
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Mapping
from typing import Any

from ..problem import Problem
from ..schema.document import (
    MAX_ARTIFACT_BYTES,
    MAX_META_BYTES,
    check_document,
    check_signature,
    encode_metadata,
    entry_problem,
    make_metadata,
    parse_metadata,
    require_whole,
    sign,
    written_document,
)
from ..schema.fields import HMAC_FIELD, RESERVED_FIELDS
from ..store.compression import deflated, inflated

#: version of the value layout; part of every Redis key, so a new layout never reads an old one
#: (2: the metadata carries an entry digest, and optionally an HMAC; 3: metadata of format 2,
#: whose entry digest and HMAC cover its ``covers`` list; 4: values zstd-compressed, as
#: ``ZMAGIC``: a reader of 3 would take them for corrupt values and delete them)
REMOTE_FORMAT = 4
MAGIC = b"KCR1"
#: the magic of a compressed value: one zstd frame of the plain value follows
ZMAGIC = b"KCZ1"
_HEADER = struct.Struct(">4sI")
#: the most a compressed value may inflate to: the largest entry the schema accepts
MAX_INFLATED = _HEADER.size + MAX_META_BYTES + MAX_ARTIFACT_BYTES


def encode_value(meta: Mapping[str, Any], data: bytes) -> bytes:
    """One entry as a plain remote value: magic, metadata length, metadata JSON, artifact."""
    raw_meta = encode_metadata(meta)
    return b"".join((_HEADER.pack(MAGIC, len(raw_meta)), raw_meta, data))


def compress_value(value: bytes) -> bytes:
    """``value`` (a plain value) compressed, where that is smaller; else ``value``."""
    frame = deflated(value)
    return value if frame is None or len(ZMAGIC) + len(frame) >= len(value) else ZMAGIC + frame


def inflate_value(raw: bytes) -> bytes | str:
    """The plain value of ``raw`` (``raw`` itself unless it is compressed), or what is wrong
    with it (never raises)."""
    if not raw.startswith(ZMAGIC):
        return raw
    found = inflated(raw[len(ZMAGIC) :], MAX_INFLATED)
    return found if isinstance(found, bytes) else f"value is compressed, but {found}"


def make_value(
    key: str, ext: str, data: bytes, meta: Mapping[str, Any], signing_key: bytes | None
) -> bytes:
    """The value a tier stores for an entry (compressed where that is smaller), signed when
    ``signing_key`` is given (else a signature the document carries is kept as written).

    ``meta`` is either the entry's document (one with an entry digest: an entry read from a
    root or a tier), kept as written, or the caller's fields of a new entry, from which its
    document is made (:func:`~kernelcache.schema.make_metadata`).

    Raises:
        ValueError: ``meta`` is outside the schema, or a document that does not describe
            ``data``, or the entry is not whole (:func:`~kernelcache.schema.require_whole`;
            the local store rejects such entries first).
    """
    if "entry_digest" in meta:
        doc = written_document(key, ext, data, meta)
        if signing_key is None and HMAC_FIELD in meta:
            doc[HMAC_FIELD] = meta[HMAC_FIELD]
    else:
        doc = make_metadata(
            key, ext, data, {k: v for k, v in meta.items() if k not in RESERVED_FIELDS}
        )
    require_whole(key, ext, data, doc)
    if signing_key is not None:
        doc[HMAC_FIELD] = sign(doc, hashlib.sha256(data).digest(), signing_key)
    return compress_value(encode_value(doc, data))


def decode_value(raw: bytes, key: str) -> tuple[bytes, dict[str, Any]] | Problem:
    """Parse and verify a value read for ``key`` (header, metadata schema and entry digest,
    artifact size and digest, the contract of an entry; not the signature: see
    :func:`authenticate`).

    Returns ``(data, metadata)``, or a :class:`Problem` saying what is wrong (never raises).
    """
    if not isinstance(raw, bytes):
        return Problem(key, f"value is a {type(raw).__name__}, not bytes")
    inflated = inflate_value(raw)
    if isinstance(inflated, str):
        return Problem(key, inflated)
    raw = inflated
    if len(raw) < _HEADER.size:
        return Problem(key, "value is shorter than its header")
    magic, meta_len = _HEADER.unpack_from(raw)
    if magic != MAGIC:
        return Problem(key, "value does not start with the kernelcache header")
    if meta_len > MAX_META_BYTES or _HEADER.size + meta_len > len(raw):
        return Problem(key, "value is truncated (metadata length exceeds the value)")
    doc = parse_metadata(raw[_HEADER.size : _HEADER.size + meta_len], key)
    if isinstance(doc, Problem):
        return doc
    data = raw[_HEADER.size + meta_len :]
    reason = entry_problem(doc["ext"], data, doc)
    if reason is not None:
        return Problem(key, reason)
    return data, doc


def authenticate(
    key: str, data: bytes, meta: Mapping[str, Any], signing_key: bytes
) -> Problem | None:
    """None if a decoded value carries a valid signature under ``signing_key``; else an
    untrusted (not corrupt) :class:`Problem` saying why: the value is refused, not deleted."""
    why = check_signature(meta, hashlib.sha256(data).digest(), signing_key)
    return None if why is None else Problem(key, why, corrupt=False, untrusted=True)


def check_entry(found: object, key: str, ext: str) -> tuple[bytes, dict[str, Any]] | str:
    """``(data, metadata)`` returned by any tier (a plugin's too) if they form a valid, whole
    entry of ``key`` and ``ext`` (:func:`~kernelcache.schema.entry_problem`, in full); else
    what is wrong. Never raises."""
    if not isinstance(found, tuple) or len(found) != 2:
        return "the tier returned something other than (data, metadata)"
    data, meta = found
    if not isinstance(data, bytes):
        return "the artifact is not bytes"
    try:
        plain = dict(meta) if isinstance(meta, Mapping) else meta
    except Exception:  # a hostile Mapping
        return "the metadata is not a mapping"
    doc = check_document(plain, key)
    if isinstance(doc, Problem):
        return doc.reason
    if doc["ext"] != ext:
        return f"it holds a .{doc['ext']} artifact, not .{ext}"
    return entry_problem(ext, data, doc) or (data, doc)
