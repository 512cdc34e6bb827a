"""Lowered calls as cache entries: a warm process lowers a call with one key computation and one
read, and the opaque it embeds is the one the first process built; a whole program's lowerings
are also kept together, so that a warm process reads one entry for all its calls.

A call's lowering is keyed by its lowering key (:mod:`bridge.lowering.lowering_keys`). An
autotuned call's lowering depends on its decision (:mod:`bridge.entries.decisions`), which can
appear later: its entry (``<key>.variants``) holds the kernel keys of its variants, and each
outcome (every variant for jaxlib to autotune, or one chosen variant) is an entry of its own
(``<key>.lowering``: a small header and the opaque). Calls that hand a file over
(``embed="path"``) are not stored: their opaque names a file of the process.

The keyed calls of one module's lowering that share a setup (target, embedding, cache: see
:class:`bridge.lowering.lower.Setup`) form a :class:`Program`. Each call's lowering is looked up
by its own lowering key and state, first among the items of the program entries this program
has read, then in the program entry stored under that very key (one read brings every call
that followed it when it was written), then in the call's own entries. When the module's
lowering ends, the calls from the first one whose program entry was not found to the last one
are stored as one entry (extension ``program``), under a key derived from the lowering key of
the first of them.

Invariants: a program's item is served only for the lowering key and state it was stored under,
which its call's own lowering entry holds too; any change that changes a call (its kernel,
arguments, the software, a setting) changes its key, and it is looked up as before. An autotuned
call's decision is looked up at every lowering, as before; a state the program entry lacks (a
decision made after it was written) is read from the call's own entry. Per module and setup, at
most one program entry is looked up in vain and at most one is written. Nothing here fails a
lowering: an odd entry is a miss, a failed put costs the next process its reads.

A program entry is served only once every opaque in it is known to inflate whole (what jaxlib
does with one first): checked when a process reads the entry, unless this user recorded the
check of these very bytes before (:mod:`kernelcache.store.layout`; the process that writes an
entry records it, having built its opaques), so a warm process of the same user inflates
nothing. A lowering or program entry that does not decode, or holds an opaque that does not
inflate, is a corrupt entry: quarantined, and none of its items is served.
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from kernelcache.plugin import (
    KERNEL_NAME,
    KEY_PATTERN,
    NAME_SEPARATOR,
    check_recorded,
    record_check,
)

from .kinds import EntryKind

if TYPE_CHECKING:
    from kernelcache import Artifact, Cache

    from ..call.tracing import CallSpec
    from ..vendors.targets import Target

#: a call's lowering, one per state of its decision, keyed by the state alone
LOWERING = EntryKind("lowering", role="{}", wait=0, corrupt="a lowering entry that does not decode")
#: the kernel keys of an autotuned call's variants
VARIANTS = EntryKind("variants", role="variants", wait=0)

FORMAT = 1
MAGIC = b"KCL1"
_HEADER = struct.Struct(">4sI")
#: the state of a lowering that emits every variant (for jaxlib to autotune, or the only one)
EVERY = "every"


class Lowered(NamedTuple):
    """What a call lowers to: the opaque, the embedding, whether jaxlib autotunes it, and the
    oldest jaxlib release that can run it."""

    opaque: bytes
    embed: str
    autotuned: bool
    needs: tuple[int, ...] = (0,)
    #: what the frontend read for the kernels it embeds (their read sets: see
    #: :mod:`bridge.readsets.witness`), checked before it is used again
    reads: tuple[str, ...] = ()


def metadata(call: CallSpec, target: Target) -> dict[str, Any]:
    """The metadata of the entries of ``call``'s lowering."""
    parts = call.parts
    return {
        "kind": LOWERING.ext,
        "name": parts.name,
        "kernel": parts.qualname,
        "target": str(target),
    }


def variant_keys(cache: Cache, key: str) -> list[str] | None:
    """The kernel keys of the variants of the call whose lowering key is ``key``."""
    art = VARIANTS.get(cache, key)
    if art is None:
        return None
    try:
        doc = json.loads(art.data)
    except (ValueError, RecursionError):
        return None
    names = doc.get("variants") if isinstance(doc, dict) else None
    if not isinstance(names, list) or not all(
        isinstance(n, str) and KEY_PATTERN.fullmatch(n) for n in names
    ):
        return None
    return names


def lowered(cache: Cache, key: str, state: str) -> Lowered | None:
    """The stored lowering of ``state`` (:data:`EVERY`, or a chosen variant's index); an
    entry that does not decode, or whose opaque does not inflate whole, is a corrupt entry (a
    miss, quarantined)."""
    found = _entry(cache, key, state)
    return None if found is None else found[1]


