"""Keeping a writable root under a size cap (``KERNELCACHE_MAX_SIZE``, ``Cache(max_size=)``).

Every put adds its bytes to the root's usage file (:mod:`kernelcache.capacity.usage`), a
running estimate of the root's size shared by every process writing it. When the estimate
passes the cap, the process that notices asks its helper process for an eviction pass
(:mod:`kernelcache.capacity.helper`; the put that noticed returns at once); where no helper
can be started or one failed, passes run in a thread all the same. A put that finds a pass
due while this process's runs has another run once it ends: the last put is always followed by
a pass that lists the root after it. Passes take the lock
``capacity``: no two run at once, no put waits for the lock, and one that finds it held waits
for it (:data:`RETRY_SECONDS` at a time), then runs only if still due.

A pass (:mod:`kernelcache.capacity.eviction`) is a prune of the least recently used entries
down to :data:`LOW_WATER` of the cap, after which the usage file holds the size it measured.
So a put costs one small append and read, and a pass (linear in the entries) runs once per
fifth of the cap written. A process waits at exit for the pass it asked for (at most :data:`EXIT_WAIT`
seconds), so that short processes keep the root under the cap too.

Writers can outrun the passes (a burst of puts as a job starts, a helper still starting): a
put that finds the estimate past :meth:`SizeCap.bound`, twice the cap, runs passes in its own
thread (it waits anyway), or waits for another process's, until the estimate is back under,
within the put's own wait budget (``wait=``, the lock timeout by default; a put with
``wait=0`` does not wait). A put whose budget runs out goes on (warned once), and puts stop
waiting until one finds the root back under.

A pass that cannot bring the root under the cap (entries in use) puts off the next until
another fifth of the cap is written, so a full root never costs a scan per put. Only the
writable root is ever evicted from; read-only roots never. Failures (an unwritable
``.stats/``, a lock that cannot be had) never fail a put: accounting stops with one warning.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import sys
import threading
import time
import weakref

from ..errors import InvalidValue
from ..process import warn_once
from ..store.layout import STATS_DIR
from ..store.locks.locker import WaitBudget
from ..store.root import Store
from . import helper as helpers
from .eviction import Eviction, bound_of, log_evicted
from .usage import USAGE_NAME, UsageView

logger = logging.getLogger(__name__)

#: a pass brings the root down to this fraction of the cap (as ccache's cleanup does)
LOW_WATER = 0.8
#: the longest a process waits at exit for its eviction pass to end
EXIT_WAIT = 30.0
#: the longest a pass waits at a time for the pass lock another holds, before it looks whether
#: it is still due
RETRY_SECONDS = 0.1


class SizeCap:
    """The size cap of one writable store: :meth:`added` after each entry a process publishes.

    Thread-safe; each process keeps its own view of the usage file (see the module docstring),
    which the cap holds (:attr:`usage`), and its passes are run by the
    :class:`~kernelcache.capacity.eviction.Eviction` it holds. With ``reporting`` (in a
    helper process) what the passes evicted is reported to the process that started it
    (:attr:`eviction`'s ``evicted``), not logged, and so is why the cap cannot be kept.
    """

    def __init__(self, store: Store, max_size: int, *, reporting: bool = False) -> None:
        if max_size <= 0:
            raise InvalidValue(f"a size cap must be positive, not {max_size}")
        self.store = store
        self.max_size = max_size
        self.reporting = reporting
        #: in a helper: why the cap cannot be kept, for the report (not warned about here)
        self.why_broken: str | None = None
        #: this process's view of the root's usage file (:mod:`.usage`), guarded by ``_lock``
        self.usage = UsageView(store, max_size, int(max_size * LOW_WATER), reporting)
        self._lock = threading.Lock()
        #: what runs this cap's eviction passes, and counts them (:mod:`.eviction`)
        self.eviction = Eviction(self.usage, self._lock, self._give_up)
        #: set when a put waited its whole budget with the root past :meth:`bound`: puts
        #: no longer wait until one finds it back under (warned once)
        self._stalled = False
        #: the CPU seconds helper processes spent on this process's passes (a pass in a
        #: thread spends this process's)
        self.helper_cpu_seconds = 0.0
        #: set when the cap cannot be kept here (warned once): accounting stops
        self.broken = False
        #: the thread running this process's eviction passes, and whether it still runs
        self._thread: threading.Thread | None = None
        self._running = False
        #: the helper process running this process's passes, if one runs
        self._helper: helpers.Helper | None = None
        #: set when a put found a pass due while one ran: once that one ends, a pass runs
        #: that begins after the put (the one running may have listed the root before it)
        self._pending = False

    def __repr__(self) -> str:
        return f"SizeCap({self.store.root!r}, max_size={self.max_size})"

    @property
    def passes(self) -> int:
        """The eviction passes run for this process (in a thread, or by its helper process)."""
        return self.eviction.passes

    @property
    def pass_seconds(self) -> float:
        """The seconds those passes took (for benchmarks)."""
        return self.eviction.pass_seconds

    def added(self, nbytes: int, wait: float) -> None:
        """Account for ``nbytes`` just published; when the root is over the cap, start an
        eviction pass in a helper process (or, where none can be started, a thread) unless
        one is running for this process. The put returns at once, unless the root is past
        :meth:`bound`: then it waits for passes to take it back under, at most ``wait``
        seconds (the put's own budget; 0: never). Never raises."""
        if self.broken:
            return
        with self._lock:
            try:
                due = self.usage.append(nbytes)
            except OSError as e:
                self._give_up(e)
                return
            over = self.usage.total > self.bound()
            self._stalled = self._stalled and over
            if due and self._pass_running():
                self._pending = True  # that pass may have listed the root before this put
            elif due:
                self._start_pass()
            over = over and not self._stalled and wait > 0
        if over:
            self._wait_under_bound(WaitBudget(wait))

    def bound(self) -> int:
        """The bytes past which a put waits for eviction passes: twice the cap, or, where
        the last pass could not get under the cap (entries in use), the cap more than it
        left."""
        return bound_of(self.usage)

    def evict(self, wait: float = 0.0, *, past_bound: bool = False) -> bool:
        """Run an eviction pass unless another process is running one; whether this one ran.
        Waits at most ``wait`` seconds for another's pass to end; having waited, runs only if
        a pass is still due (``past_bound``: the estimate still past :meth:`bound`): the other
        may have made it needless. Never raises for what it finds (each delete's outcome is
        the prune's)."""
        return self.eviction.evict(wait, past_bound=past_bound)

    def _start_pass(self) -> None:
        """Have this cap's helper process (or a thread) run the passes now due (caller holds
        ``_lock``, and no pass of this process runs)."""
        self._pending = False
        if self._ask_helper():
            _started.add(self)
            return
        # what a pass imports, imported here: a thread cannot import concurrent.futures
        # once the interpreter is exiting (the pass may still run then)
        from ..maintenance import prune, scan  # noqa: F401

        self._running = True
        self._thread = threading.Thread(
            target=self._passes_in_a_thread, name="kernelcache-evict", daemon=True
        )
        try:
            self._thread.start()
        except RuntimeError:  # no new threads now (the interpreter is exiting)
            self._running = False
            return
        _started.add(self)

    def _wait_under_bound(self, budget: WaitBudget) -> None:
        """Run a pass in this thread (the put waits anyway, and a helper process may still be
        starting), waiting first for another process's to end, until the root's estimate is
        back under :meth:`bound`, within ``budget``. Writers that wait so cannot outrun a pass:
        an estimate still past the bound after this thread's pass, or a budget spent, means
        others do (or something else writes the usage file): then warn once, and let puts go
        on without waiting until one finds the root back under."""
        while True:
            ran = self.evict(min(RETRY_SECONDS, budget.remaining()), past_bound=True)
            with self._lock:
                if self.broken or not self.eviction.past_bound():
                    return
                if ran or budget.remaining() <= 0:
                    self._stalled = True
                    break
        warn_once(
            logger,
            (self.store.root, "bound"),
            "kernelcache: eviction passes cannot keep %s under %d bytes (writers that do not"
            " wait for them, or another program writing %s/%s); puts go on without waiting"
            " until it is",
            self.store.root,
            self.bound(),
            STATS_DIR,
            USAGE_NAME,
        )

    def wait(self, timeout: float | None = None) -> None:
        """Wait for this process's eviction pass, if one is running (at most ``timeout``
        seconds; None: until it ends). A process may exit during a pass: what it deleted is
        gone whole, and the next put over the cap measures the root again."""
        deadline = None if timeout is None else time.monotonic() + timeout
        helper = self._helper
        if helper is not None and helper.pid == os.getpid():
            helper.idle.wait(timeout)
        thread = None
        while self._thread is not thread:  # (a thread that ends may start the next one)
            thread = self._thread
            if thread is not None:
                thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))

    def _pass_running(self) -> bool:
        """Whether this process's pass still runs (caller holds ``_lock``)."""
        helper = self._helper
        if helper is not None and helper.pid == os.getpid() and helper.alive:
            return not helper.idle.is_set()
        thread = self._thread
        # (a thread that is not alive while running: this is a forked child)
        return self._running and thread is not None and thread.is_alive()

    def _ask_helper(self) -> bool:
        """Have this cap's helper process run the passes now due, starting it on first use
        (caller holds ``_lock``); whether it was asked. A helper runs passes beside this
        process: a pass in a thread would contend for the interpreter lock at every system
        call. Where no helper can be started (or one failed), passes run in a thread."""
        helper = self._helper
        if helper is None or helper.pid != os.getpid() or not helper.alive:
            if helpers.no_helpers_since is not None or not sys.executable:
                return False
            store = self.store
            config = {
                "root": store.root,
                "max_size": self.max_size,
                "lock_mode": store.locker.mode,
                "lock_stale": store.locker.stale_after,
                "lock_timeout": store.lock_timeout,
                "trust": store.trust,
            }
            try:
                helper = self._helper = helpers.Helper(config, self._take_report)
            except (OSError, ValueError) as e:
                helpers.no_helpers(self.store.root, e)
                return False
        return helper.ask()

    def _take_report(self, line: bytes) -> bool:
        """Take up a helper's report of the passes it ran (one JSON line): count them, log
        what they evicted, and give up where it found the cap cannot be kept; whether the
        line was a report."""
        try:
            report = json.loads(line)
            passes, seconds = int(report["passes"]), float(report["seconds"])
            cpu = float(report["cpu"])
            evicted = [(int(done), int(freed)) for done, freed in report["evicted"]]
            broken = report["broken"]
        except (ValueError, KeyError, TypeError, RecursionError):
            return False
        with self._lock:
            self.eviction.passes += passes
            self.eviction.pass_seconds += seconds
            self.helper_cpu_seconds += cpu
            if not broken:  # the next put reads the file the helper wrote from its start
                self.usage.reset()
                self._again(starved=passes == 0)
        for done, freed in evicted:
            log_evicted(done, freed, self.store.root, self.max_size)
        if broken:
            self._give_up(broken)
        return True

    def _give_up(self, why: object) -> None:
        self.broken = True
        if self.reporting:  # a helper: the process that started it warns
            self.why_broken = str(why)
            return
        warn_once(
            logger,
            (self.store.root, "capacity"),
            "kernelcache: cannot keep %s under its size cap (%s); this process no longer tries",
            self.store.root,
            why,
        )

    #: the most passes one thread runs in a row (puts made during a pass may make another due)
    MAX_PASSES_IN_A_ROW = 3
    #: how often a thread tries again while another process's pass holds the lock
    MAX_TRIES = 50

    def _evict_while_due(self) -> int:
        """Run a pass; again while what was published during it keeps a pass due; while
        another process's pass holds the lock, wait for it, :data:`RETRY_SECONDS` at a time
        (that pass may make this one needless); the passes run. Ends under the lock puts
        account under, so a put after its last look starts a new thread."""
        passes = tries = 0
        try:
            while passes < self.MAX_PASSES_IN_A_ROW and tries < self.MAX_TRIES:
                if self.evict(RETRY_SECONDS if tries else 0.0):
                    passes += 1
                elif self.broken:
                    break
                else:
                    tries += 1
                with self._lock:
                    if not self.eviction.still_due():
                        self._running = self._pending = False
                        break
        finally:
            with self._lock:
                self._running = False
        return passes

    def _passes_in_a_thread(self) -> None:
        """The body of this process's pass thread: the passes due, then :meth:`_again`."""
        passes = self._evict_while_due()
        with self._lock:
            if not self._running:  # (a put after the last look may have started the next)
                self._again(starved=passes == 0)

    def _again(self, starved: bool) -> None:
        """After this process's passes ended, start the next (caller holds ``_lock``) where
        one is still due (the usage file keeps what was put after a pass began) and a put
        found a pass due while they ran, or they ran none (``starved``: other processes'
        passes held the lock throughout, and may have listed the root before this process's
        last put): so that the last put is always followed by a pass that lists the root
        after it."""
        if (self._pending or starved) and not self.broken and self.eviction.still_due():
            self._start_pass()
        self._pending = False


