"""Removing things from a root: plan first (:func:`plan_prune`, :func:`plan_repair`), then
:func:`execute` the plan.

A plan is data: a tuple of :class:`Action` records, in the order they will run, with the bytes
each frees. ``prune --dry-run`` prints the plan and stops; ``prune`` and ``verify --repair``
execute it.

Guarantees while other processes read and write the root:

* An entry is deleted with :meth:`Store.delete` under its exclusive per-key lock, tried once
  (``wait=0``): an entry a reader or writer holds is skipped and reported as ``in-use``, never
  waited for and never removed under them.
* What the plan decided is re-checked under that lock, never before it, from the entry itself:
  an entry used (its last-used stamp refreshed) after the plan was made is kept
  (``used-since-plan``); one whose own metadata no longer says what the plan selected it for
  (its extension, its kernel or target for a filter, its sizes) is kept (``changed``): the
  scan index the plan may have read is a hint that others can write, never a reason to delete;
  and metadata without artifact that a writer completed meanwhile is kept (``gone``).
* Each delete touches only the entry's own files (no listing of the root), so a prune is linear
  in the entries; the deletes of a size or age limit run in a few threads.
* Corrupt entries are quarantined with :meth:`Store.repair`, which re-checks them under the
  exclusive lock; orphan artifacts are removed under their key's lock after a re-check.
* Staging files, quarantined files and lock files are removed only once older than their age
  limits (the grace period for staging and lock files), so a write in progress never loses them.
* Per-process statistics logs of finished processes are folded into one summary file so that
  totals are kept (see :func:`kernelcache.stats.fold_logs`).
"""

from __future__ import annotations

import contextlib
import fcntl
import fnmatch
import logging
import os
import re
import stat
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import cached_property
from itertools import repeat
from operator import add
from typing import Any, NamedTuple

from ..errors import InvalidValue, LockTimeout
from ..fsio import READ_FLAGS, changed_at
from ..keys import META_EXT
from ..problem import Problem
from ..schema.document import parse_fields
from ..stats.summary import fold_logs, foldable_logs
from ..store.entry import Artifact, not_whole
from ..store.layout import (
    LOCK_DIR,
    NOT_VISIBLE,
    QUARANTINE_DIR,
    TMP_DIR,
    open_subdir,
    read_metadata,
)
from ..store.locks.flock import lock_name
from ..store.root import Store
from ..table import EntryInfo, EntryTable, kernel_names
from .index import discard_index
from .scan import CacheScan, Issue

logger = logging.getLogger(__name__)

#: kind -> what executing it does
ACTION_KINDS: dict[str, str] = {
    "delete-entry": "delete an entry (metadata first) under its exclusive lock",
    "quarantine-entry": "move a corrupt entry into .quarantine/ under its exclusive lock",
    "remove-orphan": "remove an artifact file that no metadata claims, under the key's lock",
    "remove-temp": "remove a stale staging file from .tmp/",
    "remove-quarantined": "remove an old file from .quarantine/",
    "remove-lock": "remove a stale lock file (taken first where it can be taken)",
}
#: outcome status -> meaning
STATUSES: dict[str, str] = {
    "done": "removed (or quarantined)",
    "in-use": "held by another process: skipped",
    "used-since-plan": "used after the plan was made: kept",
    "changed": "its own metadata or sizes no longer match what the plan selected: kept",
    "gone": "already gone or no longer a problem",
    "failed": "could not be removed (see detail)",
}
#: threads that delete entries (each under its own key's lock) where deleting is mostly waiting
#: for the file system to free blocks: a few threads overlap the waits
DELETE_THREADS = 4
#: deletes made one at a time first, to tell whether they wait on the file system
PROBE_DELETES = 512
#: quarantined files are kept this long by default, for diagnosis
QUARANTINE_AGE = 7 * 86400.0


class Action(NamedTuple):
    """One step of a plan (immutable). ``path`` is relative to the root; ``size`` the bytes
    it frees. (A NamedTuple: a prune plans one per entry it deletes, and they may be many.)"""

    kind: str
    path: str
    size: int
    reason: str
    key: str | None = None
    #: for entries and files: the mtime the plan saw (a newer one means "used since")
    mtime: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "action": self.kind,
            "path": self.path,
            "key": self.key,
            "size": self.size,
            "reason": self.reason,
        }


