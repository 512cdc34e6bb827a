"""The wait budget of one call: every wait a call makes (for locks, readers, a remote claim) draws
from one total, so a call waits at most that long however many keys it touches.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator


class WaitBudget:
    """The time one call may still spend waiting, over all of its waits together (for locks,
    for readers, for the remote tier's lock): :meth:`remaining` counts down while the call
    waits, and stands still while it works (:meth:`paused`, around a build)."""

    __slots__ = ("_end",)

    def __init__(self, seconds: float) -> None:
        self._end = time.monotonic() + seconds

    def remaining(self) -> float:
        """Seconds left to wait (0 once spent: try once, never wait)."""
        return max(0.0, self._end - time.monotonic())

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Work that is not waiting: its time is given back to the budget."""
        started = time.monotonic()
        try:
            yield
        finally:
            self._end += time.monotonic() - started
