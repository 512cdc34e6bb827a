"""The entry digest and signatures of a metadata document.

The **entry digest** is the xxh3-128 of the canonical JSON of the store's own fields (which
include the artifact's digest, so the artifact bytes are covered through it), of the document's
``covers`` list itself, and of the caller fields that list names. A flipped bit in a covered
field, or in the list of what is covered, is a corrupt entry, as a flipped bit in the artifact is.

An entry digest detects damage, not forgery: anyone who can write an entry can recompute it.
What comes from outside the machine (Redis values, bundles) can carry an HMAC-SHA256
(:func:`sign`) made with a shared key, over the covered fields (``covers`` included) and the
artifact bytes themselves. The canonical encoding is byte-identical across releases of one
format version.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Iterable, Mapping
from typing import Any

import xxhash

from .format import (
    COVERS_FIELD,
    DIGEST_PREFIX,
    HMAC_FIELD,
    HMAC_PATTERN,
    HMAC_PREFIX,
    STORE_COVERED,
)

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
