"""A bound on every call to a Redis server, whatever the server does: a socket that spends one
deadline and one reply budget per call (:class:`Budget`), so a slow or hostile server can
neither stall a caller past ``timeout`` nor send a reply larger than ``max_size`` (each line
counted as :data:`LINE_COST` bytes more: what parsing it may cost in memory, so that a reply of
millions of tiny elements is as bounded as one large value); a call whose
budget can be abandoned (its server found hung elsewhere: :mod:`kernelcache.remote.contact`)
waits for a reply in slices of :data:`SLICE` and stops as soon as it is.
"""

from __future__ import annotations

import errno
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from ...errors import RemoteError, RemoteTimeout
from ..contact import ABANDON_POLL, Abandoned

#: seconds a read of a call that may be abandoned waits before asking whether it is
SLICE = ABANDON_POLL
#: what one line of a reply (a protocol element: ``*0\r\n`` is an empty list) is counted as
#: besides its bytes, about what redis-py's parser makes of it in memory
LINE_COST = 64


class Budget(threading.local):
    """What the current call of this thread may still spend: a deadline and reply bytes."""

    deadline: float | None = None
    left: int | None = None
    overrun = False
    #: whether to stop waiting for the reply (asked between slices of a read), or None
    abandon: Callable[[], bool] | None = None
    #: whether the call was abandoned (what redis-py raises then says less)
    abandoned = False


class _BoundedSocket:
    """A connected socket whose every read and write waits at most until the call's deadline
    and whose reads stop past the call's byte budget (redis-py's own timeout is per read)."""

    def __init__(self, sock: Any, budget: Budget) -> None:
        self._sock = sock
        self._budget = budget
        self._timeout = sock.gettimeout()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)

    def settimeout(self, value: float | None) -> None:
        self._timeout = value
        self._sock.settimeout(value)

    def gettimeout(self) -> float | None:
        return self._timeout

    def _arm(self) -> None:
        deadline = self._budget.deadline
        if deadline is None:
            return
        left = deadline - time.monotonic()
        if left <= 0:
            raise RemoteTimeout("the call's deadline passed")
        self._sock.settimeout(left if self._timeout is None else min(left, self._timeout))

    def _spend(self, data: bytes, flags: int) -> None:
        budget = self._budget
        if budget.left is None or flags & socket.MSG_PEEK:
            return
        budget.left -= len(data) + LINE_COST * data.count(b"\r\n")
        if budget.left < 0:
            budget.overrun = True
            raise RemoteError(errno.EMSGSIZE, "the reply is larger than max_size")

    def _wait(self, read: Callable[[], Any]) -> Any:
        """``read()`` within the call's deadline; in slices where the call may be abandoned."""
        self._arm()
        abandon, wait = self._budget.abandon, self._sock.gettimeout()
        if abandon is None or wait is None or wait <= SLICE:
            return read()
        until = time.monotonic() + wait
        while True:
            self._sock.settimeout(max(0.001, min(SLICE, until - time.monotonic())))
            try:
                return read()
            except TimeoutError:
                if time.monotonic() >= until:
                    raise
                if abandon():
                    self._budget.abandoned = True
                    raise Abandoned("the server's breaker opened while it was waited for") from None

    def recv(self, size: int, flags: int = 0) -> bytes:
        data: bytes = self._wait(lambda: self._sock.recv(size, flags))
        self._spend(data, flags)
        return data

    def recv_into(self, buffer: Any, nbytes: int = 0, flags: int = 0) -> int:
        n: int = self._wait(lambda: self._sock.recv_into(buffer, nbytes, flags))
        self._spend(bytes(memoryview(buffer)[:n]), flags)
        return n

    def sendall(self, data: Any, flags: int = 0) -> None:
        self._arm()
        self._sock.sendall(data, flags)

    def send(self, data: Any, flags: int = 0) -> int:
        self._arm()
        return self._sock.send(data, flags)


def bounded_connection(base: Any, budget: Budget, **baked: Any) -> type:
    """A subclass of the redis-py connection class ``base`` whose sockets obey ``budget``
    (``baked``: constructor arguments it always gets, e.g. TLS settings on a cluster)."""

    def __init__(self: Any, **kwargs: Any) -> None:
        base.__init__(self, **{**baked, **kwargs})

    def _connect(self: Any) -> _BoundedSocket:
        started = time.monotonic()
        sock = base._connect(self)
        if budget.deadline is not None:  # connecting is bounded by connect_timeout
            budget.deadline += time.monotonic() - started
        return _BoundedSocket(sock, budget)

    return type(f"Bounded{base.__name__}", (base,), {"__init__": __init__, "_connect": _connect})