def _entry(
    cache: Cache, key: str, state: str, admit: Callable[[Lowered], str | None] | None = None
) -> tuple[Artifact, Lowered] | None:
    """The lowering entry of :func:`lowered`, with what it holds; one of the remote tier that
    ``admit`` refuses (a reason) is a miss, never copied (:meth:`EntryKind.load`)."""
    return LOWERING.load(cache, key, _intact, part=state, admit=admit)


def _intact(data: bytes) -> Lowered | None:
    """The lowering in ``data``, if it decodes and its opaque inflates whole."""
    found = decode(data)
    return found if found is not None and whole(found.opaque) else None


#: the most an opaque may inflate to, per byte of it (machine code and PTX inflate a few times;
#: a zlib bomb a thousand), and at least :data:`MIN_INFLATED` bytes in all
INFLATION = 64
MIN_INFLATED = 16 << 20
_CHUNK = 1 << 20


def whole(opaque: bytes) -> bool:
    """Whether ``opaque`` inflates completely, with nothing after its end: what jaxlib does
    with an opaque first (zlib-compressed, see :func:`bridge.lowering.proto.compress`); in
    chunks that are let go, and no further than :data:`INFLATION` times its size (a stored
    opaque that would inflate past it is not one the bridge wrote)."""
    inflater = zlib.decompressobj()
    most = max(MIN_INFLATED, INFLATION * len(opaque))
    made, data = 0, opaque
    try:
        while not inflater.eof:
            made += len(inflater.decompress(data, _CHUNK))
            if made > most:
                return False
            data = inflater.unconsumed_tail
            if not data and not inflater.eof:
                made += len(inflater.flush())
                break
    except zlib.error:
        return False
    return inflater.eof and not inflater.unused_data and made <= most


def head(done: Lowered) -> dict[str, Any]:
    """What a stored lowering says of itself besides its opaque."""
    return {
        "embed": done.embed,
        "autotuned": done.autotuned,
        "needs": list(done.needs),
        "reads": list(done.reads),
    }


def from_head(head: Any, opaque: bytes) -> Lowered | None:
    """The lowering whose :func:`head` is ``head`` (untrusted), or None."""
    if not isinstance(head, dict):
        return None
    embed, autotuned, needs = head.get("embed"), head.get("autotuned"), head.get("needs")
    if not isinstance(embed, str) or type(autotuned) is not bool:
        return None
    if not isinstance(needs, list) or not all(type(n) is int and n >= 0 for n in needs):
        return None
    reads = head.get("reads", [])
    if not isinstance(reads, list) or not all(type(r) is str for r in reads):
        return None
    return Lowered(opaque, embed, autotuned, tuple(needs), tuple(reads))


def frame(magic: bytes, head: bytes, *body: bytes) -> bytes:
    """``magic``, the size of the JSON text ``head``, ``head``, then ``body``: how lowering and
    program entries lay out their bytes."""
    return b"".join([_HEADER.pack(magic, len(head)), head, *body])


def unframe(data: bytes, magic: bytes) -> tuple[Any, int] | None:
    """The parsed header of what :func:`frame` made with ``magic``, and where its body starts;
    None for anything else."""
    if len(data) < _HEADER.size:
        return None
    found, size = _HEADER.unpack_from(data)
    if found != magic or _HEADER.size + size > len(data):
        return None
    try:
        return json.loads(data[_HEADER.size : _HEADER.size + size]), _HEADER.size + size
    except (ValueError, RecursionError):
        return None


def encode(done: Lowered) -> bytes:
    """A lowering as its entry stores it: a small header, then the opaque."""
    return frame(MAGIC, json.dumps(head(done), sort_keys=True).encode(), done.opaque)


def decode(data: bytes) -> Lowered | None:
    """The lowering :func:`encode` made; None for anything else."""
    found = unframe(data, MAGIC)
    return None if found is None else from_head(found[0], data[found[1] :])


def store(
    cache: Cache,
    key: str,
    call: CallSpec,
    target: Target,
    state: str,
    done: Lowered,
    variants: Sequence[str],
    components: Mapping[str, str] | None = None,
) -> None:
    """Keep what a lowering of ``call`` made, with the ``components`` (named steps) its key is
    the digest of, where given, so that a miss can be explained (never fails the lowering: a
    failing put is a lowering done again next time). Never waits: a key whose lock is held is
    being written by another process, with the same bytes."""
    from kernelcache import CacheError

    data = encode(done)
    meta = metadata(call, target)
    if components:
        meta["components"] = dict(components)
    try:
        if len(variants) > 1:
            doc = json.dumps({"variants": list(variants)}).encode()
            VARIANTS.put(cache, key, doc, meta)
        LOWERING.put(cache, key, data, meta, part=state)
    except (CacheError, ValueError):
        return


