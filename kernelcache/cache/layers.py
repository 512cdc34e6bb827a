"""What writes and builds work on of a :class:`~kernelcache.cache.Cache`: its layers (the
writable root's store, the local roots in search order, the remote tier), its settings, and
its lookups (:class:`Layers`, which a Cache is).

The functions of :mod:`.writes` and :mod:`.builds` take the cache itself first, typed by this
protocol, so that they need not import the package's ``__init__`` (which calls them).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from ..capacity.size_cap import SizeCap
    from ..errors import WrongExt
    from ..remote.tier import RemoteTier
    from ..store.entry import Artifact
    from ..store.locks.locker import WaitBudget
    from ..store.root import Store

#: a caller's own check of an entry found in the remote tier: a reason to refuse it, or None
Accept = Callable[["Artifact"], "str | None"]


def refusal(accept: Accept | None, found: Artifact) -> str | None:
    """What ``accept`` says of ``found`` (None: no check, or accepted); a check that raises
    refuses: a remote entry it cannot judge is never copied, and the lookup never raises."""
    if accept is None:
        return None
    try:
        return accept(found)
    except Exception as e:  # the caller's check of untrusted bytes failed: not a reason to fail
        return f"its check failed: {e!r}"


class Layers(Protocol):
    """A cache's layers and settings, as a :class:`~kernelcache.cache.Cache` opened them."""

    #: the writable root (absolute) and its store
    root: str
    store: Store
    #: the remote tier (None: none)
    remote: RemoteTier | None
    #: whether the cache is off: reads miss, builds run in memory
    disabled: bool
    #: the size cap of the writable root (None: none)
    capacity: SizeCap | None
    #: seconds a call waits in all for locks
    lock_timeout: float

    @property
    def layers(self) -> list[Store]: ...

    def lookup(
        self,
        key: str,
        ext: str,
        budget: WaitBudget | None,
        names: tuple[str, str] | None = ...,
        *,
        remote: bool = ...,
        accept: Accept | None = ...,
        copy: bool = ...,
    ) -> Artifact | WrongExt | None: ...

    def remote_lookup(
        self,
        key: str,
        ext: str,
        budget: WaitBudget | None,
        names: tuple[str, str] | None = ...,
        accept: Accept | None = ...,
        copy: bool = ...,
    ) -> Artifact | None: ...
