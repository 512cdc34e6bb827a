"""The one schema of entry metadata, and the one contract of an entry.

What enters: metadata a caller gives to ``put`` and documents read back from a root, a remote
tier or a bundle. What leaves: a canonical JSON document (fields checked against their
declarations, the entry digest over the artifact and every covered field, an HMAC signature when
a signing key is set), or a :class:`~kernelcache.problem.Problem` saying why a document cannot be
served. The launch metadata of machine code is kernelcache's own (:mod:`.fields`); packages
declare their own fields with :func:`register_fields`. :func:`entry_problem` (:mod:`.document`)
is what every door checks of an entry (its artifact whole for its extension, its launch
metadata there): ``put``, ``verify``, remote values, bundles and reads (its module says who
calls it, and how). Encoding and digests are byte-identical across releases of the same
``FORMAT_VERSION``.
"""

from __future__ import annotations

from .document import (
    DIGEST_PREFIX,
    FORMAT_VERSION,
    HMAC_PREFIX,
    MAX_ARTIFACT_BYTES,
    MAX_META_BYTES,
    build_metadata,
    check_document,
    check_signature,
    check_written,
    covered_bytes,
    covered_metadata,
    digest,
    displayable,
    encode_metadata,
    entry_digest,
    entry_problem,
    make_metadata,
    parse_fields,
    parse_metadata,
    require_whole,
    sign,
    written_document,
)
from .fields import (
    COVERS_FIELD,
    FIELDS,
    HMAC_FIELD,
    KERNEL_NAME,
    LAUNCH_CHECKS,
    LAUNCH_FIELDS,
    MAX_COVERED,
    MAX_DEPTH,
    MAX_FIELD_NAME,
    MAX_INT,
    OWN_FIELDS,
    REQUIRED,
    RESERVED_FIELDS,
    STORE_COVERED,
    TARGET_NAME,
    FieldCheck,
    covered_fields,
    integer,
    launch_problem,
    objects,
    pattern,
    power_of_two,
    register_fields,
    text,
)

__all__ = [
    "COVERS_FIELD",
    "DIGEST_PREFIX",
    "FIELDS",
    "FORMAT_VERSION",
    "HMAC_FIELD",
    "HMAC_PREFIX",
    "KERNEL_NAME",
    "LAUNCH_CHECKS",
    "LAUNCH_FIELDS",
    "MAX_ARTIFACT_BYTES",
    "MAX_COVERED",
    "MAX_DEPTH",
    "MAX_FIELD_NAME",
    "MAX_INT",
    "MAX_META_BYTES",
    "OWN_FIELDS",
    "REQUIRED",
    "RESERVED_FIELDS",
    "STORE_COVERED",
    "TARGET_NAME",
    "FieldCheck",
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
    "entry_problem",
    "integer",
    "launch_problem",
    "make_metadata",
    "objects",
    "parse_fields",
    "parse_metadata",
    "pattern",
    "power_of_two",
    "register_fields",
    "require_whole",
    "sign",
    "text",
    "written_document",
]