def decided_state(
    cache: Cache, call: CallSpec, names: Sequence[str], devices: Sequence[str]
) -> str | None:
    """The state of an autotuned call's lowering: its decision's chosen index, or None when
    there is no decision."""
    from . import decisions  # (an autotuned call: its decision)

    keys = decisions.keys_for(call.parts, call.named, names, devices)
    found = decisions.find(cache, keys, names)
    return None if found is None else str(found.chosen)


# -- programs: a program's lowerings in one entry ---------------------------------------------
#: a program's lowerings as one entry, under its first call's lowering key
PROGRAM = EntryKind(
    "program", role="program", wait=0, corrupt="a program entry that does not decode"
)

PROGRAM_MAGIC = b"KCP1"
#: at most this many calls in one program entry (more are looked up one by one)
MAX_ITEMS = 4096


class Item(NamedTuple):
    """One call of a program: its lowering key, the state it lowered in, the kernel keys of its
    variants (autotuned calls only) and what it lowered to."""

    key: str
    state: str
    variants: tuple[str, ...] | None
    lowered: Lowered


def encode_program(items: Sequence[Item]) -> bytes:
    """A program entry's bytes: a header describing each item (what its lowering entry's own
    header says, :func:`head`), then the items' opaques."""
    index = [
        [
            item.key,
            item.state,
            None if item.variants is None else list(item.variants),
            head(item.lowered),
            len(item.lowered.opaque),
        ]
        for item in items
    ]
    text = json.dumps({"items": index}, separators=(",", ":")).encode()
    return frame(PROGRAM_MAGIC, text, *(i.lowered.opaque for i in items))


def _state(value: Any) -> bool:
    return value == EVERY or (type(value) is str and value.isascii() and value.isdigit())


def _variants(value: Any) -> bool:
    return value is None or (
        isinstance(value, list)
        and len(value) > 1
        and all(type(v) is str and KEY_PATTERN.fullmatch(v) for v in value)
    )


def decode_program(data: bytes) -> list[Item] | None:
    """The items of a program entry; None for anything that is not exactly one."""
    framed = unframe(data, PROGRAM_MAGIC)
    if framed is None:
        return None
    said, at = framed
    index = said.get("items") if isinstance(said, dict) else None
    if not isinstance(index, list) or not 0 < len(index) <= MAX_ITEMS:
        return None
    items = []
    for row in index:
        if not isinstance(row, list) or len(row) != 5:
            return None
        key, state, variants, its_head, length = row
        if type(key) is not str or not KEY_PATTERN.fullmatch(key) or not _state(state):
            return None
        if not _variants(variants) or type(length) is not int or not 0 < length <= len(data) - at:
            return None
        done = from_head(its_head, data[at : at + length])
        if done is None:
            return None
        at += length
        items.append(Item(key, state, None if variants is None else tuple(variants), done))
    return items if at == len(data) else None


#: the name of the check recorded for a program entry (:mod:`kernelcache.store.layout`)
CHECK = "opaques-inflate"


