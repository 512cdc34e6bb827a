"""The one schema of an entry's metadata, applied wherever metadata comes in: files of a root,
Redis values, bundles, and ``put``.

A metadata document is a JSON object. The store writes ``format``, ``key``, ``ext``, ``size``,
``digest`` (xxh3-128 of the artifact), ``covers`` and ``entry_digest``; callers add fields of
their own. Known fields have a type and a range (:data:`FIELDS`: kernelcache's own, plus those a
package built on it declares with :func:`register_fields`); any other field is allowed if it is
plain, bounded JSON (finite numbers, 64-bit integers, valid UTF-8 strings, nesting at most
:data:`MAX_DEPTH` deep). A whole document is at most :data:`MAX_META_BYTES` encoded.

The **entry digest** is the xxh3-128 of the canonical JSON of the store's own fields (which
include the artifact's digest, so the artifact bytes are covered through it), of the
document's ``covers`` list itself, and of the caller fields that list names: every field
registered as covered when it was written (what a kernel is launched or embedded with), present
or not, so that a field added later is damage too. A document carries its ``covers``, so any
reader checks it without knowing who wrote it. A flipped bit in a covered field, or in the
list of what is covered, is a corrupt entry, as a flipped bit in the artifact is. Fields
outside that set (``created``, ``producer``, ...) are checked against the schema but may change
(tools rewrite ``created``; last use is the file's mtime).

What a document covers is its writer's to decide, and no one else's. A reader never widens it:
a document read from a remote tier, copied to another tier, published from a remote hit or
imported from a bundle is kept as written (:func:`check_written`: the same fields, covers
and entry digest; only a signature is dropped on the way into a root). A document that holds a
field this process registers as covered without covering it (a launch field another package
registered, from a writer that did not cover it) is a **miss**, never served with that field
ignored: nothing vouches for the value, and a kernel is never launched with a default in its
place. It is not corrupt (nothing in it contradicts its digest): it is outdated, rebuilt by the
next put, deleted by ``verify --repair`` and ``prune``, and a remote value is deleted like one
of an earlier format. A field this process registers as covered that the document neither
holds nor covers is nothing to act on.

Format 2 documents are the only ones served: format 1 digests did not cover the ``covers``
list, so its documents are outdated misses (rebuilt), never an exception and never served.

An entry digest detects damage, not forgery: anyone who can write an entry can recompute it.
What is local is protected by the trust policy (:mod:`kernelcache.store`); what comes from
outside the machine (Redis values, bundles) can carry an HMAC-SHA256 (:func:`sign`) made with a
shared key, over the covered fields (``covers`` included) and the artifact bytes themselves.

Every check returns a reason instead of raising: nothing here trusts its input, and nothing
here crashes on it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import re
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import xxhash

from ._version import __version__
from .errors import DeclarationError, InvalidMetadata
from .jsonio import load_json
from .keys import EXT_PATTERN, KEY_PATTERN, META_EXT
from .problem import Problem

#: the version of the metadata document (2: the entry digest and a signature cover the
#: ``covers`` list); documents of an earlier format are misses (rebuilt), never served
FORMAT_VERSION = 2
DIGEST_PREFIX = "xxh3_128:"
HMAC_PREFIX = "hmac-sha256:"
#: the largest metadata document accepted, encoded
MAX_META_BYTES = 64 << 10
#: the largest artifact an entry may describe
MAX_ARTIFACT_BYTES = 1 << 40
#: bounds of plain JSON in fields the schema does not know
MAX_DEPTH = 16
MAX_INT = (1 << 63) - 1
MAX_FIELD_NAME = 64
#: the store's own fields that the entry digest (and a signature) covers
STORE_COVERED = ("format", "key", "ext", "size", "digest")
#: the list of caller fields a document's entry digest covers
COVERS_FIELD = "covers"
#: the HMAC of a Redis value or a bundle entry; never stored in a root
HMAC_FIELD = "hmac"
#: fields only the store writes; callers' metadata may not set them
RESERVED_FIELDS = frozenset({"format", "key", "ext", "size", "digest", "entry_digest", HMAC_FIELD})
#: the most caller fields one document's entry digest covers
MAX_COVERED = 64

_DIGEST = re.compile(r"xxh3_128:[0-9a-f]{32}")
_HMAC = re.compile(r"hmac-sha256:[0-9a-f]{64}")


def digest(data: bytes | memoryview) -> str:
    """The digest recorded for an artifact: ``xxh3_128:<32 hex digits>``."""
    return DIGEST_PREFIX + xxhash.xxh3_128_hexdigest(data)


def _show(value: object) -> str:
    """A short, printable rendering of a hostile value for a message."""
    text = repr(value) if not isinstance(value, int) or abs(value) < 10**20 else "a huge integer"
    return text if len(text) <= 40 else text[:37] + "..."


# -- field checks: each returns None, or what is wrong ------------------------------------------
Check = Callable[[Any], "str | None"]


def integer(low: int, high: int) -> Check:
    """An integer from ``low`` to ``high``."""

    def check(value: Any) -> str | None:
        if type(value) is not int:
            return f"must be an integer, not {_show(value)}"
        if not low <= value <= high:
            return f"must be between {low} and {high}, not {_show(value)}"
        return None

    check.bounds = (low, high)  # type: ignore[attr-defined]  # the fast path of _check_fields
    return check


def text(limit: int) -> Check:
    """Printable text of 1 to ``limit`` characters."""

    def check(value: Any) -> str | None:
        if not isinstance(value, str):
            return f"must be a string, not {_show(value)}"
        if not 0 < len(value) <= limit:
            return f"must be 1 to {limit} characters"
        if not value.isprintable():  # control characters, lone surrogates
            return f"must be printable text, not {_show(value)}"
        return None

    return check


def pattern(regex: re.Pattern[str], what: str) -> Check:
    """A string that ``regex`` matches whole (``what`` says what it must be)."""

    def check(value: Any) -> str | None:
        if not isinstance(value, str) or regex.fullmatch(value) is None:
            return f"must be {what}, not {_show(value)}"
        return None

    return check


#: ``covers`` lists found valid (most documents of a root name the same fields)
_valid_covers: set[tuple[str, ...]] = set()


def _covers(value: Any) -> str | None:
    known = tuple(value) if type(value) is list else None
    try:
        if known in _valid_covers:  # equal to a list of names found valid: one
            return None
    except TypeError:  # holds an unhashable value: checked below, and refused
        known = None
    if (
        not isinstance(value, list)
        or len(value) > MAX_COVERED
        or not all(_valid_name(v) and v not in RESERVED_FIELDS for v in value)
        or value != sorted(set(value))
    ):
        return f"must be a sorted list of at most {MAX_COVERED} field names, not {_show(value)}"
    if known is not None and len(_valid_covers) < 64:
        _valid_covers.add(known)  # (every item is a valid name: a str)
    return None


#: what a target name looks like to kernelcache, which gives targets no meaning (a package
#: built on it may register a stricter check): at most 64 letters, digits and ``_.+-``, in
#: parts separated by single colons (``cuda:90``, ``hip:gfx90a:xnack-``; not ``cuda:``)
_TARGET = re.compile(r"(?=.{1,64}\Z)[A-Za-z0-9][A-Za-z0-9_.+-]*(?::[A-Za-z0-9_.+-]+)*", re.DOTALL)
#: kernelcache's own rules for the two fields operators select entries by (``--target``,
#: ``--kernel``), whatever stricter checks packages register
TARGET_NAME = pattern(_TARGET, "a target name such as cuda:90")
KERNEL_NAME = text(1024)


def _time(value: Any) -> str | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"must be a Unix time, not {_show(value)}"
    if not (0 <= value <= 1e11) or (isinstance(value, float) and not math.isfinite(value)):
        return f"must be a Unix time (0 to 1e11), not {_show(value)}"
    return None


_NAME_TEXT, _VERSION_TEXT = text(MAX_FIELD_NAME), text(128)
#: ``producer`` objects found valid, as their items
_valid_producers: set[tuple[tuple[str, str], ...]] = set()


def _producer(value: Any) -> str | None:
    if not isinstance(value, dict) or len(value) > 32:
        return f"must be an object of package versions, not {_show(value)}"
    items = tuple(value.items())
    if all(type(n) is str and type(v) is str for n, v in items) and items in _valid_producers:
        return None
    for name, version in items:
        bad = _NAME_TEXT(name) or _VERSION_TEXT(version)
        if bad:
            return f"must map package names to version strings ({_show(name)}: {bad})"
    if len(_valid_producers) < 64:
        _valid_producers.add(items)
    return None


def objects(limit: int) -> Check:
    """A list of at most ``limit`` JSON objects of plain, bounded JSON."""

    def check(value: Any) -> str | None:
        if not isinstance(value, list) or len(value) > limit:
            return f"must be a list of at most {limit} objects, not {_show(value)}"
        for item in value:
            if not isinstance(item, dict):
                return f"must be a list of objects, not of {_show(item)}"
        return _plain(value)

    return check


def power_of_two(high: int) -> Check:
    """A power of two from 1 to ``high``."""
    bounded = integer(1, high)

    def check(value: Any) -> str | None:
        bad = bounded(value)
        if bad is None and value & (value - 1):
            return f"must be a power of two, not {value}"
        return bad

    return check


#: the fields a document may hold and what each must be: kernelcache's own (below), and those
#: registered by packages built on it (:func:`register_fields`)
FIELDS: dict[str, Check] = {
    "created": _time,
    "producer": _producer,
    "name": KERNEL_NAME,
    "target": TARGET_NAME,
    "kind": text(64),
    "of": pattern(KEY_PATTERN, "a cache key"),
    COVERS_FIELD: _covers,
}
#: the fields kernelcache itself gives a meaning
OWN_FIELDS = frozenset(FIELDS)
#: integer fields and their ranges, checked inline by _check_fields (the common case)
_INT_RANGES: dict[str, tuple[int, int]] = {}
#: the caller fields the entry digest of a new document covers: kernelcache's own (an entry's
#: name and target, which operators select by) and those registered as covered
_covered: set[str] = {"name", "target"}


def register_fields(checks: Mapping[str, Check], *, covered: frozenset[str] = frozenset()) -> None:
    """Declare the metadata fields of a package built on kernelcache: what each must be, and
    which of them the entry digest of every new document covers (those a reader acts on).

    A check for a field that already has one is added to it: a value must pass both.
    Declaring the same check again is a no-op.

    Raises:
        ValueError: a reserved field, a name that is not a field name, or too many covered
            fields.
    """
    for name, check in checks.items():
        if not name or name in RESERVED_FIELDS or name == COVERS_FIELD or not _valid_name(name):
            raise DeclarationError(f"{name!r} cannot be declared as a metadata field")
        known = FIELDS.get(name)
        if known is None:
            FIELDS[name] = check
        elif check is not known and check not in getattr(known, "parts", ()):
            FIELDS[name] = _both(known, check)
        bounds = getattr(check, "bounds", None)
        if known is None and bounds is not None:
            _INT_RANGES[name] = bounds
    unknown = set(covered) - FIELDS.keys()
    if unknown or len(_covered | set(covered)) > MAX_COVERED:
        raise DeclarationError(f"covered fields must be declared fields (at most {MAX_COVERED})")
    _covered.update(covered)


def _valid_name(name: object) -> bool:
    return isinstance(name, str) and len(name) <= MAX_FIELD_NAME and _utf8(name)


def _both(first: Check, second: Check) -> Check:
    def check(value: Any) -> str | None:
        return first(value) or second(value)

    check.parts = (first, second)  # type: ignore[attr-defined]
    return check


def covered_fields() -> frozenset[str]:
    """The caller fields the entry digest of a document written now covers."""
    return frozenset(_covered)


def _plain(value: Any, depth: int = 0) -> str | None:
    """None if ``value`` is plain, bounded JSON; else what is wrong with it."""
    kind = type(value)
    if kind is str:
        return None if value.isascii() or _utf8(value) else "holds a string that is not valid UTF-8"
    if kind is int:
        return None if -MAX_INT <= value <= MAX_INT else "holds an integer beyond 64 bits"
    if value is None or kind is bool:
        return None
    if kind is float:
        return None if math.isfinite(value) else f"holds {_show(value)}"
    if depth >= MAX_DEPTH and isinstance(value, (dict, list, tuple)):
        return f"nests deeper than {MAX_DEPTH} levels"
    if isinstance(value, dict):
        for name, item in value.items():
            if type(name) is not str or not (name.isascii() or _utf8(name)):
                return "holds a name that is not valid UTF-8"
            if type(item) is not str or not item.isascii():
                bad = _plain(item, depth + 1)
                if bad:
                    return bad
        return None
    if isinstance(value, (list, tuple)):  # a tuple is written as a list
        for item in value:
            if type(item) is not str or not item.isascii():
                bad = _plain(item, depth + 1)
                if bad:
                    return bad
        return None
    if isinstance(value, (str, int, float)):  # subclasses (bool was handled above)
        return _plain(kind.__mro__[-2](value), depth)
    return f"holds a {kind.__name__}, which is not JSON"


def _utf8(text: str) -> bool:
    """Whether ``text`` encodes as UTF-8 (no lone surrogates)."""
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _check_fields(doc: Mapping[str, Any]) -> str | None:
    """What is wrong with the fields of ``doc`` other than the store's own; None if nothing."""
    ranges = _INT_RANGES
    for name, value in doc.items():
        bounds = ranges.get(name)
        if bounds is not None and type(value) is int and bounds[0] <= value <= bounds[1]:
            continue
        check = FIELDS.get(name)
        if check is not None:
            bad = check(value)
            if bad:
                return f"metadata field {name!r} {bad}"
        elif name not in RESERVED_FIELDS:
            if not _valid_name(name):
                return f"metadata field {_show(name)} has an invalid name"
            bad = _plain(value)
            if bad:
                return f"metadata field {name!r} {bad}"
    return None


