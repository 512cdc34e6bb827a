"""Keeping a writable root under a size cap (``KERNELCACHE_MAX_SIZE``, ``Cache(max_size=)``).

Accounting is cheap and shared by every process writing the root: a put that publishes an
entry appends its bytes (artifact plus metadata) to ``<root>/.stats/usage`` as one record of
:data:`RECORD` bytes, and reads the records others appended since its last look. The first
record is the root's size as the last eviction pass measured it, so the sum is a running
estimate of the root's size. (Deletes are not counted: ``kernelcache prune`` and ``clear``
remove the file, and the next put measures the root again; what other tools delete makes the
estimate too high, which the next pass corrects.) It is never too low: a pass that writes the
file anew keeps the records appended since it began, those appended until its replace took
effect included, and a put that finds it appended to a file replaced meanwhile appends again.

When the estimate passes the cap, the process that notices asks its helper process for an
eviction pass (the put that noticed returns at once): one helper per capped cache of a process,
started at its first pass (``python -c`` :data:`HELPER_CODE`), asked through its standard input
and answering with a report line, which the process logs; it ends when that input closes, at
the process's exit or death. A pass in a thread of the process itself would contend for its
interpreter lock at every system call (a delete makes about twenty), slowing the puts beside
it; where no helper can be started or one failed, passes run in a thread all the same. Passes
take the lock ``capacity``: no two run at once, no put waits for the lock, and one that finds
it held waits for it (:data:`RETRY_SECONDS` at a time), then runs only if still due (the other
pass may make its own needless).

A pass is a prune (:mod:`kernelcache.prune`): a listing of the root and the status of each
entry's files (no metadata is read: :func:`entries_of`; the entries the same helper's last pass
saw and left are taken as it saw them, and every :data:`FULL_EVERY` passes all are looked at
again), a plan that removes the least recently used entries (by their last-used stamps) down
to :data:`LOW_WATER` of the cap, each delete re-checked under its key's lock (the status of
both files: unused since, the sizes planned), an entry in use skipped (a helper deletes one
entry at a time: nobody waits for it, and parallel deletes would slow the puts beside it);
then the usage file is rewritten with the size the pass measured and the records appended
while it ran. So a put costs one small append and read, and a pass (linear in the entries)
runs once per fifth of the cap written: the cost per put is bounded, amortized, and no put
waits for a pass. A process waits at exit for the pass it asked for (at most
:data:`EXIT_WAIT` seconds), so that short processes keep the root under the cap too; one
killed during a pass leaves what was deleted gone whole (each delete is a prune's), and the
next put over the cap measures again.

Writers can outrun the passes (a burst of puts as a job starts, a helper still starting): a
put that finds the estimate past :meth:`SizeCap.bound`, twice the cap, runs passes in its own
thread (it waits anyway), or waits for another process's, until the estimate is back under,
within the put's own wait budget (``wait=``, the lock timeout by default; a put with
``wait=0`` does not wait). So a burst takes the root at most to twice the cap and the entries
being published at that moment, one per writer. A put whose budget runs out goes on (warned
once), and puts stop waiting until one finds the root back under.

The usage file is a hint that others can write: it decides when a pass runs, never what it
deletes (the pass measures the root itself), and nothing written there can keep passes from
running. A process reads at most :data:`MAX_USAGE_READ` bytes of it at a look; a file with more
unread (huge, sparse), or holding anything this module never writes there (a base record
anywhere but first, a record of nothing, a number larger than any file, another kind, a torn
record), is read no further (one warning per process, naming it): the estimate is unknown, so a
pass is due, and it writes the file anew. A pass that cannot bring the root under the cap
(entries in use) puts off the next until another fifth of the cap is written, so a full root
never costs a scan per put. Only the writable root is ever evicted from; read-only roots never.
Failures (an unwritable ``.stats/``, a lock that cannot be had) never fail a put: accounting
stops with one warning.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import errno
import json
import logging
import os
import stat
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Mapping

from ..errors import InvalidValue, LockTimeout, LockUnavailable, NotRegularFile
from ..keys import KEY_PATTERN, META_EXT, all_keys, valid_ext
from ..process import warn_once
from ..store.layout import STATS_DIR, open_subdir, replace_file
from ..store.locks.budget import WaitBudget
from ..store.root import Store
from ..table import EntryInfo, EntryTable

logger = logging.getLogger(__name__)

USAGE_NAME = "usage"
#: a record: one kind byte (``B`` the base a pass measured, ``+`` bytes a put added), the
#: number in 22 digits, a newline
RECORD = 24
#: a pass brings the root down to this fraction of the cap (as ccache's cleanup does)
LOW_WATER = 0.8
#: the lock name under ``.locks/`` that eviction passes take
PASS_LOCK = "capacity"
#: the longest a process waits at exit for its eviction pass to end
EXIT_WAIT = 30.0
#: the longest a pass waits at a time for the pass lock another holds, before it looks whether
#: it is still due
RETRY_SECONDS = 0.1
#: a usage file larger than this is rewritten (two records) by the next process that reads it
MAX_USAGE_BYTES = 1 << 20
#: the most a process reads of the usage file at one look: more unread than this is not a file
#: this module keeps (it is compacted at :data:`MAX_USAGE_BYTES`), and is refused unread
MAX_USAGE_READ = 4 * MAX_USAGE_BYTES
#: the largest number a record may hold: no file, hence no entry and no root, is larger
MAX_RECORD = (1 << 63) - 1
#: a pass stats only the entries the previous pass of the same process did not see (or did
#: not leave as it saw them); every this many passes it stats every entry again
FULL_EVERY = 8


def _record(kind: bytes, value: int) -> bytes:
    return kind + b"%22d\n" % max(0, min(value, MAX_RECORD))


def _parse(record: bytes, at: int) -> tuple[bytes, int] | None:
    """The kind and number of ``record`` (:data:`RECORD` bytes read at offset ``at`` of the
    usage file); None where it is not what this module writes there: a base anywhere but
    first, an addition of nothing, a number larger than :data:`MAX_RECORD`, any other kind or
    shape."""
    kind, digits = record[:1], record[1 : RECORD - 1].lstrip(b" ")
    if len(record) != RECORD or record[-1:] != b"\n" or not digits.isdigit():
        return None
    value = int(digits)
    if value > MAX_RECORD or kind not in (b"B", b"+"):
        return None
    if (kind == b"B" and at != 0) or (kind == b"+" and value == 0):
        return None
    return kind, value


class SizeCap:
    """The size cap of one writable store: :meth:`added` after each entry a process publishes.

    Thread-safe; each process keeps its own view of the usage file (see the module docstring).
    """

    def __init__(self, store: Store, max_size: int) -> None:
        if max_size <= 0:
            raise InvalidValue(f"a size cap must be positive, not {max_size}")
        self.store = store
        self.max_size = max_size
        self.low_water = int(max_size * LOW_WATER)
        self._lock = threading.Lock()
        #: the usage file last read: its inode number and first record (a pass's new file
        #: may get the number of one it replaced), and how far it was read
        self._inode: int | None = None
        self._head = b""
        self._offset = 0
        #: the base record (what the last pass measured) and the running total
        self.base = 0
        self.total = 0
        #: whether the file read holds a base (a size a pass measured)
        self.measured = False
        #: whether the file read holds what this module never writes (warned once): it is
        #: read no further, and a pass is due, which writes it anew
        self._refused = False
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
        self._helper: _Helper | None = None
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
            if _no_helpers_since is not None or not sys.executable:
                return False
            try:
                helper = self._helper = _Helper(self)
            except (OSError, ValueError) as e:
                _no_helpers(self.store.root, e)
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

    def _due(self) -> bool:
        """Whether a pass is due: no measured base yet; or over the cap (when the last pass
        could not get under it, entries being in use: once a fifth of the cap more was
        written, so that such a pass is not repeated at every put)."""
        if not self.measured:
            return True
        if self.base > self.max_size:  # the last pass could not get under the cap
            return self.total >= self.base + (self.max_size - self.low_water)
        return self.total > self.max_size

    def _append(self, nbytes: int) -> bool:
        """Append ``nbytes`` to the usage file and read what was appended since the last look;
        whether a pass is due. A file without a measured base (none yet, or removed by a prune:
        this put creates it) is due: the pass measures the root and writes the base."""
        root = self.store.root
        try:
            dfd = open_subdir(root, STATS_DIR, create=os.stat(root).st_uid == os.geteuid())
        except FileNotFoundError:
            return True
        try:
            fd = _open_appending(dfd)
            try:
                if nbytes > 0:  # (a record of nothing is never written: see _parse)
                    os.write(fd, _record(b"+", nbytes))
                    if os.fstat(fd).st_nlink == 0:
                        # a pass replaced the file as this put wrote: count it in the new one
                        # (perhaps twice: too high, which the next pass corrects)
                        again = _open_appending(dfd)
                        os.close(fd)
                        fd = again
                        os.write(fd, _record(b"+", nbytes))
                size = self._read_new(fd)
                if self._refused:  # read no further: this process counts its own
                    self.total += nbytes
                elif size > MAX_USAGE_BYTES:
                    self._compact(dfd, fd)
            finally:
                os.close(fd)
        finally:
            os.close(dfd)
        return self._due()

    def _read_new(self, fd: int) -> int:
        """Fold the records appended since the last look into :attr:`total`; the file's size.
        Reads at most :data:`MAX_USAGE_READ` bytes: a file with more unread, or holding what
        this module never writes (:func:`_parse`), is refused (:meth:`_refuse`)."""
        st = os.fstat(fd)
        head = os.pread(fd, RECORD, 0)
        if (st.st_ino, head) != (self._inode, self._head) or st.st_size < self._offset:
            # another file (a pass replaced it, or it is new): read it from the start
            self._inode, self._head, self._offset, self.base, self.total = st.st_ino, head, 0, 0, 0
            self.measured = self._refused = False
        if self._refused:
            return st.st_size
        unread = st.st_size - self._offset
        if unread > MAX_USAGE_READ:
            self._refuse(f"{unread} bytes to read, more than a usage file holds")
            return st.st_size
        data = os.pread(fd, unread // RECORD * RECORD, self._offset)
        for start in range(0, len(data) - RECORD + 1, RECORD):
            record = data[start : start + RECORD]
            parsed = _parse(record, self._offset)
            if parsed is None:
                self._refuse(f"at byte {self._offset}, {record!r} is no record kernelcache writes")
                break
            self._offset += RECORD
            kind, number = parsed
            if kind == b"B":
                self.base = self.total = number
                self.measured = True
            else:
                self.total += number
        return st.st_size

    def _refuse(self, why: str) -> None:
        """Stop reading the usage file (another program writes it, or it is damaged): a pass
        is due, which measures the root and writes the file anew; until then the estimate is
        what was read and what this process adds. Warned once per process."""
        self._refused = True
        self.measured = False
        if self.reporting:  # a helper: the process that started it reads the same file
            return
        warn_once(
            logger,
            (self.store.root, "usage"),
            "kernelcache: ignoring %s: %s; the next eviction pass writes it anew (if this"
            " comes back, a program other than kernelcache writes that file: find it, or"
            " remove the file)",
            os.path.join(self.store.root, STATS_DIR, USAGE_NAME),
            why,
        )

    def _compact(self, dfd: int, fd: int) -> None:
        """Rewrite the long usage file ``fd`` (read whole) as two records, the base and the
        rest, and what was appended since (:func:`_replace_usage`); under the pass lock, tried
        once, and only while the file is still the one read."""
        try:
            held = self.store.locker.acquire(PASS_LOCK, shared=False, timeout=0)
        except (LockTimeout, LockUnavailable):
            return
        try:
            now = os.stat(USAGE_NAME, dir_fd=dfd, follow_symlinks=False)
            if now.st_ino != os.fstat(fd).st_ino:
                return  # a pass wrote it anew since
            rest = self.total - self.base
            head = _record(b"B", self.base) + (_record(b"+", rest) if rest > 0 else b"")
            _replace_usage(dfd, fd, self._offset, head)
        except OSError as e:
            logger.debug("kernelcache: cannot compact %s/%s: %s", STATS_DIR, USAGE_NAME, e)
        finally:
            held.release()

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
        start = _usage_end(store.root)
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
        old = _open_usage(dfd)
        try:
            with self._lock:  # (this process's puts wait: none appends to the file replaced)
                if old is not None and start is not None and os.fstat(old).st_ino == start[0]:
                    # the records of the puts published while the pass ran are kept
                    _replace_usage(dfd, old, start[1], _record(b"B", measured))
                else:
                    _replace_usage(dfd, None, 0, _record(b"B", measured))
        finally:
            if old is not None:
                os.close(old)
            os.close(dfd)
        return measured


def _usage_end(root: str) -> tuple[int, int] | None:
    """(inode, size) of the usage file now, or None: where the records a pass's listing may
    not see begin."""
    try:
        st = os.stat(os.path.join(root, STATS_DIR, USAGE_NAME), follow_symlinks=False)
    except OSError:
        return None
    return (st.st_ino, st.st_size) if stat.S_ISREG(st.st_mode) else None


def _open_appending(dfd: int) -> int:
    """The usage file in the directory ``dfd`` (created if missing), open for reading and
    appending.

    Raises:
        OSError: it cannot be opened, or it is not a regular file (a FIFO planted there is
            never waited on).
    """
    flags = os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    fd = os.open(USAGE_NAME, flags, 0o666, dir_fd=dfd)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise NotRegularFile(errno.EINVAL, f"{STATS_DIR}/{USAGE_NAME} is not a regular file")
    return fd


def _open_usage(dfd: int) -> int | None:
    """The usage file in the directory ``dfd``, open for reading; None where there is none
    (or something else is there)."""
    try:
        fd = os.open(
            USAGE_NAME, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd
        )
    except OSError:
        return None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    return fd


def _additions_from(fd: int, begin: int) -> tuple[bytes, int]:
    """The ``+`` records (:func:`_parse`) of the usage file ``fd`` from offset ``begin`` on
    (at most :data:`MAX_USAGE_READ` bytes), and the offset read to."""
    begin = begin // RECORD * RECORD
    size = os.fstat(fd).st_size
    if size <= begin:
        return b"", begin
    data = os.pread(fd, min(size - begin, MAX_USAGE_READ) // RECORD * RECORD, begin)
    kept = []
    for i in range(0, len(data) - RECORD + 1, RECORD):
        parsed = _parse(data[i : i + RECORD], begin + i)
        if parsed is not None and parsed[0] == b"+":
            kept.append(data[i : i + RECORD])
    return b"".join(kept), begin + len(data)


def _replace_usage(dfd: int, old: int | None, begin: int, head: bytes) -> None:
    """Replace the usage file with ``head`` and the additions of the file ``old`` (open)
    from ``begin`` on, those appended until the replace took effect included: a put that
    appends to the old file after that sees it replaced, and appends again
    (:meth:`SizeCap._append`), so no put goes uncounted. Caller holds the pass lock.

    Raises:
        OSError: the new file cannot be written.
    """
    since, end = _additions_from(old, begin) if old is not None else (b"", 0)
    replace_file(dfd, USAGE_NAME, head + since)
    if old is None:
        return
    late, _ = _additions_from(old, end)
    if late:
        flags = os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        fd = os.open(USAGE_NAME, flags, dir_fd=dfd)
        try:
            os.write(fd, late)
        finally:
            os.close(fd)


def entries_of(root: str, seen: Mapping[str, EntryInfo] | None = None) -> list[EntryInfo]:
    """The entries of ``root`` as an eviction pass sees them, from one listing and the status
    of each entry's two files: key, extension (of its one artifact file), sizes and last-used
    stamp; no metadata is read (kernel, target and creation time are None). An entry in
    ``seen`` (by key, with the same extension) is taken from there instead of its files'
    status: a pass before saw it.

    A name that only looks like an entry is caught where it matters: a prune re-checks each
    entry under its lock before deleting it, and keeps one that is not what the plan saw (see
    :mod:`kernelcache.prune`). Housekeeping is left to ``prune``.
    """
    metas: set[str] = set()
    arts: dict[str, str | None] = {}
    for name in os.listdir(root):
        key, dot, ext = name.partition(".")
        if not dot:
            continue
        if ext == META_EXT:
            metas.add(key)
        else:
            arts[key] = ext if key not in arts else None  # two artifacts: left to prune
    exts = {e: valid_ext(e) for e in set(arts.values()) if e is not None}
    rows = [(k, e) for k, e in arts.items() if e is not None and exts[e] and k in metas]
    if rows and not all_keys([k for k, _ in rows]):
        rows = [(k, e) for k, e in rows if KEY_PATTERN.fullmatch(k)]
    suffix = "." + META_EXT
    found: list[EntryInfo] = []
    dfd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for key, ext in rows:
            known = seen.get(key) if seen else None
            if known is not None and known.ext == ext:
                found.append(known)
                continue
            try:
                meta = os.stat(key + suffix, dir_fd=dfd, follow_symlinks=False)
                art = os.stat(f"{key}.{ext}", dir_fd=dfd, follow_symlinks=False)
            except OSError:
                continue  # deleted meanwhile
            if stat.S_ISREG(meta.st_mode) and stat.S_ISREG(art.st_mode):
                found.append(
                    EntryInfo(key, ext, art.st_size, meta.st_size, None, None, None, meta.st_mtime)
                )
    finally:
        os.close(dfd)
    return found


def discard_usage(root: str) -> None:
    """Remove the usage file of ``root`` (best effort), after entries were removed outside an
    eviction pass: the next put that counts measures the root again."""
    try:
        dfd = open_subdir(root, STATS_DIR, create=False)
    except OSError:
        return
    try:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(USAGE_NAME, dir_fd=dfd)
    except OSError as e:
        logger.debug(
            "kernelcache: cannot remove %s/%s under %s: %s", STATS_DIR, USAGE_NAME, root, e
        )
    finally:
        os.close(dfd)


#: the caps of this process that started a pass (waited for at exit)
_started: weakref.WeakSet[SizeCap] = weakref.WeakSet()


@atexit.register
def _wait_at_exit() -> None:
    """Let a pass this process started end before it exits (at most :data:`EXIT_WAIT` seconds
    in all), so that short processes that each pass the cap still keep the root under it."""
    global _exiting
    deadline = time.monotonic() + EXIT_WAIT
    for cap in list(_started):
        cap.wait(max(0.0, deadline - time.monotonic()))
    _exiting = True
    for helper in list(_helpers):
        if helper.pid == os.getpid():
            helper.close()


# -- helper processes ---------------------------------------------------------------------------
class _Helper:
    """The helper process of one cap in one process (:func:`helper_main`): asked for passes
    through its standard input, one line each; it answers each with a report line. It ends when
    its standard input closes (this process exited, or was killed)."""

    def __init__(self, cap: SizeCap) -> None:
        store = cap.store
        config = {
            "root": store.root,
            "max_size": cap.max_size,
            "lock_mode": store.locker.mode,
            "lock_stale": store.locker.stale_after,
            "lock_timeout": store.lock_timeout,
            "trust": store.trust,
        }
        here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, (here, env.get("PYTHONPATH"))))
        self.proc = subprocess.Popen(
            [sys.executable, "-c", HELPER_CODE, json.dumps(config)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,  # (read as it comes: a full pipe would stop the helper)
            env=env,
            cwd="/",
        )
        self.cap = cap
        self.pid = os.getpid()
        self.alive = True
        #: set while no pass was asked for that has not been reported
        self.idle = threading.Event()
        self.idle.set()
        threading.Thread(target=self._watch, name="kernelcache-evict-helper", daemon=True).start()
        _helpers.add(self)

    def ask(self) -> bool:
        """Ask for the passes now due; whether the helper took the request."""
        stdin = self.proc.stdin
        assert stdin is not None
        self.idle.clear()
        try:
            stdin.write(b"pass\n")
            stdin.flush()
        except (OSError, ValueError):  # it ended: the watcher says why
            self.idle.set()
            return False
        return True

    def _watch(self) -> None:
        """Read the helper's reports until it ends; then mark it gone, and say why."""
        stdout = self.proc.stdout
        assert stdout is not None
        said: collections.deque[bytes] = collections.deque(maxlen=8)  # what else it wrote
        for line in stdout:
            if self.cap._take_report(line):
                self.idle.set()
            else:
                said.append(line[-300:])
        status = self.proc.wait()
        if status != 0 and not _exiting:  # (said before it is seen gone: no new helper then)
            tail = b"".join(said).decode(errors="replace").strip()[-300:]
            _no_helpers(self.cap.store.root, f"a helper ended with status {status}: {tail}")
        self.alive = False
        self.idle.set()

    def close(self) -> None:
        """Let the helper end (after the pass it runs, if any)."""
        with contextlib.suppress(OSError, ValueError):
            if self.proc.stdin is not None:
                self.proc.stdin.close()


#: what a helper process runs: :func:`helper_main` with the cap's settings as JSON
HELPER_CODE = (
    "import sys\nfrom kernelcache.maintenance.capacity import helper_main\nhelper_main(sys.argv[1])"
)
#: why helper processes cannot be started here (passes then run in threads), once known
_no_helpers_since: str | None = None
#: the helpers this process started (closed at exit)
_helpers: weakref.WeakSet[_Helper] = weakref.WeakSet()
#: set at exit: helpers that end then are not failures
_exiting = False


def _no_helpers(root: str, why: object) -> None:
    """Run passes in threads from now on: helper processes cannot be started, or failed."""
    global _no_helpers_since
    _no_helpers_since = str(why)
    logger.info(
        "kernelcache: eviction passes for %s run in a thread: no helper process (%s)", root, why
    )


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
