"""Planning what to remove from a root: :func:`plan_prune` (size cap, age, filters and patterns,
clear) and :func:`plan_repair` (``verify --repair``). Planning removes nothing.

A plan is data: a tuple of :class:`Action` records, in the order they will run, with the bytes
each frees. ``prune --dry-run`` prints the plan and stops; ``prune`` and ``verify --repair``
execute it (:mod:`kernelcache.maintenance.execute`). The entries a plan deletes by size or age
come first and are distinct keys, one unit after another (:func:`units_of`): a kernel goes or
stays with its companions (the entries of its key's group: its PTX, what is stored beside it),
its own entries first. Staging files, quarantined files and lock files are planned
only once older than their age limits, so a write in progress never loses them; per-process
statistics logs of finished processes are planned for folding into the summary
(:func:`kernelcache.stats.fold_logs`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from itertools import repeat
from operator import add
from typing import Any, NamedTuple, cast

from ..errors import InvalidValue
from ..keys import GROUP_CHARS
from ..naming import kernel_names, matcher
from ..table import EntryInfo, EntryTable
from .records import CacheScan, Issue

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
    #: the keys the plan deletes only as companions of a selected kernel (they match no filter
    #: themselves: their filters are not checked again)
    companions: frozenset[str] = frozenset()
    #: the kernels (entries without a ``kind``) the plan keeps, and deletes
    kept_kernels: int = 0
    deleted_kernels: int = 0

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
        """Bytes removed (a quarantined entry's are moved, not freed: :attr:`quarantined_bytes`)."""
        return sum(
            o.action.size
            for o in self.outcomes
            if o.status == "done" and o.action.kind != "quarantine-entry"
        )

    @property
    def quarantined_bytes(self) -> int:
        """Bytes of the entries moved to ``.quarantine/`` (freed when a prune removes them)."""
        return sum(
            o.action.size
            for o in self.outcomes
            if o.status == "done" and o.action.kind == "quarantine-entry"
        )

    def with_status(self, status: str) -> list[Outcome]:
        return [o for o in self.outcomes if o.status == status]


# -- planning -----------------------------------------------------------------------------
def kernel_matcher(patterns: Iterable[str]) -> Callable[[object, object], bool]:
    """A test of an entry's kernel against ``patterns`` (as :func:`matcher`), given its
    ``name`` and ``kernel`` fields: it matches when a pattern matches a kernel name the entry
    holds (an entry of several lists them: :func:`~kernelcache.naming.kernel_names`) or where
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


def units_of(table: EntryTable, indices: Sequence[int]) -> list[list[int]]:
    """``indices`` of ``table`` as the units a prune keeps or deletes whole: a kernel (an entry
    without a ``kind``) with its companions, the entries of its key group
    (:func:`kernelcache.keys.group_of`), kernel first. Kernels that share a group (unrelated
    keys that happen to start alike) are units of their own, and the companions of such a
    group one more; companions without a kernel are one unit. Two passes over the indices."""
    keys, kinds = table.key, table.kind
    kernels: dict[str, list[int]] = {}
    others: dict[str, list[int]] = {}
    for i in indices:
        (kernels if kinds[i] is None else others).setdefault(keys[i][:GROUP_CHARS], []).append(i)
    units = []
    for group, found in kernels.items():
        rest = others.pop(group, [])
        if len(found) == 1:
            units.append(found + rest)
        else:
            units += [[i] for i in found] + ([rest] if rest else [])
    return units + list(others.values())


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

    Entries go by unit (:func:`units_of`: a kernel with its companions), a unit selected
    where one of its entries matches ``kernels``/``targets`` and last used when the most
    recently used of its entries was. Of the selected units, those not used for
    ``older_than`` seconds go; then, least recently used first, as many as needed to bring
    the selected units' bytes (artifacts plus metadata) to at most ``max_size``. With filters
    but neither limit, every selected unit goes; with no filter and no limit, no entry goes.
    ``everything`` (``kernelcache clear``): every entry goes, even one used after the plan
    was made.

    Housekeeping, always: orphan artifacts and metadata without artifact, staging files and
    lock files past the grace period, quarantined files older than ``quarantine_age``, and the
    statistics logs of finished processes the scan found (``scanned.logs``: folded, not lost).
    """
    now = scanned.scanned_at if now is None else now
    table = scanned.table
    last = table.last_used
    if len(last) != len(table) or None in last:
        raise InvalidValue("plan_prune needs a scan made with last_used=True")
    keys, nbytes = table.key, list(map(add, table.size, table.meta_size))
    units = units_of(table, range(len(table)))
    matching: set[int] | None = None
    if kernels or targets:
        match_k, match_t = kernel_matcher(kernels), matcher(targets)
        matching = {
            i
            for i in range(len(table))
            if (not kernels or match_k(table.kernel[i], table.qualname[i]))
            and (not targets or match_t(table.target[i]))
        }
        units = [u for u in units if not matching.isdisjoint(u)]
    stamps = cast("tuple[float, ...]", last)  # (none is None: checked above)
    used = [stamps[u[0]] if len(u) == 1 else max(map(stamps.__getitem__, u)) for u in units]
    size = [nbytes[u[0]] if len(u) == 1 else sum(map(nbytes.__getitem__, u)) for u in units]
    # least recently used first; ties broken by key group so that plans are reproducible
    lru = sorted(range(len(units)), key=lambda u: (used[u], keys[units[u][0]][:GROUP_CHARS]))
    reason_of: dict[int, str] = {}
    if everything:
        reason_of = dict.fromkeys(lru, "clear")
    elif max_size is None and older_than is None:
        if kernels or targets:
            reason_of = dict.fromkeys(lru, "matches --kernel/--target")
    else:
        if older_than is not None:
            cutoff = now - older_than
            reason_of = {u: "not used within --older-than" for u in lru if used[u] < cutoff}
        if max_size is not None:
            total = sum(size) - sum(size[u] for u in reason_of)
            for u in lru:
                if total <= max_size:
                    break
                if u not in reason_of:
                    reason_of[u] = "least recently used, over --max-size"
                    total -= size[u]
    doomed_units = [u for u in lru if u in reason_of]
    doomed = [i for u in doomed_units for i in units[u]]
    reason = [reason_of[u] for u in doomed_units for _ in units[u]]
    exts = table.ext
    paths = [f"{keys[i]}.{exts[i]}" for i in doomed]
    rows = zip(
        repeat("delete-entry"),
        paths,
        [nbytes[i] for i in doomed],
        reason,
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
    kinds = table.kind
    deleted_kernels = sum(1 for i in doomed if kinds[i] is None)
    return Plan(
        tuple(actions),
        kept_entries=len(table) - len(doomed),
        kept_bytes=sum(nbytes) - sum(nbytes[i] for i in doomed),
        logs_to_fold=scanned.logs,
        left=tuple(left),
        kernels=frozenset(kernels),
        targets=frozenset(targets),
        keep_used=not everything,
        companions=frozenset(
            () if matching is None else (keys[i] for i in doomed if i not in matching)
        ),
        kept_kernels=kinds.count(None) - deleted_kernels,
        deleted_kernels=deleted_kernels,
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
    """Plan ``verify --repair`` for a scan checked by :func:`kernelcache.maintenance.verify.verify`:
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
