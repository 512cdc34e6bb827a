"""Executing a plan: :data:`ACTIONS` maps each action kind to the function that carries it out.

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
* A unit of the plan (a kernel and its companions, its own entries first:
  :func:`~kernelcache.maintenance.prune.units_of`) is deleted in turn, by one thread: once one
  of its entries is kept (in use, used since the plan, changed) or cannot be deleted, the rest
  of the unit is kept too, so that no kernel stays without a companion a prune deleted.
* Each delete touches only the entry's own files (no listing of the root), so a prune is linear
  in the entries; the deletes of a size or age limit run in a few threads.
* Corrupt entries are quarantined with :func:`~kernelcache.store.removal.repair`, which re-checks them under the
  exclusive lock; orphan artifacts are removed under their key's lock after a re-check.
* Every file is removed through :mod:`kernelcache.store.removal` or the locks.
"""

from __future__ import annotations

import contextlib
import os
import stat
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from itertools import groupby

from ..errors import LockTimeout
from ..fsio import changed_at
from ..keys import GROUP_CHARS, META_EXT
from ..naming import matcher
from ..problem import Problem
from ..schema.document import parse_fields
from ..stats.summary import fold_logs
from ..store.entry import Artifact, not_whole
from ..store.layout import (
    LOCK_DIR,
    NOT_VISIBLE,
    QUARANTINE_DIR,
    STATS_DIR,
    TMP_DIR,
    open_subdir,
    read_metadata,
)
from ..store.locks.flock import lock_name
from ..store.removal import (
    remove_aux_file,
    remove_lock_file,
    remove_root_file,
    remove_unheld_lock,
    repair,
)
from ..store.root import Store
from .index import discard_index
from .prune import Action, Outcome, Plan, Result, kernel_matcher
from .scan import in_directory

#: threads that delete entries (each under its own key's lock) where deleting is mostly waiting
#: for the file system to free blocks: a few threads overlap the waits
DELETE_THREADS = 4
#: deletes made one at a time first, to tell whether they wait on the file system
PROBE_DELETES = 512


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
            status, detail = ACTIONS[action.kind](run, action)
        except OSError as e:
            status, detail = "failed", e.strerror or str(e)
        if progress is not None:
            with ticking:
                progress(1)
        return Outcome(action, status, detail)

    def unit(actions: Sequence[Action]) -> list[Outcome]:
        outcomes = [one(actions[0])]
        for action in actions[1:]:
            before = outcomes[-1]
            if before.status in _KEEPS_UNIT:
                detail = f"kept with {before.action.path}, of the same unit"
                outcomes.append(Outcome(action, before.status, detail))
                if progress is not None:
                    with ticking:
                        progress(1)
            else:
                outcomes.append(one(action))
        return outcomes

    try:
        outcomes = _run(plan.actions, one, unit, threads)
    finally:
        run.close()
    if any(o.status == "changed" for o in outcomes):
        in_directory(store, STATS_DIR, discard_index, None)  # it may be what misled the plan
    folded, error = (0, None)
    if plan.logs_to_fold:
        folded, error = fold_logs(store.locker, plan.logs_to_fold)
    counts: dict[str, int] = {}
    for o in outcomes:
        counts[o.status] = counts.get(o.status, 0) + 1
    return Result(plan, tuple(outcomes), folded, error, counts)


#: the outcomes of an entry's delete that keep the rest of its unit
_KEEPS_UNIT = frozenset({"in-use", "used-since-plan", "changed", "failed"})


def _run(
    actions: Sequence[Action],
    one: Callable[[Action], Outcome],
    unit: Callable[[Sequence[Action]], list[Outcome]],
    threads: bool = True,
) -> list[Outcome]:
    """The outcomes of ``actions``, in order. The leading deletes by size or age (distinct keys,
    which plan_prune puts first, unit after unit) are deleted a unit at a time (``unit``); the
    first :data:`PROBE_DELETES` units one after another; if those spent most of their time
    waiting on the file system (freeing blocks on a real disk), the rest run in
    :data:`DELETE_THREADS` threads to overlap the waits (where nothing waits, as on tmpfs,
    threads would only contend for the same directories). Then the rest, in turn."""
    lead = 0
    while (
        lead < len(actions)
        and actions[lead].kind == "delete-entry"
        and actions[lead].mtime is not None
    ):
        lead += 1
    units = _units(actions[:lead])
    wall, cpu = time.perf_counter(), time.thread_time()
    outcomes = [o for u in units[:PROBE_DELETES] for o in unit(u)]
    wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
    rest = units[PROBE_DELETES:]
    if threads and len(rest) >= 2 * DELETE_THREADS and _mostly_waiting(wall, cpu):
        pool = ThreadPoolExecutor(DELETE_THREADS, thread_name_prefix="kernelcache-prune")
        try:
            outcomes += [o for done in pool.map(unit, rest) for o in done]
        finally:  # (Ctrl-C: the deletes under way finish, no other begins)
            pool.shutdown(wait=True, cancel_futures=True)
    else:
        outcomes += [o for u in rest for o in unit(u)]
    outcomes += map(one, actions[lead:])
    return outcomes