class Program:
    """The keyed calls of one module's lowering that share a setup, and the lowerings of the
    program entries read for them (see the module docstring). Used by one thread."""

    def __init__(
        self,
        cache: Cache,
        checked: dict[Any, Any] | None = None,
        identities: dict[int, tuple[Any, str]] | None = None,
    ) -> None:
        self.cache = cache
        self._lowered: dict[tuple[str, str], Lowered] = {}
        #: the entry each lowering served so far was read from (its kind and artifact)
        self._from: dict[tuple[str, str], tuple[EntryKind, Artifact]] = {}
        self._variants: dict[str, tuple[str, ...] | None] = {}  # every key the entries hold
        self._calls: list[Item] = []
        self._described: list[tuple[CallSpec, Target]] = []
        self._start: int | None = None  # the first call whose program entry was not found
        self._missed = False
        #: a program entry of the remote tier read without a copy, with the lowerings of it
        #: not served yet and the first call it served: once every one was, the calls it
        #: served (each checked here) are kept in the local root, never its bytes (:meth:`close`)
        self._remote: tuple[Artifact, set[tuple[str, str]], int] | None = None
        #: the read sets checked in this module's lowering (shared by its programs:
        #: :func:`~bridge.readsets.read_sets.stale`'s ``seen``)
        self.checked: dict[Any, Any] = {} if checked is None else checked
        #: the identities of the JIT functions keyed in this module's lowering (shared too:
        #: :func:`~bridge.lowering.lowering_keys.lowering_key`'s ``known``)
        self.identities: dict[int, tuple[Any, str]] = {} if identities is None else identities

    def _read(self, key: str) -> None:
        """Read the program entry of ``key`` (a key no entry read so far holds), unless one
        was looked up in vain for an earlier call."""
        if self._missed:
            return

        def first(data: bytes) -> list[Item] | None:
            """The items of a program entry whose first call is ``key``'s."""
            items = decode_program(data)
            return items if items is not None and items[0].key == key else None

        # (one of the remote tier is copied only once its calls' checks accepted it whole)
        found = PROGRAM.load(self.cache, key, first, copy=False)
        if found is None:
            self._missed, self._start = True, len(self._calls)
            return
        art, items = found
        digest = art.meta.get("digest")
        if not check_recorded(self.cache.root, CHECK, art.key, digest):
            if not all(whole(item.lowered.opaque) for item in items):
                PROGRAM.quarantine(
                    self.cache, art, "a program entry holding an opaque that does not inflate"
                )
                self._missed, self._start = True, len(self._calls)
                return
            record_check(self.cache.root, CHECK, art.key, digest)
        for item in items:
            self._lowered.setdefault((item.key, item.state), item.lowered)
            self._from.setdefault((item.key, item.state), (PROGRAM, art))
            self._variants.setdefault(item.key, item.variants)
        if art.path is None and self._remote is None:
            self._remote = (art, {(item.key, item.state) for item in items}, len(self._calls))

    def variants(self, key: str) -> list[str] | None:
        """:func:`variant_keys`, from the program entries where they hold ``key``."""
        if key not in self._variants:
            self._read(key)
        known = self._variants.get(key)
        if known is not None:
            return list(known)
        return variant_keys(self.cache, key)

    def lowered(
        self, key: str, state: str, admit: Callable[[Lowered], str | None] | None = None
    ) -> Lowered | None:
        """:func:`lowered`, from the program entries where they hold it; the entry each came
        from is kept, for :meth:`refuse`. ``admit``: the check of a lowering entry of the
        remote tier at its door (:func:`_entry`)."""
        if key not in self._variants:
            self._read(key)
        found = self._lowered.get((key, state))
        if found is not None:
            return found
        read = _entry(self.cache, key, state, admit)
        if read is None:
            return None
        self._from[(key, state)] = (LOWERING, read[0])
        return read[1]

    def refuse(self, key: str, state: str, reason: str) -> None:
        """Set aside the entry the lowering ``(key, state)`` was read from, which no compile of
        this code wrote (``reason``: a read set its code does not admit): quarantined where
        the cache can, a program entry whole (none of its items is served again)."""
        self._lowered.pop((key, state), None)
        found = self._from.pop((key, state), None)
        if found is not None:
            kind, art = found
            if self._remote is not None and self._remote[0] is art:
                self._remote = None  # (never copied: nothing to set aside here)
            kind.quarantine(self.cache, art, reason[:300])

    def note(self, item: Item, call: CallSpec, target: Target) -> None:
        """Note what ``call``, a call of the program, lowered to for ``target``."""
        self._calls.append(item)
        self._described.append((call, target))
        if self._remote is not None:
            self._remote[1].discard((item.key, item.state))

    def close(self) -> None:
        """Store the calls from the first one whose program entry was not found (if any) as
        one program entry, and forget them (never fails, never waits)."""
        from kernelcache import CacheError

        start, calls, described = self._start, self._calls, self._described
        self._start, self._calls, self._described, self._missed = None, [], [], False
        self._lowered.clear()
        self._from.clear()
        self._variants.clear()
        remote, self._remote = self._remote, None
        if remote is not None and not remote[1] and start is None:
            start = remote[2]  # (every lowering of it served and checked: those are kept)
        if start is None or start >= len(calls):
            return
        seen: set[tuple[str, str]] = set()
        items: list[Item] = []
        for item in calls[start:]:
            if (item.key, item.state) not in seen and len(items) < MAX_ITEMS:
                seen.add((item.key, item.state))
                items.append(item)
        try:
            meta = metadata(*described[start])
            # named after every kernel it holds (as many as the fields have room for), so that
            # `kernelcache ls` says what it holds and `prune --kernel` finds it by any of them
            held = list(
                dict.fromkeys((c.parts.name, c.parts.qualname) for c, _ in described[start:])
            )
            while len(held) > 1 and KERNEL_NAME(NAME_SEPARATOR.join(q for _, q in held)):
                held.pop()
            meta["name"] = NAME_SEPARATOR.join(dict.fromkeys(n for n, _ in held))
            meta["kernel"] = NAME_SEPARATOR.join(dict.fromkeys(q for _, q in held))
            data = encode_program(items)
            art = PROGRAM.put(self.cache, items[0].key, data, meta)
        except (CacheError, ValueError, OSError):
            return
        if art.data == data:  # (its opaques were built or checked here; not another's entry)
            record_check(self.cache.root, CHECK, art.key, art.meta.get("digest"))
