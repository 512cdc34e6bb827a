"""The one schema of an entry's metadata, applied wherever metadata comes in: files of a root,
Redis values, bundles, and ``put``.

A metadata document is a JSON object. The store writes ``format``, ``key``, ``ext``, ``size``,
``digest`` (xxh3-128 of the artifact) and ``entry_digest``; callers add fields of their own.
Known fields have a type and a range (:data:`FIELDS`); any other field is allowed if it is plain,
bounded JSON (finite numbers, 64-bit integers, valid UTF-8 strings, nesting at most
:data:`MAX_DEPTH` deep). A whole document is at most :data:`MAX_META_BYTES` encoded.

The **entry digest** is the xxh3-128 of the canonical JSON of the :data:`COVERED_FIELDS`: the
store's own fields (which include the artifact's digest, so the artifact bytes are covered
through it) and every field the bridge launches or embeds a kernel with
(:data:`LAUNCH_FIELDS`). A flipped bit in any of them is a corrupt entry, as a flipped bit in
the artifact is. Fields outside that set (``created``, ``producer``, ...) are checked against
the schema but may change (tools rewrite ``created``; last use is the file's mtime).

An entry digest detects damage, not forgery: anyone who can write an entry can recompute it.
What is local is protected by the trust policy (:mod:`kernelcache.store`); what comes from
outside the machine (Redis values, bundles) can carry an HMAC-SHA256 (:func:`sign`) made with a
shared key, over the covered fields and the artifact bytes themselves.

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
from collections.abc import Callable, Mapping
from typing import Any

import xxhash

from ._version import __version__
from .errors import Problem
from .jsonio import load_json
from .keys import EXT_PATTERN, KEY_PATTERN, META_EXT
from .target_names import parse_target_name

#: the version of the metadata document; entries of this format without an entry digest were
#: written by earlier versions and are misses (rebuilt), never served
FORMAT_VERSION = 1
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
#: what the bridge launches or embeds a kernel with: covered by the entry digest
LAUNCH_FIELDS = (
    "name",
    "target",
    "arch",
    "warp_size",
    "num_warps",
    "num_ctas",
    "shared",
    "global_scratch_size",
    "global_scratch_align",
    "profile_scratch_size",
    "tmem_size",
    "tensordesc_meta",
    "ptx_sha256",
)
#: the fields the entry digest (and a signature) covers
COVERED_FIELDS = ("format", "key", "ext", "size", "digest", *LAUNCH_FIELDS)
#: the HMAC of a Redis value or a bundle entry; never stored in a root
HMAC_FIELD = "hmac"
#: fields only the store writes; callers' metadata may not set them
RESERVED_FIELDS = frozenset({"format", "key", "ext", "size", "digest", "entry_digest", HMAC_FIELD})

_DIGEST = re.compile(r"xxh3_128:[0-9a-f]{32}")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_HMAC = re.compile(r"hmac-sha256:[0-9a-f]{64}")
_U32 = (1 << 32) - 1


def digest(data: bytes | memoryview) -> str:
    """The digest recorded for an artifact: ``xxh3_128:<32 hex digits>``."""
    return DIGEST_PREFIX + xxhash.xxh3_128_hexdigest(data)


def _show(value: object) -> str:
    """A short, printable rendering of a hostile value for a message."""
    text = repr(value) if not isinstance(value, int) or abs(value) < 10**20 else "a huge integer"
    return text if len(text) <= 40 else text[:37] + "..."


# -- field checks: each returns None, or what is wrong ------------------------------------------
Check = Callable[[Any], "str | None"]


#: integer fields and their ranges, checked inline by _check_fields (the common case)
_INT_RANGES: dict[str, tuple[int, int]] = {}


def _int(low: int, high: int) -> Check:
    def check(value: Any) -> str | None:
        if type(value) is not int:
            return f"must be an integer, not {_show(value)}"
        if not low <= value <= high:
            return f"must be between {low} and {high}, not {_show(value)}"
        return None

    return check


def _text(limit: int) -> Check:
    def check(value: Any) -> str | None:
        if not isinstance(value, str):
            return f"must be a string, not {_show(value)}"
        if not 0 < len(value) <= limit:
            return f"must be 1 to {limit} characters"
        if not value.isprintable():  # control characters, lone surrogates
            return f"must be printable text, not {_show(value)}"
        return None

    return check


def _pattern(regex: re.Pattern[str], what: str) -> Check:
    def check(value: Any) -> str | None:
        if not isinstance(value, str) or regex.fullmatch(value) is None:
            return f"must be {what}, not {_show(value)}"
        return None

    return check


def _target(value: Any) -> str | None:
    if not isinstance(value, str) or len(value) > 64:
        return f"must be a target name such as cuda:90 or hip:gfx942, not {_show(value)}"
    try:
        parse_target_name(value)
    except ValueError:
        return f"must be a target name such as cuda:90 or hip:gfx942, not {_show(value)}"
    return None


def _descriptors(value: Any) -> str | None:
    if not isinstance(value, list) or len(value) > 64:
        return f"must be a list of at most 64 objects, not {_show(value)}"
    for item in value:
        if not isinstance(item, dict):
            return f"must be a list of objects, not of {_show(item)}"
    return _plain(value)


def _time(value: Any) -> str | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"must be a Unix time, not {_show(value)}"
    if not (0 <= value <= 1e11) or (isinstance(value, float) and not math.isfinite(value)):
        return f"must be a Unix time (0 to 1e11), not {_show(value)}"
    return None


def _producer(value: Any) -> str | None:
    if not isinstance(value, dict) or len(value) > 32:
        return f"must be an object of package versions, not {_show(value)}"
    for name, version in value.items():
        bad = _text(MAX_FIELD_NAME)(name) or _text(128)(version)
        if bad:
            return f"must map package names to version strings ({_show(name)}: {bad})"
    return None


def _power_of_two(value: Any) -> str | None:
    bad = _int(1, 1 << 20)(value)
    if bad is None and value & (value - 1):
        return f"must be a power of two, not {value}"
    return bad


#: the fields the store and the bridge know, and what each must be
FIELDS: dict[str, Check] = {
    "created": _time,
    "producer": _producer,
    "name": _text(1024),
    "kernel": _text(1024),
    "language": _text(64),
    "target": _target,
    "arch": _text(64),
    "warp_size": _int(1, 1024),
    "num_warps": _int(1, 1024),
    "num_ctas": _int(1, 1024),
    "num_stages": _int(0, 1024),
    "shared": _int(0, _U32),
    "global_scratch_size": _int(0, _U32),
    "global_scratch_align": _power_of_two,
    "profile_scratch_size": _int(0, _U32),
    "tmem_size": _int(0, _U32),
    "tensordesc_meta": _descriptors,
    "ptx_sha256": _pattern(_SHA256, "64 lowercase hexadecimal digits"),
    "kind": _text(64),
    "of": _pattern(KEY_PATTERN, "a cache key"),
}
_INT_RANGES.update(
    {
        "warp_size": (1, 1024),
        "num_warps": (1, 1024),
        "num_ctas": (1, 1024),
        "num_stages": (0, 1024),
        "shared": (0, _U32),
        "global_scratch_size": (0, _U32),
        "profile_scratch_size": (0, _U32),
        "tmem_size": (0, _U32),
    }
)


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
            if not isinstance(name, str) or len(name) > MAX_FIELD_NAME or not _utf8(name):
                return f"metadata field {_show(name)} has an invalid name"
            bad = _plain(value)
            if bad:
                return f"metadata field {name!r} {bad}"
    return None


# -- the entry digest and signatures -------------------------------------------------------------
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), allow_nan=False)


def covered_bytes(doc: Mapping[str, Any]) -> bytes:
    """The canonical JSON of the fields :data:`COVERED_FIELDS` names (those present)."""
    covered = {name: doc[name] for name in COVERED_FIELDS if name in doc}
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
def check_document(doc: Any, key: str, *, require_digest: bool = True) -> dict[str, Any] | Problem:
    """``doc`` if it is a valid metadata document of ``key`` (schema and entry digest), else
    :class:`~kernelcache.errors.Problem`. Never raises. With ``require_digest=False`` a document without an entry
    digest is accepted (bundles of older versions); one with a wrong digest never is."""
    if not isinstance(doc, dict):
        return Problem(key, "metadata is not a JSON object")
    fmt = doc.get("format")
    if type(fmt) is not int or fmt != FORMAT_VERSION:
        return Problem(key, f"unsupported metadata format {_show(fmt)}")
    if doc.get("key") != key:
        return Problem(key, "metadata names another key")
    ext = doc.get("ext")
    if not isinstance(ext, str) or EXT_PATTERN.fullmatch(ext) is None or ext == META_EXT:
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
    bad = _check_fields(doc)
    if bad:
        return Problem(key, bad)
    stated = doc.get("entry_digest")
    if stated is None:
        if require_digest:
            return Problem(
                key,
                "written by an older kernelcache (no entry digest): rebuilt on next use",
                corrupt=False,
                outdated=True,
                ext=doc["ext"],
            )
        return doc
    if not isinstance(stated, str) or stated != entry_digest(doc):
        return Problem(key, "entry digest mismatch: the launch metadata was altered or damaged")
    return doc


def parse_metadata(raw: bytes, key: str) -> dict[str, Any] | Problem:
    """Parse and check the bytes of a metadata document (see :func:`check_document`)."""
    if len(raw) > MAX_META_BYTES:
        return Problem(key, "metadata is too large")
    try:
        doc = load_json(raw)
    except ValueError as e:
        return Problem(key, f"unreadable metadata ({e.__class__.__name__})")
    return check_document(doc, key)


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
        raise ValueError(f"metadata for {key} must be a mapping, not {type(meta).__name__}")
    clash = RESERVED_FIELDS.intersection(name for name in meta if isinstance(name, str))
    if clash:
        raise ValueError(f"metadata may not set the reserved field(s) {sorted(clash)}")
    doc: dict[str, Any] = dict(meta)
    producer = doc.get("producer")
    if producer is None:
        producer = {}
    if not isinstance(producer, Mapping):
        raise ValueError(
            f"metadata for {key}: metadata field 'producer' must be an object of package "
            f"versions, not {_show(producer)}"
        )
    producer = dict(producer)
    producer.setdefault("kernelcache", __version__)
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
            raise ValueError(f"metadata for {key}: field name {_show(name)} is not a string")
        bad = _plain(value)
        if bad:
            raise ValueError(f"metadata for {key}: metadata field {name!r} {bad}")
    try:
        raw = encode_metadata(doc)
    except (TypeError, ValueError, RecursionError) as e:
        raise ValueError(f"metadata for {key} is not JSON-serializable: {e}") from None
    if len(raw) > MAX_META_BYTES - 128:  # room for the entry digest
        largest = max(doc, key=lambda name: len(encode_metadata({name: doc[name]})))
        raise ValueError(
            f"metadata for {key} is {len(raw)} bytes encoded, more than the limit of "
            f"{MAX_META_BYTES}; its largest field is {largest!r}"
        )
    normalized = load_json(raw)  # tuples become lists: what every reader will see
    bad = _check_fields(normalized)
    if bad:
        raise ValueError(f"metadata for {key}: {bad}")
    normalized["entry_digest"] = entry_digest(normalized)
    return normalized


def make_metadata(key: str, ext: str, data: bytes, meta: Mapping[str, Any]) -> dict[str, Any]:
    """The metadata document stored beside ``data`` (see :func:`build_metadata`).

    Raises:
        ValueError: a reserved or invalid field; the message names it.
    """
    return build_metadata(key, ext, len(data), digest(data), meta)


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
    """The fields of ``doc`` the entry digest covers: all a kernel may be launched with."""
    return {name: doc[name] for name in COVERED_FIELDS if name in doc}
