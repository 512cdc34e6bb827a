"""Bundles: entries exported to one archive with a manifest, and imported into a root.

What enters: entries of a store (export), or an archive file (import). What leaves: an archive
whose manifest lists every member with its digest and a compatibility block, or entries
published into a root, all or nothing, after every member was checked against the schema, its
digest and (with a signing key) its signature.
"""

from __future__ import annotations

from ..errors import BundleError
from .archive import (
    BUNDLE_FORMAT,
    BUNDLE_VERSION,
    MANIFEST,
    MANIFEST_BASE,
    MANIFEST_ENTRY_MAX,
    MANIFEST_PER_ENTRY,
    MAX_MANIFEST_BYTES,
    MAX_MEMBER_BYTES,
    MEMBER_DIR,
    ExportResult,
    ImportResult,
    Progress,
)
from .export import (
    compatibility,
    export_bundle,
    resolve_compression,
)
from .importing import import_bundle
from .preflight import (
    manifest_limit,
)

__all__ = [
    "BUNDLE_FORMAT",
    "BUNDLE_VERSION",
    "MANIFEST",
    "MANIFEST_BASE",
    "MANIFEST_ENTRY_MAX",
    "MANIFEST_PER_ENTRY",
    "MAX_MANIFEST_BYTES",
    "MAX_MEMBER_BYTES",
    "MEMBER_DIR",
    "BundleError",
    "ExportResult",
    "ImportResult",
    "Progress",
    "compatibility",
    "export_bundle",
    "import_bundle",
    "manifest_limit",
    "resolve_compression",
]
