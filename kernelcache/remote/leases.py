"""The job-wide build locks of the built-in tiers, held as leases.

A build lock is a lease: its holder renews it every third of ``lease`` from a background thread
(:class:`Leases`, for at most ``lock_ttl``), so the lock of a holder that stops (killed,
stopped, cut off) goes away within ``lease``, and a release is sent whatever failed before it.
:class:`BuildLocks` is what a tier offers on top of one try at its store's lock
(``_try_lock``): one try that tells a lock held elsewhere (:class:`~.tier.Busy`) from an
unavailable tier (None), waiting for one, and the release function of a lock taken.

Invariants: a read-only tier takes no lock (:func:`no_release`); an unavailable tier (or key's
shard) is never waited for: the caller builds without the lock; a failure of the store never
raises; a process forked while holding locks holds none of them.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..keys import check_key
from .tier import Busy, Claim, wait_for

#: the remote tiers' logger (the same as :mod:`.base`'s)
logger = logging.getLogger("kernelcache.remote")


def no_release() -> None:
    """The release of a lock not taken: the entry is there already, or the tier takes none."""


class Leases:
    """The build locks one tier holds in this process, renewed by one background thread every
    third of ``lease``, each to last at most ``longest`` seconds after it was taken (a build
    that takes longer may be duplicated by a waiter: harmless).

    ``renew(seconds)`` of a lock extends it to last that long from now (the lease, or what is
    left of ``longest``) and returns True (renewed), False (lost: another client holds it
    now; no longer renewed) or None (the store failed: tried again at the next beat; the
    lease may lapse meanwhile). A process forked while holding locks holds none of them.
    """

    def __init__(self, lease: float, longest: float, lost: Callable[[], None]) -> None:
        self._lease = lease
        self._every = lease / 3
        self._longest = longest
        self._lost = lost
        self._lock = threading.Lock()
        self._held: dict[str, tuple[float, Callable[[float], bool | None]]] = {}
        self._wake = threading.Event()
        self._pid = os.getpid()
        self._thread: threading.Thread | None = None

    def hold(self, token: str, renew: Callable[[float], bool | None]) -> None:
        """Renew the lock of ``token`` from now on, until :meth:`drop`."""
        with self._lock:
            if self._pid != os.getpid():  # forked: the parent's locks and thread are not ours
                self._held, self._thread, self._pid = {}, None, os.getpid()
            idle = not self._held
            self._held[token] = (time.monotonic(), renew)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._beat, name="kernelcache-remote-leases", daemon=True
                )
                self._thread.start()
            if idle:  # the thread sleeps until there is something to renew
                self._wake.set()

    def drop(self, token: str) -> None:
        """Stop renewing the lock of ``token`` (released, or lost)."""
        with self._lock:
            self._held.pop(token, None)

    def _beat(self) -> None:
        while True:
            with self._lock:
                idle = not self._held
            if idle:
                self._wake.wait()
                self._wake.clear()
            time.sleep(self._every)
            with self._lock:
                held = list(self._held.items())
            for token, (since, renew) in held:
                left = self._longest - (time.monotonic() - since)
                if left <= 0:
                    self.drop(token)
                    logger.debug("kernelcache: a build lock reached its lock_ttl; not renewed")
                    continue
                if renew(min(self._lease, left)) is False:
                    self.drop(token)
                    self._lost()


class BuildLocks:
    """The build locks of a built-in tier: the part of :class:`~.base.TierBase` that takes
    them, over one try at its store's lock (``_try_lock``), each renewed by ``_leases``."""

    read_only: bool
    _leases: Leases

    if TYPE_CHECKING:  # provided by TierBase

        def _usable(self, shard: str = "") -> bool: ...

        def _bump(self, **deltas: int) -> None: ...

    def _try_lock(self, key: str) -> Claim:
        """One try at the build lock of ``key`` in the store (see :meth:`try_acquire`); a
        failure is accounted for already."""
        raise NotImplementedError

    def try_acquire(self, key: str) -> Claim:
        """One try at the job-wide build lock of ``key``, without waiting.

        Returns a function that releases the lock (renewed meanwhile: see :class:`Leases`), a
        function that releases nothing when the entry is in the tier already (the caller's
        read then hits) or the tier is read-only, :class:`Busy` while another client holds
        it, or None when the tier (or the key's shard) is unavailable: the caller builds
        without it. Never raises for a failure of the store.

        Raises:
            ValueError: malformed ``key``.
        """
        check_key(key)
        if self.read_only:
            return no_release
        if not self._usable():
            return None
        return self._try_lock(key)

    def acquire(self, key: str, timeout: float) -> Callable[[], None] | None:
        """Take the job-wide build lock of ``key``, waiting at most ``timeout`` seconds (the
        caller's remaining budget; tried once at 0): :meth:`try_acquire` until the lock is
        not busy. None when it was not had in time (counted: ``lock_timeouts``) or the tier is
        unavailable; the caller then builds without it.

        Raises:
            ValueError: malformed ``key``.
        """
        claim = wait_for(lambda: self.try_acquire(key), timeout)
        if isinstance(claim, Busy):
            self._bump(lock_timeouts=1)
            return None
        return claim

    def _holding(
        self, token: str, renew: Callable[[float], bool | None], release: Callable[[], None]
    ) -> Callable[[], None]:
        """The release function of a lock just taken, renewed by ``renew`` until released."""
        self._leases.hold(token, renew)

        def released() -> None:
            self._leases.drop(token)
            release()

        return released
