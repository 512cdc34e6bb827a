"""Whole metadata documents and whole entries: the format's version and digests, checking a
document read from anywhere, building one for ``put``, encoding it, signing it, and the one
contract of an entry.

The **entry digest** is the xxh3-128 of the canonical JSON of the store's own fields (which
include the artifact's digest, so the artifact bytes are covered through it), of the document's
``covers`` list itself, and of the caller fields that list names. A flipped bit in a covered
field, or in the list of what is covered, is a corrupt entry, as a flipped bit in the artifact
is. It detects damage, not forgery: what comes from outside the machine (Redis values, bundles)
can carry an HMAC-SHA256 (:func:`sign`) made with a shared key, over the covered fields
(``covers`` included) and the artifact bytes themselves.

What a document covers is its writer's to decide, and no one else's. A reader never widens it:
a document read from a remote tier, copied to another tier, published from a remote hit or
imported from a bundle is kept as written (:func:`check_written`: the same fields, covers and
entry digest; only a signature is dropped on the way into a root). A document that holds a
field this process registers as covered without covering it is a **miss** (outdated, rebuilt by
the next put), never served with that field ignored. A document of machine code (or PTX)
without the launch metadata its extension requires
(:func:`~kernelcache.schema.fields.launch_problem`) is **corrupt**, wherever it is read. Format 2
documents are the only ones served: format 1 digests did not cover the ``covers`` list.

The contract of an entry (:func:`entry_problem`): an entry of extension ``ext`` is whole when its
document holds the launch metadata ``ext`` requires, covered by its digest, and its artifact is
whole for ``ext`` (:func:`kernelcache.formats.artifact_problem`: a cubin is a whole ELF64 file for NVIDIA
CUDA, an HSACO one for AMD GPUs, PTX defines the kernel its metadata names and a body for every
function it calls); it applies whether or not a package built on kernelcache is imported. Who
checks it: :meth:`kernelcache.store.Store.publish` through :func:`require_whole` (``Cache.put``,
``Cache.replace``, every build, a remote hit published locally, every entry a bundle import
publishes: an :class:`~kernelcache.errors.IncompleteEntry`, nothing written; a disabled cache's
put checks the same); :meth:`~kernelcache.store.Store.inspect` with ``whole`` (``verify``, its
``--repair``, ``export``: a corrupt entry); :func:`kernelcache.remote.check_entry`, a remote
value's decoding and the check pass of a bundle import (the value or the bundle refused); and
:meth:`~kernelcache.store.Store.read` each time it reads an entry's metadata from disk, with
``check=CHEAP``: without the checks whose cost grows with the artifact (the PTX text scan), a
corrupt entry (quarantined, counted, rebuilt by the caller), never served, never raised. The
artifact's size and digest are part of the same check, so every door words a damaged entry
alike.

Invariants: every check returns a reason or a :class:`~kernelcache.problem.Problem` instead of
raising: nothing here trusts its input, and nothing here crashes on it; what
:func:`entry_problem` accepts in full it accepts with less. Encoding and digests are
byte-identical across releases of one :data:`FORMAT_VERSION`; changing a constant here changes
what is on disk.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import re
import time
from collections.abc import Iterable, Mapping
from typing import Any

import xxhash

from .._version import __version__
from ..errors import IncompleteEntry, InvalidMetadata
from ..formats import STRUCTURED, artifact_problem
from ..fsio import load_json
from ..keys import EXT_PATTERN, META_EXT
from ..problem import Problem
from .fields import (
    COVERED,
    COVERS_FIELD,
    HMAC_FIELD,
    MAX_DEPTH,
    MAX_INT,
    RESERVED_FIELDS,
    STORE_COVERED,
    check_fields,
    launch_problem,
    plain,
    shown_value,
    utf8,
)

#: the version of the metadata document (2: the entry digest and a signature cover the
#: ``covers`` list); documents of an earlier format are misses (rebuilt), never served
FORMAT_VERSION = 2
DIGEST_PREFIX = "xxh3_128:"
HMAC_PREFIX = "hmac-sha256:"
#: the largest metadata document accepted, encoded
MAX_META_BYTES = 64 << 10
#: the largest artifact an entry may describe: a reader holds an entry in memory whole, so this
#: bounds what a root's writer can make every reader allocate (a sparse file claims any size)
MAX_ARTIFACT_BYTES = 1 << 30

DIGEST = re.compile(r"xxh3_128:[0-9a-f]{32}")
HMAC_PATTERN = re.compile(r"hmac-sha256:[0-9a-f]{64}")


def digest(data: bytes | memoryview) -> str:
    """The digest recorded for an artifact: ``xxh3_128:<32 hex digits>``."""
    return DIGEST_PREFIX + xxhash.xxh3_128_hexdigest(data)


# -- the entry digest and signatures --------------------------------------------------------
CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), allow_nan=False)


def _covered_names(doc: Mapping[str, Any]) -> Iterable[str]:
    """The caller fields ``doc``'s entry digest covers: those its ``covers`` names."""
    names = doc.get(COVERS_FIELD)
    return names if isinstance(names, list) else ()