# -- the entry digest and signatures -------------------------------------------------------------
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), allow_nan=False)


def _covered_names(doc: Mapping[str, Any]) -> Iterable[str]:
    """The caller fields ``doc``'s entry digest covers: those its ``covers`` names."""
    names = doc.get(COVERS_FIELD)
    return names if isinstance(names, list) else ()


def covered_bytes(doc: Mapping[str, Any]) -> bytes:
    """The canonical JSON of the covered fields of ``doc`` (those present): the store's own,
    its ``covers`` list, and the fields that list names."""
    covered = covered_metadata(doc)
    if COVERS_FIELD in doc:
        covered[COVERS_FIELD] = doc[COVERS_FIELD]
    return _CANONICAL.encode(covered).encode()


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
    if not isinstance(given, str) or _HMAC.fullmatch(given) is None:
        return "its signature is malformed"
    if not hmac.compare_digest(given, sign(doc, artifact_sha256, secret)):
        return "its signature does not match (signed with another key, or altered)"
    return None


# -- whole documents -------------------------------------------------------------------------------
def check_document(doc: Any, key: str) -> dict[str, Any] | Problem:
    """``doc`` if it is a valid metadata document of ``key`` (schema, entry digest, and every
    field this process registers as covered that it holds covered by it), else
    :class:`~kernelcache.errors.Problem`. Never raises."""
    if not isinstance(doc, dict):
        return Problem(key, "metadata is not a JSON object")
    fmt = doc.get("format")
    if type(fmt) is not int or fmt != FORMAT_VERSION:
        if type(fmt) is int and 0 < fmt < FORMAT_VERSION and doc.get("key") == key:
            return _outdated(doc, key, f"written by an older kernelcache (format {fmt})")
        return Problem(key, f"unsupported metadata format {_show(fmt)}")
    if doc.get("key") != key:
        return Problem(key, "metadata names another key")
    ext = doc.get("ext")
    if not _valid_ext(ext):
        return Problem(key, "metadata has an invalid ext")
    size = doc.get("size")
    if type(size) is not int or not 0 <= size <= MAX_ARTIFACT_BYTES:
        return Problem(key, "metadata has an invalid size")
    dig = doc.get("digest")
    if not isinstance(dig, str) or _DIGEST.fullmatch(dig) is None:
        return Problem(key, "metadata has an invalid digest")
    mac = doc.get(HMAC_FIELD)
    if mac is not None and (not isinstance(mac, str) or _HMAC.fullmatch(mac) is None):
        return Problem(key, "metadata has an invalid signature field")
    if COVERS_FIELD not in doc:
        return Problem(key, f"metadata has no {COVERS_FIELD!r} list")
    bad = _check_fields(doc)
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
    if _covered.issubset(covers):  # what writers of this installation write: one pass
        return doc
    uncovered = sorted(name for name in _covered if name in doc and name not in covers)
    if uncovered:
        return _outdated(
            doc,
            key,
            f"its digest does not cover {', '.join(uncovered)}, which this process requires "
            "covered (its writer did not cover them)",
        )
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
    return _CANONICAL.encode(doc).encode()


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
            f"versions, not {_show(producer)}"
        )
    producer = dict(producer)
    producer.setdefault("kernelcache", __version__)
    given = doc.get(COVERS_FIELD, ())
    if not isinstance(given, (list, tuple)) or not all(isinstance(n, str) for n in given):
        raise InvalidMetadata(
            f"metadata for {key}: metadata field {COVERS_FIELD!r} must be a list of field names"
        )
    doc[COVERS_FIELD] = sorted(_covered.union(given))
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
            raise InvalidMetadata(f"metadata for {key}: field name {_show(name)} is not a string")
        bad = _plain(value)
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
    bad = _check_fields(normalized)
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
    at most :data:`MAX_META_BYTES` encoded; else a :class:`~kernelcache.errors.Problem`. What
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
        return value if _utf8(value) else value.encode("utf-8", "backslashreplace").decode()
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return value if -MAX_INT <= value <= MAX_INT else _show(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if depth >= MAX_DEPTH:
        return "..."
    if isinstance(value, list):
        return [displayable(v, depth + 1) for v in value]
    if isinstance(value, dict):
        return {displayable(str(k)): displayable(v, depth + 1) for k, v in value.items()}
    return repr(value)


def covered_metadata(doc: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of ``doc`` its entry digest covers (those present): all a reader may act on."""
    covered = {name: doc[name] for name in STORE_COVERED if name in doc}
    for name in _covered_names(doc):
        if name in doc:
            covered[name] = doc[name]
    return covered
