"""The storage format's constants: the document version, digest and signature prefixes, the bounds
of a document, the fields the store itself writes, and the artifact digest (xxh3-128).

Changing any value here changes what is on disk: documents written with other values are
outdated or corrupt to this reader.
"""

from __future__ import annotations

import re

import xxhash

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

DIGEST = re.compile(r"xxh3_128:[0-9a-f]{32}")
HMAC_PATTERN = re.compile(r"hmac-sha256:[0-9a-f]{64}")


def digest(data: bytes | memoryview) -> str:
    """The digest recorded for an artifact: ``xxh3_128:<32 hex digits>``."""
    return DIGEST_PREFIX + xxhash.xxh3_128_hexdigest(data)


def shown_value(value: object) -> str:
    """A short, printable rendering of a hostile value for a message."""
    text = repr(value) if not isinstance(value, int) or abs(value) < 10**20 else "a huge integer"
    return text if len(text) <= 40 else text[:37] + "..."
