"""The one schema of entry metadata.

What enters: metadata a caller gives to ``put`` and documents read back from a root, a remote
tier or a bundle. What leaves: a canonical JSON document (fields checked against their
declarations, the entry digest over the artifact and every covered field, an HMAC signature when
a signing key is set), or a :class:`~kernelcache.problem.Problem` saying why a document cannot be
served. Packages declare their own fields with :func:`register_fields`. Encoding and digests are
byte-identical across releases of the same ``FORMAT_VERSION``.
"""

from __future__ import annotations

from .digests import (
    check_signature,
    covered_bytes,
    covered_metadata,
    entry_digest,
    sign,
)
from .document import (
    build_metadata,
    check_document,
    check_written,
    displayable,
    encode_metadata,
    make_metadata,
    parse_fields,
    parse_metadata,
    written_document,
)
from .fields import (
    FIELDS,
    KERNEL_NAME,
    OWN_FIELDS,
    TARGET_NAME,
    Check,
    covered_fields,
    integer,
    objects,
    pattern,
    power_of_two,
    register_fields,
    text,
)
from .format import (
    COVERS_FIELD,
    DIGEST_PREFIX,
    FORMAT_VERSION,
    HMAC_FIELD,
    HMAC_PREFIX,
    MAX_ARTIFACT_BYTES,
    MAX_COVERED,
    MAX_DEPTH,
    MAX_FIELD_NAME,
    MAX_INT,
    MAX_META_BYTES,
    RESERVED_FIELDS,
    STORE_COVERED,
    digest,
)

__all__ = [
    "COVERS_FIELD",
    "DIGEST_PREFIX",
    "FIELDS",
    "FORMAT_VERSION",
    "HMAC_FIELD",
    "HMAC_PREFIX",
    "KERNEL_NAME",
    "MAX_ARTIFACT_BYTES",
    "MAX_COVERED",
    "MAX_DEPTH",
    "MAX_FIELD_NAME",
    "MAX_INT",
    "MAX_META_BYTES",
    "OWN_FIELDS",
    "RESERVED_FIELDS",
    "STORE_COVERED",
    "TARGET_NAME",
    "Check",
    "build_metadata",
    "check_document",
    "check_signature",
    "check_written",
    "covered_bytes",
    "covered_fields",
    "covered_metadata",
    "digest",
    "displayable",
    "encode_metadata",
    "entry_digest",
    "integer",
    "make_metadata",
    "objects",
    "parse_fields",
    "parse_metadata",
    "pattern",
    "power_of_two",
    "register_fields",
    "sign",
    "text",
    "written_document",
]