#: the caps of this process that started a pass (waited for at exit)
_started: weakref.WeakSet[SizeCap] = weakref.WeakSet()


@atexit.register
def _wait_at_exit() -> None:
    """Let a pass this process started end before it exits (at most :data:`EXIT_WAIT` seconds
    in all), so that short processes that each pass the cap still keep the root under it."""
    deadline = time.monotonic() + EXIT_WAIT
    for cap in list(_started):
        cap.wait(max(0.0, deadline - time.monotonic()))
    helpers.close_all()


def helper_main(config_json: str) -> None:
    """The body of a helper process (:data:`HELPER_CODE`): for each line read, run the passes
    of the cap that ``config_json`` describes while they are due, then write one JSON report
    (passes, their seconds, what each evicted, and why the cap cannot be kept, if it cannot)
    for the process that asked, which logs it. Logs nothing itself; ends at end of input."""
    logging.getLogger("kernelcache").addHandler(logging.NullHandler())
    logging.getLogger("kernelcache").propagate = False
    config = json.loads(config_json)
    store = Store(
        config["root"],
        lock_mode=config["lock_mode"],
        lock_stale=config["lock_stale"],
        lock_timeout=config["lock_timeout"],
        trust=config["trust"],
        resolved=True,
    )
    cap = SizeCap(store, config["max_size"], reporting=True)
    eviction = cap.eviction
    for _ in sys.stdin.buffer:
        passes, seconds, cpu = cap.passes, cap.pass_seconds, time.process_time()
        eviction.evicted.clear()
        if not cap.broken:
            cap._evict_while_due()
        report = {
            "passes": cap.passes - passes,
            "seconds": cap.pass_seconds - seconds,
            "cpu": time.process_time() - cpu,
            "evicted": eviction.evicted,
            "broken": cap.why_broken,
        }
        sys.stdout.write(json.dumps(report) + "\n")
        sys.stdout.flush()
