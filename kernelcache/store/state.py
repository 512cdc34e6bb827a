"""What a :class:`~kernelcache.store.root.Store` works on: one root directory opened with its
settings (:class:`StoreState`), and the way a store takes a key's lock (:func:`take_lock`).

The functions of :mod:`.reading`, :mod:`.removal` and :mod:`.writing` take a store's state as
their first argument, as :class:`~kernelcache.store.root.Store` delegates to them. Those that
take a key's lock are given the store's own :meth:`~kernelcache.store.root.Store.lock` as
their second (``lock``): the one way a store takes a key's lock, so that a store's locks are
what its public methods take (a caller, or a test, that wraps it sees every lock taken).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

from ..errors import LockUnavailable
from ..process import warn_once
from .locks.locker import Held, Locker
from .trust import TrustPolicy

logger = logging.getLogger(__name__)

#: a store's :meth:`~kernelcache.store.root.Store.lock`: ``lock(key, shared=..., timeout=...)``
TakeLock = Callable[..., "Held | None"]


class StoreState:
    """One root and its settings, as a :class:`~kernelcache.store.root.Store` opened them.

    ``root`` is absolute (resolved by the store); ``trust`` a policy's name, checked.
    """

    def __init__(
        self,
        root: str,
        *,
        readonly: bool,
        lock_mode: str,
        lock_stale: float,
        lock_timeout: float,
        trust: str,
    ) -> None:
        #: the root directory
        self.root = root
        #: ``root`` and a separator: an entry's file is ``prefix + name`` (the hot path)
        self.prefix = os.path.join(root, "")
        #: only read: no lock, touch or quarantine
        self.readonly = readonly
        #: seconds an operation waits for a key's lock unless told otherwise
        self.lock_timeout = lock_timeout
        #: the trust policy's name (see :data:`kernelcache.store.trust.TRUST_POLICIES`)
        self.trust = trust
        #: the trust policy applied to the root's files
        self.policy = TrustPolicy(root, trust)
        #: the per-key locks
        self.locker = Locker(root, mode=lock_mode, stale_after=lock_stale, trust=self.policy)
        #: checked metadata by key, and when its last-used stamp is due (then it is read again)
        self.memo: dict[str, tuple[dict[str, Any], float]] = {}
        #: whether reads take their shared flock (False once flock is found not to work here)
        self.read_locks = not readonly


def take_lock(
    state: StoreState, key: str, *, shared: bool, timeout: float | None = None
) -> Held | None:
    """:meth:`~kernelcache.store.root.Store.lock` of the store of ``state``."""
    if state.readonly:
        return None
    try:
        return state.locker.acquire(
            key, shared=shared, timeout=state.lock_timeout if timeout is None else timeout
        )
    except LockUnavailable as e:
        warn_once(
            logger,
            (state.root, "locks"),
            "kernelcache: working without locks under %s: %s",
            state.root,
            e,
        )
        return None
