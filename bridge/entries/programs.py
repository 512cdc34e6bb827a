"""A program's lowerings in one entry: a warm process lowers the calls of a program it lowered
before with one read, not one (or two) per call.

The keyed calls of one module's lowering that share a setup (target, embedding, cache: see
:class:`bridge.lowering.lower.Setup`) form a :class:`Program`. Each call's lowering is looked up by its own
lowering key and state (see :mod:`bridge.entries.lowerings`), first among the items of the program
entries this program has read, then in the program entry stored under that very key (one
read brings every call that followed it when it was written), then in the call's own entries.
When the module's lowering ends, the calls from the first one whose program entry was not
found to the last one are stored as one entry (extension ``program``), under a key derived from
the lowering key of the first of them.

Invariants: an item is served only for the lowering key and state it was stored under, which
its call's own lowering entry holds too; any change that changes a call (its kernel, arguments,
the software, a setting) changes its key, and it is looked up as before. An autotuned call's
decision is looked up at every lowering, as before; a state the program entry lacks (a decision
made after it was written) is read from the call's own entry. Per module and setup, at most
one program entry is looked up in vain and at most one is written. Nothing here fails a
lowering: an odd program entry is a miss, a failed put costs the next process its reads.

A program entry is served only once every opaque in it is known to inflate whole (what jaxlib
does with one first): checked when a process reads the entry, unless this user recorded the
check of these very bytes before (:mod:`kernelcache.store.layout`; the process that writes an entry
records it, having built its opaques), so a warm process of the same user inflates nothing. A
program entry that does not decode, or holds an opaque that does not inflate, is a corrupt
entry: quarantined, and none of its items is served.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kernelcache.keys import KEY_PATTERN
from kernelcache.schema import KERNEL_NAME
from kernelcache.store import check_recorded, record_check
from kernelcache.table import NAME_SEPARATOR

from . import lowerings
from .kinds import EntryKind
from .lowerings import Lowered

if TYPE_CHECKING:
    from kernelcache import Cache

    from ..call.tracing import CallSpec
    from ..vendors.targets import Target

#: a program's lowerings as one entry, under its first call's lowering key
PROGRAM = EntryKind(
    "program", role="program", wait=0, corrupt="a program entry that does not decode"
)

MAGIC = b"KCP1"
#: at most this many calls in one program entry (more are looked up one by one)
MAX_ITEMS = 4096


@dataclass(frozen=True)
class Item:
    """One call of a program: its lowering key, the state it lowered in, the kernel keys of its
    variants (autotuned calls only) and what it lowered to."""

    key: str
    state: str
    variants: tuple[str, ...] | None
    lowered: Lowered


def encode(items: Sequence[Item]) -> bytes:
    """A program entry's bytes: a header describing each item (what its lowering entry's own
    header says, :func:`bridge.entries.lowerings.head`), then the items' opaques."""
    index = [
        [
            item.key,
            item.state,
            None if item.variants is None else list(item.variants),
            lowerings.head(item.lowered),
            len(item.lowered.opaque),
        ]
        for item in items
    ]
    head = json.dumps({"items": index}, separators=(",", ":")).encode()
    return lowerings.frame(MAGIC, head, *(i.lowered.opaque for i in items))


def _state(value: Any) -> bool:
    return value == lowerings.EVERY or (type(value) is str and value.isascii() and value.isdigit())


def _variants(value: Any) -> bool:
    return value is None or (
        isinstance(value, list)
        and len(value) > 1
        and all(type(v) is str and KEY_PATTERN.fullmatch(v) for v in value)
    )


def decode(data: bytes) -> list[Item] | None:
    """The items of a program entry; None for anything that is not exactly one."""
    framed = lowerings.unframe(data, MAGIC)
    if framed is None:
        return None
    head, at = framed
    index = head.get("items") if isinstance(head, dict) else None
    if not isinstance(index, list) or not 0 < len(index) <= MAX_ITEMS:
        return None
    items = []
    for row in index:
        if not isinstance(row, list) or len(row) != 5:
            return None
        key, state, variants, said, length = row
        if type(key) is not str or not KEY_PATTERN.fullmatch(key) or not _state(state):
            return None
        if not _variants(variants) or type(length) is not int or not 0 < length <= len(data) - at:
            return None
        lowered = lowerings.from_head(said, data[at : at + length])
        if lowered is None:
            return None
        at += length
        items.append(Item(key, state, None if variants is None else tuple(variants), lowered))
    return items if at == len(data) else None


