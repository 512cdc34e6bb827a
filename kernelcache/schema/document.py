"""Whole metadata documents: checking one read from anywhere, building one for ``put``, encoding.

What a document covers is its writer's to decide, and no one else's. A reader never widens it:
a document read from a remote tier, copied to another tier, published from a remote hit or
imported from a bundle is kept as written (:func:`check_written`: the same fields, covers and
entry digest; only a signature is dropped on the way into a root). A document that holds a
field this process registers as covered without covering it is a **miss** (outdated, rebuilt by
the next put), never served with that field ignored. A document of machine code (or PTX)
without the launch metadata its extension requires (:mod:`.launch`) is **corrupt**, wherever it
is read: a reader never launches with a default for a field its writer left out. Format 2
documents are the only ones served: format 1 digests did not cover the ``covers`` list.

Every check returns a reason or a :class:`~kernelcache.problem.Problem` instead of raising:
nothing here trusts its input, and nothing here crashes on it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from typing import Any

from .._version import __version__
from ..errors import InvalidMetadata
from ..jsonio import load_json
from ..keys import EXT_PATTERN, META_EXT
from ..problem import Problem
from .digests import CANONICAL, entry_digest
from .fields import COVERED, check_fields
from .format import (
    COVERS_FIELD,
    DIGEST,
    FORMAT_VERSION,
    HMAC_FIELD,
    HMAC_PATTERN,
    MAX_ARTIFACT_BYTES,
    MAX_DEPTH,
    MAX_INT,
    MAX_META_BYTES,
    RESERVED_FIELDS,
    digest,
    shown_value,
)
from .launch import launch_problem
from .values import plain, utf8


def check_document(doc: Any, key: str) -> dict[str, Any] | Problem:
    """``doc`` if it is a valid metadata document of ``key`` (schema, entry digest, every field
    this process registers as covered that it holds covered by it, and the launch metadata its
    extension requires: :func:`~kernelcache.schema.launch.launch_problem`), else
    :class:`~kernelcache.problem.Problem`. Never raises."""
    if not isinstance(doc, dict):
        return Problem(key, "metadata is not a JSON object")
    fmt = doc.get("format")
    if type(fmt) is not int or fmt != FORMAT_VERSION:
        if type(fmt) is int and 0 < fmt < FORMAT_VERSION and doc.get("key") == key:
            return _outdated(doc, key, f"written by an older kernelcache (format {fmt})")
        return Problem(key, f"unsupported metadata format {shown_value(fmt)}")
    if doc.get("key") != key:
        return Problem(key, "metadata names another key")
    ext = doc.get("ext")
    if not _valid_ext(ext):
        return Problem(key, "metadata has an invalid ext")
    size = doc.get("size")
    if type(size) is not int or not 0 <= size <= MAX_ARTIFACT_BYTES:
        return Problem(key, "metadata has an invalid size")
    dig = doc.get("digest")
    if not isinstance(dig, str) or DIGEST.fullmatch(dig) is None:
        return Problem(key, "metadata has an invalid digest")
    mac = doc.get(HMAC_FIELD)
    if mac is not None and (not isinstance(mac, str) or HMAC_PATTERN.fullmatch(mac) is None):
        return Problem(key, "metadata has an invalid signature field")
    if COVERS_FIELD not in doc:
        return Problem(key, f"metadata has no {COVERS_FIELD!r} list")
    bad = check_fields(doc)
    if bad:
        return Problem(key, bad)
    stated = doc.get("entry_digest")
    if not isinstance(stated, str) or stated != entry_digest(doc):
        if stated is None:
            return Problem(key, "metadata has no entry digest")
        return Problem(
            key, "entry digest mismatch: the launch metadata or its covers list was altered"
        )
    covers = doc[COVERS_FIELD]
    if not COVERED.issubset(covers):  # (what writers of this installation write: one pass)
        uncovered = sorted(name for name in COVERED if name in doc and name not in covers)
        if uncovered:
            return _outdated(
                doc,
                key,
                f"its digest does not cover {', '.join(uncovered)}, which this process requires "
                "covered (its writer did not cover them)",
            )
    bad = launch_problem(doc["ext"], doc)
    if bad is not None:
        return Problem(key, bad)
    return doc


def _valid_ext(ext: object) -> bool:
    return isinstance(ext, str) and EXT_PATTERN.fullmatch(ext) is not None and ext != META_EXT


def _outdated(doc: dict[str, Any], key: str, why: str) -> Problem:
    """A document that is not damaged but is not served here (see the module docstring)."""
    ext = doc.get("ext")
    return Problem(key, why, corrupt=False, outdated=True, ext=ext if _valid_ext(ext) else None)


def parse_metadata(raw: bytes, key: str) -> dict[str, Any] | Problem:
    """Parse and check the bytes of a metadata document (see :func:`check_document`)."""
    if len(raw) > MAX_META_BYTES:
        return Problem(key, "metadata is too large")
    try:
        doc = load_json(raw)
    except ValueError as e:
        return Problem(key, f"unreadable metadata ({e.__class__.__name__})")
    return check_document(doc, key)


def parse_fields(raw: bytes, key: str) -> dict[str, Any] | Problem:
    """The fields of a metadata document of ``key``, parsed but not checked against the schema
    (what names the entry, for selecting it: a reader of a file checks more); a Problem if it
    is not a JSON object naming ``key`` with a valid extension."""
    try:
        doc = load_json(raw)
    except ValueError as e:
        return Problem(key, f"unreadable metadata ({e.__class__.__name__})")
    if not isinstance(doc, dict) or doc.get("key") != key:
        return Problem(key, "metadata does not name its key")
    if not _valid_ext(doc.get("ext")):
        return Problem(key, "metadata has an invalid ext")
    return doc


def encode_metadata(doc: Mapping[str, Any]) -> bytes:
    """The bytes of a metadata document as the store writes it."""
    return CANONICAL.encode(doc).encode()


def build_metadata(
    key: str, ext: str, size: int, artifact_digest: str, meta: Mapping[str, Any]
) -> dict[str, Any]:
    """The metadata document of an artifact of ``size`` bytes with ``artifact_digest``: the
    caller's fields (checked against the schema, normalized through JSON) plus the store's.

    Raises:
        ValueError: ``meta`` sets a reserved field, or a field is not what the schema allows;
            the message names the field.
    """
    if not isinstance(meta, Mapping):
        raise InvalidMetadata(f"metadata for {key} must be a mapping, not {type(meta).__name__}")
    clash = RESERVED_FIELDS.intersection(name for name in meta if isinstance(name, str))
    if clash:
        raise InvalidMetadata(f"metadata may not set the reserved field(s) {sorted(clash)}")
    doc: dict[str, Any] = dict(meta)
    producer = doc.get("producer")
    if producer is None:
        producer = {}
    if not isinstance(producer, Mapping):
        raise InvalidMetadata(
            f"metadata for {key}: metadata field 'producer' must be an object of package "
            f"versions, not {shown_value(producer)}"
        )
    producer = dict(producer)
    producer.setdefault("kernelcache", __version__)
    given = doc.get(COVERS_FIELD, ())
    if not isinstance(given, (list, tuple)) or not all(isinstance(n, str) for n in given):
        raise InvalidMetadata(
            f"metadata for {key}: metadata field {COVERS_FIELD!r} must be a list of field names"
        )
    doc[COVERS_FIELD] = sorted(COVERED.union(given))
    doc.update(
        format=FORMAT_VERSION,
        key=key,
        ext=ext,
        size=size,
        digest=artifact_digest,
        created=doc.get("created", time.time()),
        producer=producer,
    )
    for name, value in doc.items():
        if not isinstance(name, str):
            raise InvalidMetadata(
                f"metadata for {key}: field name {shown_value(name)} is not a string"
            )
        bad = plain(value)
        if bad:
            raise InvalidMetadata(f"metadata for {key}: metadata field {name!r} {bad}")
    try:
        raw = encode_metadata(doc)
    except (TypeError, ValueError, RecursionError) as e:
        raise InvalidMetadata(f"metadata for {key} is not JSON-serializable: {e}") from None
    if len(raw) > MAX_META_BYTES - 128:  # room for the entry digest
        largest = max(doc, key=lambda name: len(encode_metadata({name: doc[name]})))
        raise InvalidMetadata(
            f"metadata for {key} is {len(raw)} bytes encoded, more than the limit of "
            f"{MAX_META_BYTES}; its largest field is {largest!r}"
        )
    normalized = load_json(raw)  # tuples become lists: what every reader will see
    bad = check_fields(normalized)
    if bad:
        raise InvalidMetadata(f"metadata for {key}: {bad}")
    normalized["entry_digest"] = entry_digest(normalized)
    return normalized


def make_metadata(key: str, ext: str, data: bytes, meta: Mapping[str, Any]) -> dict[str, Any]:
    """The metadata document stored beside ``data`` (see :func:`build_metadata`).

    Raises:
        ValueError: a reserved or invalid field; the message names it.
    """
    return build_metadata(key, ext, len(data), digest(data), meta)


def check_written(doc: Any, key: str) -> dict[str, Any] | Problem:
    """``doc``, a document as another process wrote it (a remote value, a bundle entry, an
    entry of another root), as a root stores it: checked (:func:`check_document`), its fields,
    ``covers`` and entry digest as written, less its signature (never stored in a root), and
    at most :data:`MAX_META_BYTES` encoded; else a :class:`~kernelcache.problem.Problem`. What
    a reader keeps or passes on: never a widened copy. Never raises."""
    checked = check_document(doc, key)
    if isinstance(checked, Problem):
        return checked
    kept = {name: value for name, value in checked.items() if name != HMAC_FIELD}
    if len(encode_metadata(kept)) > MAX_META_BYTES:
        return Problem(key, f"metadata is larger than {MAX_META_BYTES} bytes encoded")
    return kept


def written_document(key: str, ext: str, data: bytes, doc: Mapping[str, Any]) -> dict[str, Any]:
    """:func:`check_written` of ``doc``, found to describe ``data`` as ``ext``.

    Raises:
        ValueError: ``doc`` is not a valid document of ``key`` (the message says why), or it
            describes another artifact.
    """
    kept = check_written(dict(doc), key)
    if isinstance(kept, Problem):
        raise InvalidMetadata(f"metadata for {key}: {kept.reason}")
    if kept["ext"] != ext or kept["size"] != len(data) or kept["digest"] != digest(data):
        raise InvalidMetadata(
            f"metadata for {key} describes another artifact (ext, size or digest)"
        )
    return kept


def displayable(value: Any, depth: int = 0) -> Any:
    """A copy of a value read from outside that JSON and a UTF-8 terminal can show: lone
    surrogates escaped, non-finite numbers and integers beyond 64 bits as text, nesting cut."""
    if isinstance(value, str):
        return value if utf8(value) else value.encode("utf-8", "backslashreplace").decode()
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return value if -MAX_INT <= value <= MAX_INT else shown_value(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if depth >= MAX_DEPTH:
        return "..."
    if isinstance(value, list):
        return [displayable(v, depth + 1) for v in value]
    if isinstance(value, dict):
        return {displayable(str(k)): displayable(v, depth + 1) for k, v in value.items()}
    return repr(value)