def covered_metadata(doc: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of ``doc`` its entry digest covers (those present): all a reader may act on."""
    covered = {name: doc[name] for name in STORE_COVERED if name in doc}
    for name in _covered_names(doc):
        if name in doc:
            covered[name] = doc[name]
    return covered


def covered_bytes(doc: Mapping[str, Any]) -> bytes:
    """The canonical JSON of the covered fields of ``doc`` (those present): the store's own,
    its ``covers`` list, and the fields that list names."""
    covered = covered_metadata(doc)
    if COVERS_FIELD in doc:
        covered[COVERS_FIELD] = doc[COVERS_FIELD]
    return CANONICAL.encode(covered).encode()


def entry_digest(doc: Mapping[str, Any]) -> str:
    """The entry digest of a document: xxh3-128 of :func:`covered_bytes`."""
    return DIGEST_PREFIX + xxhash.xxh3_128_hexdigest(covered_bytes(doc))


def sign(doc: Mapping[str, Any], artifact_sha256: bytes, secret: bytes) -> str:
    """The HMAC-SHA256 of an entry under ``secret``: over the covered fields and the SHA-256 of
    the artifact bytes (``hashlib.sha256(data).digest()``), so the bytes themselves are
    authenticated, not only their non-cryptographic xxh3 digest."""
    covered = covered_bytes(doc)
    mac = hmac.new(secret, digestmod=hashlib.sha256)
    mac.update(len(covered).to_bytes(8, "big"))
    mac.update(covered)
    mac.update(artifact_sha256)
    return HMAC_PREFIX + mac.hexdigest()


def check_signature(doc: Mapping[str, Any], artifact_sha256: bytes, secret: bytes) -> str | None:
    """None if ``doc`` carries a valid signature (see :func:`sign`); else why not."""
    given = doc.get(HMAC_FIELD)
    if given is None:
        return "it is not signed"
    if not isinstance(given, str) or HMAC_PATTERN.fullmatch(given) is None:
        return "its signature is malformed"
    if not hmac.compare_digest(given, sign(doc, artifact_sha256, secret)):
        return "its signature does not match (signed with another key, or altered)"
    return None


# -- documents ------------------------------------------------------------------------------
def check_document(doc: Any, key: str) -> dict[str, Any] | Problem:
    """``doc`` if it is a valid metadata document of ``key`` (schema, entry digest, every field
    this process registers as covered that it holds covered by it, and the launch metadata its
    extension requires: :func:`~kernelcache.schema.fields.launch_problem`), else
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


# -- the contract of an entry -----------------------------------------------------------------
#: what starts the reason of an artifact that is not whole
NOT_WHOLE = "not a whole .{ext} artifact: "
#: how much of the contract :func:`entry_problem` checks: the artifact's size and digest only (a
#: document remembered with bytes found whole), less the checks whose cost grows with the
#: artifact (the PTX text scan: what a read checks), all of it
DIGEST_ONLY, CHEAP, FULL = 0, 1, 2


def entry_problem(
    ext: str, data: bytes, doc: Mapping[str, Any], *, check: int = FULL
) -> str | None:
    """Why ``data`` with its document ``doc`` (checked against the schema) is not a whole entry
    of extension ``ext``: its size or digest is not the document's, or (with ``check`` above
    :data:`DIGEST_ONLY`) the contract of an entry does not hold; None when it is whole. Every
    door applies it: a read, a remote value, a bundle, ``put`` and ``verify``. Never raises."""
    if len(data) != doc.get("size"):
        return f"artifact has {len(data)} bytes, metadata says {doc.get('size')!r:.40}"
    if digest(data) != doc.get("digest"):
        return "artifact digest mismatch"
    if check == DIGEST_ONLY:
        return None
    bad = launch_problem(ext, doc)
    if bad is not None:
        return bad
    if ext not in STRUCTURED:  # (a lowering, a decision: its kind checks what it holds)
        return None
    name = doc.get("name")
    whole = check == FULL
    reason = artifact_problem(ext, data, name if isinstance(name, str) else None, full=whole)
    return None if reason is None else NOT_WHOLE.format(ext=ext) + reason


def require_whole(key: str, ext: str, data: bytes, doc: Mapping[str, Any]) -> None:
    """Check an entry about to be written (:func:`entry_problem`, in full).

    Raises:
        ValueError: (:class:`~kernelcache.errors.IncompleteEntry`) it is not whole; the message
            says why and what to do.
    """
    reason = entry_problem(ext, data, doc)
    if reason is None:
        return
    if reason.startswith(NOT_WHOLE.format(ext=ext)):
        advice = (
            "store only the complete output of a compiler for the extension's machine (a .cubin "
            "is an ELF file for NVIDIA CUDA, a .hsaco one for AMD GPUs; a .ptx defines the "
            "kernel its metadata names and every function it calls)"
        )
    elif reason.startswith("artifact "):
        advice = "store a document made for these very bytes"
    else:
        advice = f"give put every launch field of a .{ext} entry"
    raise IncompleteEntry(
        f"kernelcache: cannot store {key}.{ext}: {reason}; {advice} (nothing was written)"
    )
