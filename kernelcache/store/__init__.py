"""One root on disk: the storage format, publish, verified reads, locks and removal.

What enters: a root directory (a path, resolved once), keys, artifact bytes and metadata. What
leaves: :class:`Artifact` values for verified reads, a :class:`~kernelcache.problem.Problem` for
entries that cannot be served, and files published atomically (the metadata file last, as the
commit marker). Files of a root are removed in one place (``removal.py``) or by the locks.
"""

from __future__ import annotations

from ..errors import WrongExt
from ..problem import Problem
from ..schema.document import (
    FORMAT_VERSION,
    MAX_META_BYTES,
    digest,
    encode_metadata,
    make_metadata,
    parse_metadata,
)
from ..schema.fields import RESERVED_FIELDS
from .entry import Artifact
from .layout import check_recorded, record_check, register_directory
from .root import Store
from .trust import TRUST_POLICIES

__all__ = [
    "FORMAT_VERSION",
    "MAX_META_BYTES",
    "RESERVED_FIELDS",
    "TRUST_POLICIES",
    "Artifact",
    "Problem",
    "Store",
    "WrongExt",
    "check_recorded",
    "digest",
    "encode_metadata",
    "make_metadata",
    "parse_metadata",
    "record_check",
    "register_directory",
]
