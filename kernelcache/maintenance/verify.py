"""``kernelcache verify``: a scan that also reads every artifact and checks its size, digest and
the contract of an entry in full (:func:`kernelcache.schema.entry_problem`: the artifact whole
for its extension, PTX text scan included, and the launch metadata its extension requires;
what ``put`` refuses, ``verify`` reports). Nothing here modifies an entry: repairs are planned
by :func:`kernelcache.maintenance.prune.plan_repair`.
"""

from __future__ import annotations

from ..keys import META_EXT
from ..store.entry import Artifact
from ..store.root import Store
from ..table import EntryInfo, EntryTable
from .records import CacheScan, Issue, Progress
from .scan import scan_store

__all__ = ["scan_store", "verify"]


def verify(
    store: Store, base: CacheScan | None = None, *, progress: Progress | None = None
) -> CacheScan:
    """A scan of ``store``'s root (``base``, default: :func:`~.scan.scan_store`) whose entries
    were each read and checked (size, digest, metadata, the contract of an entry in full, and
    the store's trust policy).

    Returns a new :class:`CacheScan`: entries that failed are moved from ``entries`` to
    ``issues`` (kind ``corrupt``, or ``untrusted`` for an entry the trust policy refuses).
    Reading leaves no trace (:meth:`Store.inspect`): no last-used stamp is touched.
    """
    if base is None:
        base = scan_store(store)
    good: list[EntryInfo] = []
    issues = list(base.issues)
    for count, entry in enumerate(base.entries, 1):
        result = store.inspect(entry.key, whole=True)
        if progress is not None and count % 64 == 0:
            progress(64)
        if isinstance(result, Artifact):
            good.append(entry)
        elif result is not None:  # None: deleted since the listing
            kind = "untrusted" if result.untrusted else "outdated" if result.outdated else "corrupt"
            issues.append(
                Issue(kind, f"{entry.key}.{META_EXT}", result.reason, entry.key, entry.nbytes)
            )
    if progress is not None and len(base.entries) % 64:
        progress(len(base.entries) % 64)
    return CacheScan(
        base.root,
        base.exists,
        EntryTable.from_rows(good),
        tuple(issues),
        base.temp,
        base.quarantine,
        base.scanned_at,
        base.logs,
    )
