"""Who asks a tier when nobody knows yet whether it answers, and requests that stop waiting when
the tier is found hung elsewhere.

**First contact, one process of a node at a time.** A process that has had no answer from a tier
(or one of its shards) yet, or none since its breaker opened, makes its next request as the
node's *probe*: one thread of the process and one process of the cache root at a time (a file
under ``<root>/.breakers/``: :meth:`.breakers.SharedBreakers.begin_probe`). The others wait for
the probe's answer, at most :data:`FIRST_ANSWER_WAIT` on a job's path and at most the request's
own bound off it (:func:`off_path`: background copies, lease renewals), then go on: with the tier
when the probe answered, without it (the request is skipped) when it failed (the breaker is
open) or is still unanswered; a process that stopped waiting for a probe skips the tier on its
job's path until that probe ends. So processes that start together behind a hung tier wait one
request's timeout per node (the prober's) and a second at most each, not a timeout each.

**Abandoned requests.** A request in flight is abandoned as soon as the breaker of its shard, or
of the whole tier, opens in this process or in another one of the root: :meth:`Contact.watch`
runs a request in a thread and stops waiting for it then (an object store's), and a Redis call's
socket asks the same between slices of its reads (:mod:`.redis.bounds`).

Invariants: a probe of this process always ends (its ticket is settled whatever happens, and a
probe file past its end is taken over); nothing here waits longer than the bound it was given;
a process forked while a probe was in flight makes its own.
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from ..errors import RemoteTimeout
from .breakers import SharedBreakers

#: seconds a request on a job's path waits for the answer of another's first contact
FIRST_ANSWER_WAIT = 1.0
#: seconds between two looks at another process's first contact
POLL = 0.01
#: seconds between two looks at the breaker while a request is in flight
ABANDON_POLL = 0.05
#: an answer noted this long before a process began to wait still counts for it (clocks of
#: coarse file systems, and a probe that ended as the waiter looked)
SLACK = 1.0

_here = threading.local()


@contextlib.contextmanager
def off_path() -> Iterator[None]:
    """Requests this thread makes in the block are off the job's path (a copy in the
    background, a renewal): they wait for another's first contact as long as it may take."""
    before = getattr(_here, "off_path", False)
    _here.off_path = True
    try:
        yield
    finally:
        _here.off_path = before


def on_path() -> bool:
    """Whether this thread's requests are on the job's path (see :func:`off_path`)."""
    return not getattr(_here, "off_path", False)


