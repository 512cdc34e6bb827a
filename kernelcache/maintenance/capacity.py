"""Keeping a writable root under a size cap (``KERNELCACHE_MAX_SIZE``, ``Cache(max_size=)``).

Every put adds its bytes to the root's usage file (:mod:`kernelcache.maintenance.usage`), a
running estimate of the root's size shared by every process writing it. When the estimate
passes the cap, the process that notices asks its helper process for an eviction pass
(:mod:`kernelcache.maintenance.helper`; the put that noticed returns at once); where no helper
can be started or one failed, passes run in a thread all the same. Passes take the lock
``capacity``: no two run at once, no put waits for the lock, and one that finds it held waits
for it (:data:`RETRY_SECONDS` at a time), then runs only if still due.

A pass is a prune (:mod:`kernelcache.maintenance.prune`): a listing of the root and the status
of each entry's files (no metadata is read: :func:`entries_of`; the entries the same helper's
last pass saw and left are taken as it saw them, and every :data:`FULL_EVERY` passes all are
looked at again), a plan that removes the least recently used entries (by their last-used
stamps) down to :data:`LOW_WATER` of the cap, each delete re-checked under its key's lock, an
entry in use skipped (a helper deletes one entry at a time: nobody waits for it); then the usage
file is rewritten with the size the pass measured and the records appended while it ran. So a
put costs one small append and read, and a pass (linear in the entries) runs once per fifth of
the cap written. A process waits at exit for the pass it asked for (at most :data:`EXIT_WAIT`
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
import stat
import sys
import threading
import time
import weakref

from ..errors import InvalidValue, LockTimeout, LockUnavailable
from ..process import warn_once
from ..store.layout import STATS_DIR, open_subdir
from ..store.locks.budget import WaitBudget
from ..store.root import Store
from ..table import EntryInfo, EntryTable
from . import helper as helpers
from .usage import (
    PASS_LOCK,
    USAGE_NAME,
    UsageView,
    entries_of,
    open_usage,
    replace_usage,
    usage_end,
    usage_record,
)

logger = logging.getLogger(__name__)

#: a pass brings the root down to this fraction of the cap (as ccache's cleanup does)
LOW_WATER = 0.8
#: the longest a process waits at exit for its eviction pass to end
EXIT_WAIT = 30.0
#: the longest a pass waits at a time for the pass lock another holds, before it looks whether
#: it is still due
RETRY_SECONDS = 0.1
#: a pass stats only the entries the previous pass of the same process did not see (or did
#: not leave as it saw them); every this many passes it stats every entry again
FULL_EVERY = 8


class SizeCap(UsageView):
    """The size cap of one writable store: :meth:`added` after each entry a process publishes.

    Thread-safe; each process keeps its own view of the usage file (see the module docstring).
    """

    def __init__(self, store: Store, max_size: int) -> None:
        if max_size <= 0:
            raise InvalidValue(f"a size cap must be positive, not {max_size}")
        self.store = store
        self.max_size = max_size
        self.low_water = int(max_size * LOW_WATER)
        UsageView.__init__(self)
        self._lock = threading.Lock()
        #: set when a put waited its whole budget with the root past :meth:`bound`: puts
        #: no longer wait until one finds it back under (warned once)
        self._stalled = False
        #: eviction passes this process ran, and the seconds they took (for benchmarks)
        self.passes = 0
        self.pass_seconds = 0.0
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
        #: in a helper: what each pass evicted (entries, bytes), reported to the process
        #: that started it instead of logged
        self.reporting = False
        self.evicted: list[tuple[int, int]] = []
        self.why_broken: str | None = None
        #: the entries the last pass saw and left (by key): the next pass stats only others
        self._seen: dict[str, EntryInfo] = {}

    def __repr__(self) -> str:
        return f"SizeCap({self.store.root!r}, max_size={self.max_size})"

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
                due = self._append(nbytes)
            except OSError as e:
                self._give_up(e)
                return
            over = self.total > self.bound()
            self._stalled = self._stalled and over
            if due and not self._pass_running():
                self._start_pass()
            over = over and not self._stalled and wait > 0
        if over:
            self._wait_under_bound(WaitBudget(wait))

    def bound(self) -> int:
        """The bytes past which a put waits for eviction passes: twice the cap, or, where
        the last pass could not get under the cap (entries in use), the cap more than it
        left."""
        return self.max_size + max(self.base, self.max_size)

    def _start_pass(self) -> None:
        """Have this cap's helper process (or a thread) run the passes now due (caller holds
        ``_lock``, and no pass of this process runs)."""
        if self._ask_helper():
            _started.add(self)
            return
        # what a pass imports, imported here: a thread cannot import concurrent.futures
        # once the interpreter is exiting (the pass may still run then)
        from . import prune, scan  # noqa: F401

        self._running = True
        self._thread = threading.Thread(
            target=self._evict_while_due, name="kernelcache-evict", daemon=True
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
                if self.broken or not self._past_bound():
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
            self.passes += passes
            self.pass_seconds += seconds
            self.helper_cpu_seconds += cpu
            if not broken:  # the next put reads the file the helper wrote from its start
                self._inode, self._offset, self.base, self.total = None, 0, 0, 0
                self.measured = False
        for done, freed in evicted:
            _log_evicted(done, freed, self.store.root, self.max_size)
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

    def _evict_while_due(self) -> None:
        """Run a pass; again while what was published during it keeps a pass due; while
        another process's pass holds the lock, wait for it, :data:`RETRY_SECONDS` at a time
        (that pass may make this one needless). Ends under the lock puts account under, so a
        put after its last look starts a new thread."""
        try:
            passes = tries = 0
            while passes < self.MAX_PASSES_IN_A_ROW and tries < self.MAX_TRIES:
                if self.evict(RETRY_SECONDS if tries else 0.0):
                    passes += 1
                elif self.broken:
                    return
                else:
                    tries += 1
                with self._lock:
                    if not self._still_due():
                        self._running = False
                        return
        finally:
            with self._lock:
                self._running = False

    def _still_due(self) -> bool:
        """Whether a pass is due, from what was appended to the usage file since the last
        look (no file: not due, as after a pass of another process that could not write it).
        Caller holds ``_lock``."""
        try:
            return self._refresh()
        except OSError:
            return False

    def _past_bound(self) -> bool:
        """Whether the estimate is past :meth:`bound`, from what was appended to the usage
        file since the last look (no file: not, as after a prune). Caller holds ``_lock``."""
        try:
            self._refresh()
        except OSError:
            return False
        return self.total > self.bound()

    def _refresh(self) -> bool:
        """Read what was appended to the usage file since the last look; whether a pass is
        due."""
        dfd = open_subdir(self.store.root, STATS_DIR, create=False)
        try:
            fd = os.open(
                USAGE_NAME, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd
            )
            try:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    return False
                self._read_new(fd)
            finally:
                os.close(fd)
        finally:
            os.close(dfd)
        return self._due()

    def evict(self, wait: float = 0.0, *, past_bound: bool = False) -> bool:
        """Run an eviction pass unless another process is running one; whether this one ran.
        Waits at most ``wait`` seconds for another's pass to end; having waited, runs only if
        a pass is still due (``past_bound``: the estimate still past :meth:`bound`): the other
        may have made it needless. Never raises for what it finds (each delete's outcome is
        the prune's)."""
        try:
            held = self.store.locker.acquire(PASS_LOCK, shared=False, timeout=wait)
        except LockTimeout:
            return False  # another process is evicting
        except LockUnavailable as e:
            self._give_up(e)
            return False
        started = time.perf_counter()
        try:
            if wait > 0:
                with self._lock:
                    if not (self._past_bound() if past_bound else self._still_due()):
                        return False
            measured = self._pass()
        except OSError as e:
            self._give_up(e)
            return False
        finally:
            held.release()
            self.pass_seconds += time.perf_counter() - started
        with self._lock:  # the next put reads the new file: the base and what came since
            self._inode, self._offset, self.base, self.total = None, 0, measured, measured
            self.measured = True
        return True

    def _pass(self) -> int:
        """Measure the root (:func:`entries_of`), plan down to the low-water mark if
        over the cap, delete, and write the usage file anew; the root's bytes afterwards as
        measured. Caller holds the pass lock.

        Raises:
            OSError: the usage file cannot be written.
        """
        from .execute import execute
        from .prune import plan_prune
        from .records import CacheScan

        store = self.store
        start = usage_end(store.root)
        full = self.passes % FULL_EVERY == 0
        rows = entries_of(store.root, None if full else self._seen)
        table = EntryTable.from_rows(rows)
        measured = table.nbytes
        self._seen = {row.key: row for row in rows}
        if measured > self.max_size:
            scanned = CacheScan(store.root, True, table, (), scanned_at=time.time())
            plan = plan_prune(scanned, max_size=self.low_water)
            result = execute(store, plan, threads=not self.reporting)
            kept = sum(
                o.action.size
                for o in result.outcomes
                if o.action.kind == "delete-entry" and o.status != "done"
            )
            measured = plan.kept_bytes + kept
            for outcome in result.outcomes:  # deleted, or to be looked at again (used since)
                self._seen.pop(outcome.action.key or "", None)
            evicted = (result.counts.get("done", 0), result.freed_bytes)
            if self.reporting:
                self.evicted.append(evicted)
            else:
                _log_evicted(*evicted, store.root, self.max_size)
        self.passes += 1
        mine = os.stat(store.root).st_uid == os.geteuid()
        dfd = open_subdir(store.root, STATS_DIR, create=mine)
        old = open_usage(dfd)
        try:
            with self._lock:  # (this process's puts wait: none appends to the file replaced)
                if old is not None and start is not None and os.fstat(old).st_ino == start[0]:
                    # the records of the puts published while the pass ran are kept
                    replace_usage(dfd, old, start[1], usage_record(b"B", measured))
                else:
                    replace_usage(dfd, None, 0, usage_record(b"B", measured))
        finally:
            if old is not None:
                os.close(old)
            os.close(dfd)
        return measured


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


def _log_evicted(done: int, freed: int, root: str, max_size: int) -> None:
    logger.info(
        "kernelcache: evicted %d entries (%d bytes) to keep %s under %d bytes",
        done,
        freed,
        root,
        max_size,
    )


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
    cap = SizeCap(store, config["max_size"])
    cap.reporting = True
    for _ in sys.stdin.buffer:
        passes, seconds, cpu = cap.passes, cap.pass_seconds, time.process_time()
        cap.evicted.clear()
        if not cap.broken:
            cap._evict_while_due()
        report = {
            "passes": cap.passes - passes,
            "seconds": cap.pass_seconds - seconds,
            "cpu": time.process_time() - cpu,
            "evicted": cap.evicted,
            "broken": cap.why_broken,
        }
        sys.stdout.write(json.dumps(report) + "\n")
        sys.stdout.flush()
