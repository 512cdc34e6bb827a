"""The cache: ordered layers over the storage format, and the policy of what to do on failure.

Reads go to the writable root, then each read-only root in order, then the remote tier (if
any); a remote hit is verified and published into the writable root. Writes go to the writable
root (and the remote tier); the first writer of a key wins, except where ``replace`` (or
``rebuild``, single flight) puts an entry in place of the writable root's (never of the remote
tier's value). ``get_or_create`` runs at most one ``build`` per key at a time across every
process sharing the writable root (single flight): the others wait for the builder's lock and
then read its result. ``get_or_create_many`` does the same for many keys
with work stealing: a process builds every missing key whose lock is free before it waits for
the keys that other processes are building, and takes over those whose builder died. With a
remote tier the same holds across machines: a key whose job-wide lock another machine holds is
set aside while the process builds the others, and asked again with back-off.

Failures of the cache never fail the caller's job: ``get`` turns them into misses and
``get_or_create`` into an artifact built in memory, with one warning per kind of failure. An
entry the writable root cannot take (a full disk) still goes to the remote tier.

Every call waits at most the lock timeout in all, over all its keys and all its waits (locks,
readers of a corrupt entry, the remote tier's lock): one :class:`~kernelcache.store.locks.WaitBudget`
per call, which stands still while the call builds. A call whose budget is spent tries each
lock once and never waits again.
"""

from __future__ import annotations

from .builds import BuildItem, Builds
from .layers import readonly_problem


class Cache(Builds):
    """A kernel cache over one writable root, read-only roots and an optional remote tier.

    Args:
        root: the writable root; None for ``$KERNELCACHE_DIR`` or the user cache directory.
        readonly_roots: roots searched after ``root`` and never written (e.g. a layer baked
            into a container image); None for ``$KERNELCACHE_READONLY_DIRS``.
        remote: None for ``$KERNELCACHE_REMOTE``, "" for none, a URL such as
            ``redis://host:6379/0``, several separated by whitespace (tiers tried in order,
            see docs/remote.md), an object implementing :class:`RemoteTier`, or a sequence of
            URLs and such objects.
        lock_timeout: seconds to wait for a per-key lock before building privately; None for
            ``$KERNELCACHE_LOCK_TIMEOUT``.
        lock_mode: "auto", "flock" or "soft"; None for ``$KERNELCACHE_LOCK_MODE``.
        max_size: a size cap of the writable root in bytes, or a size such as ``"50G"``:
            least recently used entries are evicted past it (see :mod:`kernelcache.maintenance.capacity`);
            None for ``$KERNELCACHE_MAX_SIZE``; 0 for none.
    """


__all__ = ["BuildItem", "Cache", "readonly_problem"]