#: the name of the check recorded for a program entry (:mod:`kernelcache.store.layout`)
CHECK = "opaques-inflate"


class Program:
    """The keyed calls of one module's lowering that share a setup, and the lowerings of the
    program entries read for them (see the module docstring). Used by one thread."""

    def __init__(self, cache: Cache) -> None:
        self.cache = cache
        self._lowered: dict[tuple[str, str], Lowered] = {}
        self._variants: dict[str, tuple[str, ...] | None] = {}  # every key the entries hold
        self._calls: list[Item] = []
        self._described: list[tuple[CallSpec, Target]] = []
        self._start: int | None = None  # the first call whose program entry was not found
        self._missed = False

    def _read(self, key: str) -> None:
        """Read the program entry of ``key`` (a key no entry read so far holds), unless one
        was looked up in vain for an earlier call."""
        if self._missed:
            return

        def first(data: bytes) -> list[Item] | None:
            """The items of a program entry whose first call is ``key``'s."""
            items = decode(data)
            return items if items is not None and items[0].key == key else None

        found = PROGRAM.load(self.cache, key, first)
        if found is None:
            self._missed, self._start = True, len(self._calls)
            return
        art, items = found
        digest = art.meta.get("digest")
        if not check_recorded(self.cache.root, CHECK, art.key, digest):
            if not all(lowerings.whole(item.lowered.opaque) for item in items):
                PROGRAM.quarantine(
                    self.cache, art, "a program entry holding an opaque that does not inflate"
                )
                self._missed, self._start = True, len(self._calls)
                return
            record_check(self.cache.root, CHECK, art.key, digest)
        for item in items:
            self._lowered.setdefault((item.key, item.state), item.lowered)
            self._variants.setdefault(item.key, item.variants)

    def variants(self, key: str) -> list[str] | None:
        """:func:`bridge.entries.lowerings.variant_keys`, from the program entries where they hold
        ``key``."""
        if key not in self._variants:
            self._read(key)
        known = self._variants.get(key)
        if known is not None:
            return list(known)
        return lowerings.variant_keys(self.cache, key)

    def lowered(self, key: str, state: str) -> Lowered | None:
        """:func:`bridge.entries.lowerings.lowered`, from the program entries where they hold it."""
        if key not in self._variants:
            self._read(key)
        found = self._lowered.get((key, state))
        return found if found is not None else lowerings.lowered(self.cache, key, state)

    def note(self, item: Item, call: CallSpec, target: Target) -> None:
        """Note what ``call``, a call of the program, lowered to for ``target``."""
        self._calls.append(item)
        self._described.append((call, target))

    def close(self) -> None:
        """Store the calls from the first one whose program entry was not found (if any) as
        one program entry, and forget them (never fails, never waits)."""
        from kernelcache import CacheError

        start, calls, described = self._start, self._calls, self._described
        self._start, self._calls, self._described, self._missed = None, [], [], False
        self._lowered.clear()
        self._variants.clear()
        if start is None or start >= len(calls):
            return
        seen: set[tuple[str, str]] = set()
        items: list[Item] = []
        for item in calls[start:]:
            if (item.key, item.state) not in seen and len(items) < MAX_ITEMS:
                seen.add((item.key, item.state))
                items.append(item)
        try:
            meta = lowerings.metadata(*described[start])
            # named after every kernel it holds (as many as the fields have room for), so that
            # `kernelcache ls` says what it holds and `prune --kernel` finds it by any of them
            held = list(
                dict.fromkeys((c.parts.name, c.parts.qualname) for c, _ in described[start:])
            )
            while len(held) > 1 and KERNEL_NAME(NAME_SEPARATOR.join(q for _, q in held)):
                held.pop()
            meta["name"] = NAME_SEPARATOR.join(dict.fromkeys(n for n, _ in held))
            meta["kernel"] = NAME_SEPARATOR.join(dict.fromkeys(q for _, q in held))
            data = encode(items)
            art = PROGRAM.put(self.cache, items[0].key, data, meta)
        except (CacheError, ValueError, OSError):
            return
        if art.data == data:  # (its opaques were built or checked here; not another's entry)
            record_check(self.cache.root, CHECK, art.key, art.meta.get("digest"))