@dataclass(frozen=True)
class Plan:
    """What a prune or repair will do, in order. ``left`` lists problems it does not act on."""

    actions: tuple[Action, ...]
    kept_entries: int = 0
    kept_bytes: int = 0
    logs_to_fold: tuple[str, ...] = ()
    left: tuple[Issue, ...] = ()
    #: the filters entries were selected by (re-checked against each entry before it goes)
    kernels: frozenset[str] = frozenset()
    targets: frozenset[str] = frozenset()
    #: whether an entry used after the plan was made is kept (False for ``clear``)
    keep_used: bool = True

    @property
    def bytes_to_free(self) -> int:
        return sum(a.size for a in self.actions)

    def count(self, kind: str) -> int:
        return sum(1 for a in self.actions if a.kind == kind)

    @cached_property
    def summary(self) -> dict[str, dict[str, int]]:
        """{action kind: {"count": n, "bytes": b}} for the kinds present."""
        out: dict[str, dict[str, int]] = {}
        for kind, size in zip(
            (a.kind for a in self.actions), (a.size for a in self.actions), strict=True
        ):
            slot = out.get(kind)
            if slot is None:
                slot = out[kind] = {"count": 0, "bytes": 0}
            slot["count"] += 1
            slot["bytes"] += size
        return out


@dataclass(frozen=True)
class Outcome:
    action: Action
    status: str
    detail: str = ""

    def to_json(self) -> dict[str, Any]:
        return {**self.action.to_json(), "status": self.status, "detail": self.detail}


@dataclass(frozen=True)
class Result:
    """What executing a plan did."""

    plan: Plan
    outcomes: tuple[Outcome, ...]
    folded_logs: int = 0
    fold_error: str | None = None
    counts: dict[str, int] = field(default_factory=dict)

    @property
    def freed_bytes(self) -> int:
        return sum(o.action.size for o in self.outcomes if o.status == "done")

    def with_status(self, status: str) -> list[Outcome]:
        return [o for o in self.outcomes if o.status == status]


# -- planning -----------------------------------------------------------------------------
#: the characters that make a ``--kernel`` or ``--target`` value a pattern (:mod:`fnmatch`)
GLOB_CHARS = frozenset("*?[")


def is_pattern(value: str) -> bool:
    """Whether ``value`` is an :mod:`fnmatch` pattern rather than a plain name."""
    return not GLOB_CHARS.isdisjoint(value)


def matcher(patterns: Iterable[str]) -> Callable[[object], bool]:
    """A test of a metadata value against ``patterns``: names matched exactly and
    :mod:`fnmatch` patterns (``cuda:*``, ``hip:gfx9?2``, ``matmul_[ab]*``), case-sensitively.
    Anything but a string matches nothing."""
    exact = {p for p in patterns if not is_pattern(p)}
    globs = [re.compile(fnmatch.translate(p)).match for p in patterns if is_pattern(p)]

    def match(value: object) -> bool:
        if not isinstance(value, str):
            return False
        return value in exact or any(g(value) is not None for g in globs)

    return match


def kernel_matcher(patterns: Iterable[str]) -> Callable[[object, object], bool]:
    """A test of an entry's kernel against ``patterns`` (as :func:`matcher`), given its
    ``name`` and ``kernel`` fields: it matches when a pattern matches a kernel name the entry
    holds (an entry of several lists them: :func:`~kernelcache.table.kernel_names`) or where
    one is defined (``module:name``, as ``warm`` and ``explain`` print it)."""
    match = matcher(patterns)

    def test(name: object, qualname: object) -> bool:
        return any(
            match(n)
            for field in (name, qualname)
            if isinstance(field, str)
            for n in kernel_names(field)
        )

    return test


def select(
    entries: Iterable[EntryInfo],
    kernels: Sequence[str] = (),
    targets: Sequence[str] = (),
) -> list[EntryInfo]:
    """The entries whose kernel matches one of ``kernels`` (:func:`kernel_matcher`) and target
    one of ``targets`` (names or patterns, see :func:`matcher`; an empty sequence matches
    everything)."""
    mk, mt = kernel_matcher(kernels), matcher(targets)
    return [
        e
        for e in entries
        if (not kernels or mk(e.kernel, e.qualname)) and (not targets or mt(e.target))
    ]


def unmatched(
    table: EntryTable, kernels: Sequence[str] = (), targets: Sequence[str] = ()
) -> list[str]:
    """The filters (``--kernel NAME``, ``--target T``) that match no entry of ``table`` on
    their own: a filter that selects nothing is said, never silently an empty result."""
    found = [
        f"--kernel {k}"
        for k in kernels
        if not any(map(kernel_matcher([k]), table.kernel, table.qualname))
    ]
    return found + [f"--target {t}" for t in targets if not any(map(matcher([t]), table.target))]


