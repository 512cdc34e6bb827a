"""What writing and removal work on of a :class:`~kernelcache.store.root.Store`: its root and
settings, its trust policy, its memo of checked documents, its lock and its fresh read
(:class:`StoreState`, which a Store is).

The functions of :mod:`.writing` and :mod:`.removal` take the store itself first, typed by this
protocol, so that they need not import :mod:`.root` (which calls them): a store's locks and
reads are what its own methods take and return (a caller, or a test, that wraps one sees it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from ..problem import Problem
from .entry import Artifact
from .trust import TrustPolicy

if TYPE_CHECKING:
    from .locks.locker import Held


class StoreState(Protocol):
    """An open root, as a :class:`~kernelcache.store.root.Store` holds it."""

    #: the root directory (absolute), and it with a separator: an entry's file is ``prefix + name``
    root: str
    prefix: str
    #: only read: no lock, touch or quarantine
    readonly: bool
    #: seconds an operation waits for a key's lock unless told otherwise
    lock_timeout: float
    #: the trust policy applied to the root's files
    policy: TrustPolicy
    #: how new artifacts are written: "none" or "zstd" (:mod:`.compression`)
    compression: str
    #: checked metadata by key, and when its last-used stamp is due
    memo: dict[str, tuple[dict[str, Any], float]]

    def lock(self, key: str, *, shared: bool, timeout: float | None = None) -> Held | None: ...

    def read(
        self, key: str, ext: str | None = None, *, fresh: bool = False
    ) -> Artifact | Problem | None: ...