def _units(actions: Sequence[Action]) -> list[tuple[Action, ...]]:
    """``actions`` (deletes, unit after unit) cut into units: the runs of one key group."""
    return [tuple(run) for _, run in groupby(actions, lambda a: (a.key or "")[:GROUP_CHARS])]


def _mostly_waiting(wall: float, cpu: float) -> bool:
    """Whether work that took ``wall`` seconds, ``cpu`` of them on the CPU, mostly waited."""
    return wall - cpu > wall / 2


class _Executor:
    """What runs the actions of one plan (see :data:`ACTIONS`); each returns (status, detail)
    and re-checks before acting."""

    def __init__(self, store: Store, plan: Plan) -> None:
        self.store = store
        self.plan = plan
        self.root = store.root
        self.match_kernel = kernel_matcher(plan.kernels)
        self.match_target = matcher(plan.targets)
        #: .locks/, held open while the plan runs, where build locks are flock files
        self.locks_dir: int | None = None
        if store.lock_mode == "flock":
            with contextlib.suppress(OSError):
                self.locks_dir = store.open_dir(LOCK_DIR)

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
        # (a companion deleted with its kernel is not selected by a filter of its own)
        filtered = bool(plan.kernels or plan.targets) and key not in plan.companions
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

        Probed as the stale-lock check of :mod:`kernelcache.maintenance.scan` does: a non-blocking
        exclusive flock on the file (builders hold it exclusively), and the file is unlinked
        only if its name still is that file (a builder may have made a new one meanwhile;
        the locker of a builder that opened the unlinked one notices and retries).
        """
        if self.locks_dir is not None:
            remove_unheld_lock(self.locks_dir, f"{key}.build.lock")

    def quarantine_entry(self, action: Action) -> tuple[str, str]:
        key = action.key
        assert key is not None
        found = self.store.inspect(key, any_owner=True, whole=True)
        if not isinstance(found, Problem) or not found.corrupt:
            return "gone", "no longer corrupt"
        # re-checked under the lock, then moved; said in the command's summary, not once a key
        after = repair(self.store, key, refuse=not_whole, announce=False)
        if isinstance(after, Artifact):
            return "gone", "no longer corrupt"
        if not os.path.lexists(self.store.meta_path(key)):  # quarantine moves metadata first
            return "done", found.reason
        try:  # (a quarantine that cannot be opened is no entry in use)
            os.close(open_subdir(self.root, QUARANTINE_DIR, create=True))
        except OSError as e:
            return "failed", f"cannot move it into {QUARANTINE_DIR}/: {e.strerror or e}"
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
            remove_root_file(self.root, action.path)
            keep_lock = isinstance(found, Artifact)
            return "done", ""
        finally:
            if held is not None:
                held.release(remove=not keep_lock)

    def remove_aux_file(self, action: Action) -> tuple[str, str]:
        """Remove a file of .tmp/ or .quarantine/ if it is still the file the plan saw."""
        directory, _, name = action.path.partition("/")
        if directory not in (TMP_DIR, QUARANTINE_DIR) or not name or "/" in name:
            return "failed", "not a housekeeping file"
        removed = remove_aux_file(self.root, directory, name, action.mtime)
        if removed is None:
            return "gone", "changed meanwhile"
        return ("done", "") if removed else ("gone", "")

    def remove_lock(self, action: Action) -> tuple[str, str]:
        filename = action.path.partition("/")[2]
        parts = lock_name(filename)
        if parts is None:  # a leftover of a soft lock broken or being taken
            return self._unlink_lock_file(filename)
        key, suffix = parts
        if suffix == ".softlock":
            try:
                held = self.store.locker.acquire_soft(key, timeout=0.2)  # breaks a stale one
            except LockTimeout:
                return "in-use", "its holder came back"
            held.release()
            return "done", ""
        if self.store.lock_mode != "flock":
            return self._unlink_lock_file(filename)  # flock files are unused in soft mode
        locker = self.store.locker
        try:
            held = locker.acquire(key + suffix[: -len(".lock")], shared=False, timeout=0)
        except LockTimeout:
            return "in-use", ""
        entry_back = os.path.lexists(self.store.meta_path(key))
        held.release(remove=not entry_back)
        return ("gone", "its entry exists again") if entry_back else ("done", "")

    def _unlink_lock_file(self, filename: str) -> tuple[str, str]:
        return ("done", "") if remove_lock_file(self.root, filename) else ("gone", "")


#: what executing each action kind (:data:`~kernelcache.maintenance.prune.ACTION_KINDS`) runs
ACTIONS: dict[str, Callable[[_Executor, Action], tuple[str, str]]] = {
    "delete-entry": _Executor.delete_entry,
    "quarantine-entry": _Executor.quarantine_entry,
    "remove-orphan": _Executor.remove_orphan,
    "remove-temp": _Executor.remove_aux_file,
    "remove-quarantined": _Executor.remove_aux_file,
    "remove-lock": _Executor.remove_lock,
}