def plan_prune(
    scanned: CacheScan,
    *,
    max_size: int | None = None,
    older_than: float | None = None,
    kernels: Sequence[str] = (),
    targets: Sequence[str] = (),
    quarantine_age: float = QUARANTINE_AGE,
    now: float | None = None,
    everything: bool = False,
) -> Plan:
    """Plan a prune of a scan made with ``last_used=True, locks=True``.

    Entries: among those matching ``kernels``/``targets``, those not used for ``older_than``
    seconds go; then, least recently used first, as many as needed to bring the matching
    entries' bytes (artifact plus metadata) to at most ``max_size``. With filters but neither
    limit, every matching entry goes; with no filter and no limit, no entry goes.
    ``everything`` (``kernelcache clear``): every matching entry goes, even one used after
    the plan was made.

    Housekeeping, always: orphan artifacts and metadata without artifact, staging files and
    lock files past the grace period, quarantined files older than ``quarantine_age``, and the
    statistics logs of finished processes (folded, not lost).
    """
    now = scanned.scanned_at if now is None else now
    table = scanned.table
    last = table.last_used
    if len(last) != len(table) or None in last:
        raise InvalidValue("plan_prune needs a scan made with last_used=True")
    keys, nbytes = table.key, list(map(add, table.size, table.meta_size))
    chosen: Iterable[int] = range(len(table))
    if kernels:
        match_k = kernel_matcher(kernels)
        chosen = [i for i in chosen if match_k(table.kernel[i], table.qualname[i])]
    if targets:
        match_t = matcher(targets)
        chosen = [i for i in chosen if match_t(table.target[i])]
    # least recently used first; ties broken by key so that plans are reproducible
    lru = sorted(sorted(chosen, key=keys.__getitem__), key=lambda i: last[i] or 0.0)
    doomed: list[int] = []
    reason: dict[int, str] = {}
    if everything:
        doomed = lru
        reason = dict.fromkeys(lru, "clear")
    elif max_size is None and older_than is None:
        if kernels or targets:
            doomed = lru
            reason = dict.fromkeys(lru, "matches --kernel/--target")
    else:
        if older_than is not None:
            cutoff = now - older_than
            doomed = [i for i in lru if last[i] < cutoff]  # type: ignore[operator]
            reason = dict.fromkeys(doomed, "not used within --older-than")
        if max_size is not None:
            total = sum(nbytes[i] for i in lru) - sum(nbytes[i] for i in doomed)
            for i in lru:
                if total <= max_size:
                    break
                if i not in reason:
                    reason[i] = "least recently used, over --max-size"
                    total -= nbytes[i]
            doomed = [i for i in lru if i in reason]
    exts = table.ext
    paths = [f"{keys[i]}.{exts[i]}" for i in doomed]
    rows = zip(
        repeat("delete-entry"),
        paths,
        [nbytes[i] for i in doomed],
        [reason[i] for i in doomed],
        [keys[i] for i in doomed],
        [last[i] for i in doomed],
    )
    actions: list[Action] = list(map(Action._make, rows))
    left: list[Issue] = []
    for issue in scanned.issues:
        action = _housekeeping(issue)
        if action is None:
            left.append(issue)
        else:
            actions.append(action)
    actions += [
        Action("remove-quarantined", f.path, f.size, "quarantined long ago", None, f.mtime)
        for f in scanned.quarantine
        if now - f.mtime > quarantine_age
    ]
    return Plan(
        tuple(actions),
        kept_entries=len(table) - len(doomed),
        kept_bytes=sum(nbytes) - sum(nbytes[i] for i in doomed),
        logs_to_fold=tuple(foldable_logs(scanned.root, now)),
        left=tuple(left),
        kernels=frozenset(kernels),
        targets=frozenset(targets),
        keep_used=not everything,
    )


