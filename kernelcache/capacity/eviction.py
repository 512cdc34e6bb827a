"""The eviction passes of a size cap: :class:`Eviction`, which a
:class:`~kernelcache.capacity.size_cap.SizeCap` holds as its ``eviction``, runs one
(:meth:`Eviction.evict`), whoever asked for it (a put, the helper process, a thread), over the
cap's view of the usage file.

A pass is a prune (:mod:`kernelcache.maintenance.prune`): a listing of the root and the status
of each entry's files (no metadata is read: :func:`~kernelcache.capacity.usage.entries_of`;
the entries the same process's last pass saw and left are taken as it saw them, and every
:data:`FULL_EVERY` passes all are looked at again), a plan that removes the least recently used
entries (by their last-used stamps) down to the low-water mark of the cap, each delete
re-checked under its key's lock, an entry in use skipped (a helper deletes one entry at a time:
nobody waits for it); then the usage file is rewritten with the size the pass measured and the
records appended while it ran.

Invariants: a pass holds the lock ``capacity`` (:data:`~kernelcache.capacity.usage.PASS_LOCK`)
while it runs, so no two run at once; one that waited for another's runs only if still due; a
failure (an unwritable ``.stats/``, a lock that cannot be had) never raises: the cap gives up.
"""

from __future__ import annotations

import logging
import os
import stat
import threading
import time
from collections.abc import Callable

from ..errors import LockTimeout, LockUnavailable
from ..store.layout import STATS_DIR, open_subdir
from ..table import EntryInfo, EntryTable
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

#: a pass stats only the entries the previous pass of the same process did not see (or did
#: not leave as it saw them); every this many passes it stats every entry again
FULL_EVERY = 8


class Eviction:
    """The eviction passes of one size cap.

    Args:
        view: the cap's view of its root's usage file (the
            :class:`~kernelcache.capacity.size_cap.SizeCap`'s ``usage``): the store, the
            cap, its low-water mark and whether passes report to the process that started a
            helper; a pass leaves the size it measured there.
        lock: the lock that guards ``view`` (and what a pass changes of it).
        give_up: called with why, where the cap cannot be kept.
    """

    def __init__(
        self, view: UsageView, lock: threading.Lock, give_up: Callable[[object], None]
    ) -> None:
        self.view = view
        self._lock = lock
        self._give_up = give_up
        #: eviction passes run for this process (in a thread, or reported by its helper), and
        #: the seconds they took (for benchmarks)
        self.passes = 0
        self.pass_seconds = 0.0
        #: in a helper: what each pass evicted (entries, bytes), for the report
        self.evicted: list[tuple[int, int]] = []
        #: the entries the last pass saw and left (by key): the next pass stats only others
        self._seen: dict[str, EntryInfo] = {}

    def still_due(self) -> bool:
        """Whether a pass is due, from what was appended to the usage file since the last
        look (no file: not due, as after a pass of another process that could not write it).
        Caller holds ``_lock``."""
        try:
            return self._refresh()
        except OSError:
            return False

    def past_bound(self) -> bool:
        """Whether the estimate is past :func:`bound_of` the view, from what was appended to
        the usage file since the last look (no file: not, as after a prune). Caller holds
        ``_lock``."""
        try:
            self._refresh()
        except OSError:
            return False
        view = self.view
        return view.total > bound_of(view)

    def _refresh(self) -> bool:
        """Read what was appended to the usage file since the last look; whether a pass is
        due."""
        view = self.view
        dfd = open_subdir(view.store.root, STATS_DIR, create=False)
        try:
            fd = os.open(
                USAGE_NAME, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd
            )
            try:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    return False
                view.read_new(fd)
            finally:
                os.close(fd)
        finally:
            os.close(dfd)
        return view.due()

    def evict(self, wait: float = 0.0, *, past_bound: bool = False) -> bool:
        """Run an eviction pass unless another process is running one; whether this one ran.
        Waits at most ``wait`` seconds for another's pass to end; having waited, runs only if
        a pass is still due (``past_bound``: the estimate still past :func:`bound_of`): the
        other may have made it needless. Never raises for what it finds (each delete's outcome
        is the prune's)."""
        try:
            held = self.view.store.locker.acquire(PASS_LOCK, shared=False, timeout=wait)
        except LockTimeout:
            return False  # another process is evicting
        except LockUnavailable as e:
            self._give_up(e)
            return False
        started = time.perf_counter()
        try:
            if wait > 0:
                with self._lock:
                    if not (self.past_bound() if past_bound else self.still_due()):
                        return False
            measured = self._pass()
        except OSError as e:
            self._give_up(e)
            return False
        finally:
            held.release()
            self.pass_seconds += time.perf_counter() - started
        with self._lock:  # the next put reads the new file: the base and what came since
            self.view.reset(measured)
        return True

    def _pass(self) -> int:
        """Measure the root (:func:`entries_of`), plan down to the low-water mark if
        over the cap, delete, and write the usage file anew; the root's bytes afterwards as
        measured. Caller holds the pass lock.

        Raises:
            OSError: the usage file cannot be written.
        """
        from ..maintenance.execute import execute
        from ..maintenance.prune import plan_prune
        from ..maintenance.records import CacheScan
        from ..maintenance.scan import finished_logs

        view = self.view
        store = view.store
        start = usage_end(store.root)
        full = self.passes % FULL_EVERY == 0
        rows = entries_of(store.root, None if full else self._seen)
        table = EntryTable.from_rows(rows)
        measured = table.nbytes
        self._seen = {row.key: row for row in rows}
        if measured > view.max_size:
            now = time.time()
            logs = finished_logs(store, now)
            scanned = CacheScan(store.root, True, table, (), scanned_at=now, logs=logs)
            plan = plan_prune(scanned, max_size=view.low_water)
            result = execute(store, plan, threads=not view.reporting)
            kept = sum(
                o.action.size
                for o in result.outcomes
                if o.action.kind == "delete-entry" and o.status != "done"
            )
            measured = plan.kept_bytes + kept
            for outcome in result.outcomes:  # deleted, or to be looked at again (used since)
                self._seen.pop(outcome.action.key or "", None)
            evicted = (result.counts.get("done", 0), result.freed_bytes)
            if view.reporting:
                self.evicted.append(evicted)
            else:
                log_evicted(*evicted, store.root, view.max_size)
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


def bound_of(view: UsageView) -> int:
    """The bytes past which a put waits for eviction passes: twice the cap, or, where the last
    pass could not get under the cap (entries in use), the cap more than it left."""
    return view.max_size + max(view.base, view.max_size)


def log_evicted(done: int, freed: int, root: str, max_size: int) -> None:
    """Log what a pass evicted (in the process that asked for it)."""
    logger.info(
        "kernelcache: evicted %d entries (%d bytes) to keep %s under %d bytes",
        done,
        freed,
        root,
        max_size,
    )
