"""The job-wide build locks of the built-in tiers, held as leases.

A build lock is a lease: its holder renews it every third of ``lease`` from a background thread
(:class:`Leases`, one per tier, for at most ``lock_ttl``), so the lock of a holder that stops
(killed, stopped, cut off) goes away within ``lease``, and a release is sent whatever failed
before it. A tier (:class:`~.base.TierBase`) holds its :class:`Leases`: its ``try_acquire``
and ``acquire`` take a lock with one try at its store's lock, and hand each lock taken to
:meth:`Leases.holding`, whose release function stops the renewals and releases it.

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

from .contact import off_path

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

    def holding(
        self, token: str, renew: Callable[[float], bool | None], release: Callable[[], None]
    ) -> Callable[[], None]:
        """The release function of the lock ``token`` just taken: renewed by ``renew`` (see
        :meth:`hold`) until that function stops the renewals and calls ``release``."""
        self.hold(token, renew)

        def released() -> None:
            self.drop(token)
            release()

        return released

    def drop(self, token: str) -> None:
        """Stop renewing the lock of ``token`` (released, or lost)."""
        with self._lock:
            self._held.pop(token, None)

    def _beat(self) -> None:
        with off_path():  # renewals are not on a job's path: they may wait for a first contact
            self._renew_forever()

    def _renew_forever(self) -> None:
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
                try:
                    renewed = renew(min(self._lease, left))
                except Exception as e:  # the store failed (its tier should have said None)
                    logger.debug("kernelcache: a build lock's renewal raised %r", e)
                    renewed = None
                if renewed is False:
                    self.drop(token)
                    self._lost()