def _housekeeping(issue: Issue) -> Action | None:
    """The action prune takes for a problem a fast scan found, or None to leave it."""
    if issue.kind == "orphan-artifact":
        return Action("remove-orphan", issue.path, issue.size, issue.detail, issue.key, issue.mtime)
    if issue.kind == "stale-temp":
        return Action("remove-temp", issue.path, issue.size, issue.detail, None, issue.mtime)
    if issue.kind == "stale-lock":
        return Action("remove-lock", issue.path, issue.size, issue.detail, issue.key, issue.mtime)
    if issue.kind == "corrupt" and issue.detail == "artifact missing":
        return Action(
            "delete-entry", issue.path, issue.size, "metadata without artifact", issue.key
        )
    if issue.kind == "outdated" and issue.key is not None:
        return Action("delete-entry", issue.path, issue.size, issue.detail, issue.key)
    return None


def plan_repair(verified: CacheScan) -> Plan:
    """Plan ``verify --repair`` for a scan checked by :func:`kernelcache.scan.verify`:
    quarantine corrupt entries; remove orphan artifacts, stale staging files and stale locks.
    Foreign files are left alone (listed in ``Plan.left``)."""
    actions: list[Action] = []
    left: list[Issue] = []
    for issue in verified.issues:
        if issue.kind == "corrupt" and issue.key is not None:
            actions.append(
                Action("quarantine-entry", issue.path, issue.size, issue.detail, issue.key)
            )
            continue
        action = _housekeeping(issue)
        if action is None:
            left.append(issue)
        else:
            actions.append(action)
    return Plan(tuple(actions), len(verified.entries), verified.nbytes, (), tuple(left))


# -- execution ----------------------------------------------------------------------------
def execute(
    store: Store,
    plan: Plan,
    *,
    progress: Callable[[int], object] | None = None,
    threads: bool = True,
) -> Result:
    """Carry out ``plan`` on ``store`` (a writable store of the plan's root), in order.

    The entries a plan deletes by size or age come first and are distinct keys: where
    deleting them is mostly waiting for the file system, they are deleted by
    :data:`DELETE_THREADS` threads, each delete under its own key's lock (see :func:`_run`),
    unless ``threads`` is false (a pass that runs beside the writers it would slow, which
    nobody waits for). The rest runs one action at a time, in order. Never raises for a
    single action: each gets an :class:`Outcome`, in the plan's order.
    """
    run = _Executor(store, plan)
    ticking = threading.Lock()  # progress is called from the deleting threads

    def one(action: Action) -> Outcome:
        try:
            status, detail = getattr(run, action.kind.replace("-", "_"))(action)
        except OSError as e:
            status, detail = "failed", e.strerror or str(e)
        if progress is not None:
            with ticking:
                progress(1)
        return Outcome(action, status, detail)

    try:
        outcomes = _run(plan.actions, one, threads)
    finally:
        run.close()
    if any(o.status == "changed" for o in outcomes):
        discard_index(store.root)  # it may be what misled the plan
    folded, error = (0, None)
    if plan.logs_to_fold:
        folded, error = fold_logs(store.locker, plan.logs_to_fold)
    counts: dict[str, int] = {}
    for o in outcomes:
        counts[o.status] = counts.get(o.status, 0) + 1
    return Result(plan, tuple(outcomes), folded, error, counts)


def _run(
    actions: Sequence[Action], one: Callable[[Action], Outcome], threads: bool = True
) -> list[Outcome]:
    """The outcomes of ``actions``, in order. The leading deletes by size or age (distinct keys,
    which plan_prune puts first) start one at a time; if those first :data:`PROBE_DELETES`
    spent most of their time waiting on the file system (freeing blocks on a real disk), the
    rest run in :data:`DELETE_THREADS` threads to overlap the waits (where nothing waits, as
    on tmpfs, threads would only contend for the same directories). Then the rest, in turn."""
    lead = 0
    while (
        lead < len(actions)
        and actions[lead].kind == "delete-entry"
        and actions[lead].mtime is not None
    ):
        lead += 1
    wall, cpu = time.perf_counter(), time.thread_time()
    outcomes = list(map(one, actions[: min(lead, PROBE_DELETES)]))
    wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
    rest = actions[PROBE_DELETES:lead]
    if threads and len(rest) >= 2 * DELETE_THREADS and _mostly_waiting(wall, cpu):
        with ThreadPoolExecutor(DELETE_THREADS, thread_name_prefix="kernelcache-prune") as pool:
            outcomes += pool.map(one, rest, chunksize=64)
    else:
        outcomes += map(one, rest)
    outcomes += map(one, actions[lead:])
    return outcomes


def _mostly_waiting(wall: float, cpu: float) -> bool:
    """Whether work that took ``wall`` seconds, ``cpu`` of them on the CPU, mostly waited."""
    return wall - cpu > wall / 2


