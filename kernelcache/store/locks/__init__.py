"""Per-key locks under a root's ``.locks/`` and the readers' shared flocks.

What enters: a key, a mode (``flock``, ``soft`` for network filesystems, or ``auto``) and a
wait budget. What leaves: a held lock (:class:`Held`) or ``None``/:class:`LockTimeout` when the
budget ran out. A soft lock whose holder is gone (or silent for longer than ``lock_stale``) is
broken; a reader's shared flock on an artifact keeps removal away while it reads.
"""

from __future__ import annotations

from .flock import (
    LOCK_SUFFIXES,
    flock_held,
    flock_holder,
    lock_name,
)
from .locker import Held, Locker, WaitBudget
from .readers import (
    exclude_readers,
)
from .soft import (
    MAX_HEARTBEAT,
    UNWRITTEN_STALE,
    read_soft_record,
    soft_lock_stale,
)

__all__ = [
    "LOCK_SUFFIXES",
    "MAX_HEARTBEAT",
    "UNWRITTEN_STALE",
    "Held",
    "Locker",
    "WaitBudget",
    "exclude_readers",
    "flock_held",
    "flock_holder",
    "lock_name",
    "read_soft_record",
    "soft_lock_stale",
]