class _Workers:
    """The threads that make watched requests, kept from one request to the next (an object
    store's client answers a thread it served before in a fraction of the time a new thread
    costs); one more starts whenever none is idle (an abandoned request keeps its thread until
    it ends on its own); a forked process starts its own."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tasks: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._idle = 0
        self._pid = os.getpid()

    def submit(self, task: Callable[[], None]) -> None:
        with self._lock:
            if self._pid != os.getpid():  # the parent's threads are not here
                self._tasks, self._idle, self._pid = queue.SimpleQueue(), 0, os.getpid()
            if not self._idle:
                self._idle += 1
                threading.Thread(
                    target=self._work, args=(self._tasks,), name="kernelcache-remote", daemon=True
                ).start()
            self._idle -= 1
            self._tasks.put(task)

    def _work(self, tasks: queue.SimpleQueue[Callable[[], None]]) -> None:
        while True:
            task = tasks.get()
            try:
                task()
            finally:
                with self._lock:
                    if tasks is self._tasks:
                        self._idle += 1


_workers = _Workers()


class Abandoned(RemoteTimeout):
    """A request stopped waiting for: the breaker of its shard opened while it was in flight."""


class LookupSpent(RemoteTimeout):
    """A request stopped waiting for: the lookup it serves spent its time in the tier
    (:data:`~.tier.LOOKUP_TIMEOUTS`); not a failure of the tier."""


@dataclass
class Ticket:
    """A request let through to ``shard``: settle it with :meth:`Contact.settle`."""

    shard: str
    #: whether it is the node's first contact with the shard
    probe: bool
    #: the event the threads of this process waiting for the probe wait on
    done: threading.Event = field(default_factory=threading.Event)
    #: when the request was asked for (monotonic), and when the lookup it serves runs out of
    #: time in the tier (None: it serves none; see :mod:`.policy`)
    started: float = 0.0
    until: float | None = None


class Contact:
    """The first contacts of one tier's shards in this process (see the module docstring).

    Args:
        shared: the tier's breakers in its root (where first contacts are shared too).
        bound: the longest one request of the tier may take, in seconds.
        opened: whether the breaker of a shard (or of the whole tier) is open now, here or in
            another process of the root, without counting anything.
    """

    def __init__(self, shared: SharedBreakers, bound: float, opened: Callable[[str], bool]) -> None:
        self._shared = shared
        self.bound = bound
        self._opened = opened
        self._lock = threading.Lock()
        #: shards that answered this process since their breaker last opened
        self._answered: set[str] = set()
        #: shard -> this process's first contact in flight
        self._probing: dict[str, Ticket] = {}
        #: shard -> (the probe this process stopped waiting for on a job's path, when it began)
        self._gave_up: dict[str, tuple[object, float]] = {}
        self._pid = os.getpid()

    def _forked(self) -> None:
        if self._pid != os.getpid():  # the parent's threads, and their probes, are not here
            with self._lock:
                self._probing, self._gave_up, self._pid = {}, {}, os.getpid()

    def admit(self, shard: str) -> Ticket | None:
        """The ticket of a request to ``shard`` (whose breaker is closed), or None: skip it (the
        first contact failed, or is still unanswered; see the module docstring)."""
        self._forked()
        if shard in self._answered:
            return Ticket(shard, False)
        patient = not on_path()
        deadline = time.monotonic() + (
            self.bound + 1.0 if patient else min(FIRST_ANSWER_WAIT, self.bound)
        )
        began = time.time()
        while True:
            if shard in self._answered:
                return Ticket(shard, False)
            gave = self._gave_up.get(shard)
            if gave is not None:
                began = min(began, gave[1])
            with self._lock:
                own = self._probing.get(shard)
                if own is None:
                    _, alive = self._shared.probe_state(shard)
                    if alive >= began - SLACK:  # another process's probe answered lately
                        self._answered.add(shard)
                        continue
                    peer = self._shared.begin_probe(shard, self.bound + 1.0)
                    if peer is None:
                        ticket = Ticket(shard, True)
                        self._probing[shard] = ticket
                        return ticket
                    waited: object = peer
                else:
                    waited = own
            if gave is not None and gave[0] == waited and not patient:
                return None
            outcome = self._await(shard, waited, deadline, began)
            if outcome == "answered":
                self._answered.add(shard)
            elif outcome == "failed":
                return None
            elif outcome == "late":
                if not patient:
                    self._gave_up[shard] = (waited, began)
                return None

    def _await(self, shard: str, waited: object, deadline: float, began: float) -> str:
        """Wait for the first contact ``waited`` (a :class:`Ticket` of this process, or the
        identity of another process's) until ``deadline``: "answered", "failed" (the breaker
        opened), "ended" (without an answer: try again) or "late"."""
        while True:
            if isinstance(waited, Ticket):
                if waited.done.wait(POLL):
                    if shard in self._answered:
                        return "answered"
                    return "failed" if self._opened(shard) else "ended"
            else:
                current, alive = self._shared.probe_state(shard)
                if alive >= began - SLACK:
                    return "answered"
                if self._opened(shard):
                    return "failed"
                if current != waited:
                    return "ended"
            if time.monotonic() >= deadline:
                return "late"
            if not isinstance(waited, Ticket):
                time.sleep(POLL)

    def settle(self, ticket: Ticket, answered: bool | None) -> None:
        """The request of ``ticket`` ended: the shard answered it (True), failed it or it was
        abandoned (False), or it was not made or ended otherwise (None)."""
        if answered:
            self._answered.add(ticket.shard)
            self._gave_up.pop(ticket.shard, None)
        if ticket.probe:
            with self._lock:
                if self._probing.get(ticket.shard) is ticket:
                    del self._probing[ticket.shard]
            self._shared.end_probe(ticket.shard, bool(answered))
            ticket.done.set()

    def lost(self, shard: str) -> None:
        """``shard`` failed ("": the whole tier): its next request is a first contact again."""
        if shard:
            self._answered.discard(shard)
        else:
            self._answered.clear()

    def watch(self, ticket: Ticket, request: Callable[[], Any]) -> tuple[Any, BaseException | None]:
        """``(request(), None)`` or ``(None, what it raised)``, made in another thread and
        waited for until it ends, its breaker opens (:class:`Abandoned`: the thread is left to
        end on its own, its outcome unused), the lookup it serves runs out of time
        (:class:`LookupSpent`, the same), or :attr:`bound` and a second pass
        (:class:`~kernelcache.errors.RemoteTimeout`)."""
        done = threading.Event()
        box: list[Any] = [None, None]

        def run() -> None:
            try:
                box[0] = request()
            except BaseException as e:  # handed to the caller, which accounts for it
                box[1] = e
            finally:
                done.set()

        _workers.submit(run)
        limit = time.monotonic() + self.bound + 1.0
        until = limit if ticket.until is None else ticket.until
        while not done.wait(max(0.0, min(ABANDON_POLL, until - time.monotonic()))):
            if self._opened(ticket.shard):
                return None, Abandoned("the tier's breaker opened while the request was waited for")
            now = time.monotonic()
            if ticket.until is not None and now >= ticket.until:
                return None, LookupSpent("the lookup spent its time in the tier")
            if now > limit:
                return None, RemoteTimeout(f"no answer in {self.bound:g}s")
        return box[0], box[1]