class _Executor:
    """One method per action kind; each returns (status, detail) and re-checks before acting."""

    def __init__(self, store: Store, plan: Plan) -> None:
        self.store = store
        self.plan = plan
        self.root = store.root
        self.match_kernel = kernel_matcher(plan.kernels)
        self.match_target = matcher(plan.targets)
        #: .locks/, held open while the plan runs, where build locks are flock files
        self.locks_dir: int | None = None
        if store.locker.mode == "flock":
            with contextlib.suppress(OSError):
                self.locks_dir = open_subdir(store.root, LOCK_DIR, create=False)

    def close(self) -> None:
        if self.locks_dir is not None:
            os.close(self.locks_dir)
            self.locks_dir = None

    def _stat(self, name: str) -> os.stat_result | None:
        try:
            return os.stat(os.path.join(self.root, name), follow_symlinks=False)
        except FileNotFoundError:
            return None

    def delete_entry(self, action: Action) -> tuple[str, str]:
        """Delete an entry if, under its exclusive lock, it is still what the plan saw: unused
        since (its last-used stamp unchanged) and, by its own metadata and files, what the
        plan selected (:meth:`_differs`); or still metadata without an artifact or an entry
        of an older version."""
        key = action.key
        assert key is not None
        verdict = ("gone", "")

        def still_doomed() -> bool:
            nonlocal verdict
            if action.mtime is not None:  # chosen by size, age or filter: still that entry?
                why = self._differs(key, action)
                if why is not None:
                    verdict = why
                return why is None
            # metadata without artifact, or an outdated entry: still one of them?
            found = self.store.inspect(key, any_owner=True)
            if isinstance(found, Problem) and (
                found.outdated or found.reason == "artifact missing"
            ):
                return True
            verdict = ("gone", "the entry was repaired meanwhile")
            return False

        ext = action.path.rpartition(".")[2] if action.mtime is not None else None
        deleted = self.store.delete(key, ext=ext, wait=0, check=still_doomed)
        if deleted is None:
            return "in-use", ""
        if not deleted:
            return verdict
        self._drop_build_lock(key)
        return "done", ""

    def _differs(self, key: str, action: Action) -> tuple[str, str] | None:
        """Why the entry ``key`` is not what ``action`` planned to delete, re-derived from the
        entry itself (the fields of its metadata, and both files' status); None if it is.
        The plan may have read the scan index, which others can write. A plan that selects by
        no field of the metadata (no kernel or target filter: size, age, an eviction pass)
        needs only the status of both files: the artifact of the planned extension must be
        there with the planned sizes, and the stamp unchanged."""
        plan = self.plan
        filtered = bool(plan.kernels or plan.targets)
        if filtered:
            loaded = read_metadata(
                self.store.meta_path(key), key, not_visible=NOT_VISIBLE, parse=parse_fields
            )
            if loaded is None:
                return "gone", ""
            if not isinstance(loaded, tuple):
                return "changed", f"its metadata cannot be read now ({loaded.reason})"
            doc, meta = loaded
        else:
            found = self._stat(f"{key}.{META_EXT}")
            if found is None:
                return "gone", ""
            if not stat.S_ISREG(found.st_mode):
                return "changed", "its metadata is not a regular file now"
            doc, meta = {}, found
        if meta.st_mtime != action.mtime and plan.keep_used:
            return "used-since-plan", ""
        ext = action.path.rpartition(".")[2]
        wrong = [
            f"{field} is {repr(doc.get(name))[:40]}"
            for field, name, wanted, match in (
                ("its extension", "ext", {ext}, {ext}.__contains__),
                ("its target", "target", plan.targets, self.match_target),
            )
            if filtered and wanted and not match(doc.get(name))
        ]
        if filtered and plan.kernels and not self.match_kernel(doc.get("name"), doc.get("kernel")):
            wrong.append(f"its kernel is {repr(doc.get('name'))[:40]}")
        if wrong:
            return "changed", f"not what the plan selected: {', '.join(wrong)}"
        artifact = self._stat(f"{key}.{ext}")
        if (
            artifact is None
            or not stat.S_ISREG(artifact.st_mode)
            or artifact.st_size + meta.st_size != action.size
        ):
            return "changed", "its files' sizes changed since the plan"
        return None

    def _drop_build_lock(self, key: str) -> None:
        """Remove the single-flight lock file of a deleted entry, unless a builder holds it.

        Probed as the stale-lock check of :mod:`kernelcache.scan` does: a non-blocking
        exclusive flock on the file (builders hold it exclusively), and the file is unlinked
        only if its name still is that file (a builder may have made a new one meanwhile;
        the locker of a builder that opened the unlinked one notices and retries).
        """
        dfd = self.locks_dir
        if dfd is None:
            return
        name = f"{key}.build.lock"
        try:
            fd = os.open(name, READ_FLAGS, dir_fd=dfd)
        except OSError:
            return  # no build lock (or not one to touch)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            held, now = os.fstat(fd), os.stat(name, dir_fd=dfd, follow_symlinks=False)
            if (held.st_dev, held.st_ino) == (now.st_dev, now.st_ino):
                os.unlink(name, dir_fd=dfd)
        except OSError:
            return  # a builder holds it, or it went away: leave it
        finally:
            os.close(fd)  # (drops our flock)

    def quarantine_entry(self, action: Action) -> tuple[str, str]:
        key = action.key
        assert key is not None
        found = self.store.inspect(key, any_owner=True, whole=True)
        if not isinstance(found, Problem) or not found.corrupt:
            return "gone", "no longer corrupt"
        after = self.store.repair(key, refuse=not_whole)  # re-checked under the lock, then moved
        if isinstance(after, Artifact):
            return "gone", "no longer corrupt"
        if not os.path.lexists(self.store.meta_path(key)):  # quarantine moves metadata first
            return "done", found.reason
        return "in-use", "its lock or artifact is held; run verify --repair again later"

    def remove_orphan(self, action: Action) -> tuple[str, str]:
        key = action.key
        assert key is not None
        ext = action.path.rpartition(".")[2]
        try:
            held = self.store.lock(key, shared=False, timeout=0)
        except LockTimeout:
            return "in-use", ""
        keep_lock = True
        try:
            found = self.store.inspect(key, any_owner=True)
            if isinstance(found, Artifact) and found.ext == ext:
                return "gone", "claimed by metadata meanwhile"
            st = self._stat(action.path)
            if st is None or changed_at(st) != action.mtime:
                return "gone", "replaced meanwhile"
            os.unlink(os.path.join(self.root, action.path))
            keep_lock = isinstance(found, Artifact)
            return "done", ""
        finally:
            if held is not None:
                held.release(remove=not keep_lock)

    def _remove_aux_file(self, action: Action) -> tuple[str, str]:
        """Remove a file of .tmp/ or .quarantine/ if it is still the file the plan saw."""
        directory, _, name = action.path.partition("/")
        if directory not in (TMP_DIR, QUARANTINE_DIR) or not name or "/" in name:
            return "failed", "not a housekeeping file"
        try:
            dfd = open_subdir(self.root, directory, create=False)
        except FileNotFoundError:
            return "gone", ""
        try:
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            if action.mtime is not None and changed_at(st) != action.mtime:
                return "gone", "changed meanwhile"
            os.unlink(name, dir_fd=dfd)
            return "done", ""
        except FileNotFoundError:
            return "gone", ""
        finally:
            os.close(dfd)

    remove_temp = remove_quarantined = _remove_aux_file

    def remove_lock(self, action: Action) -> tuple[str, str]:
        filename = action.path.partition("/")[2]
        parts = lock_name(filename)
        if parts is None:  # a leftover of a broken soft lock
            return self._unlink_lock_file(filename)
        key, suffix = parts
        if suffix == ".softlock":
            try:
                held = self.store.locker.acquire_soft(key, timeout=0.2)  # breaks a stale one
            except LockTimeout:
                return "in-use", "its holder came back"
            held.release()
            return "done", ""
        locker = self.store.locker
        if locker.mode != "flock":
            return self._unlink_lock_file(filename)  # flock files are unused in soft mode
        try:
            held = locker.acquire(key + suffix[: -len(".lock")], shared=False, timeout=0)
        except LockTimeout:
            return "in-use", ""
        entry_back = os.path.lexists(self.store.meta_path(key))
        held.release(remove=not entry_back)
        return ("gone", "its entry exists again") if entry_back else ("done", "")

    def _unlink_lock_file(self, filename: str) -> tuple[str, str]:
        dfd = open_subdir(self.root, LOCK_DIR, create=False)
        try:
            os.unlink(filename, dir_fd=dfd)
        except FileNotFoundError:
            return "gone", ""
        finally:
            os.close(dfd)
        return "done", ""
