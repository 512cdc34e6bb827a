"""The lookup a lowering makes for one specialization, followed for ``kernelcache explain``:
which entry it uses, and what that entry's reads, and those of the entries it passes, find now.

A lowering looks its kernel up under the call's key; where the entry there holds a read set
(what Triton's frontend read when it generated the kernel: :mod:`bridge.readsets.read_sets`)
whose reads find something else now, it looks under the key chained from that entry and what
the reads find (:func:`~bridge.readsets.read_sets.chained`), for at most
:data:`~bridge.readsets.read_sets.MAX_HOPS` more keys, then compiles in memory.
:func:`follow` makes the same lookups and the same check
(:func:`bridge.compile.fetch.stale`, which is safe against a hostile read set) in the same
order: an entry whose companion PTX is missing is compiled again before its reads are checked,
and a key known not to compile is left out. Nothing here compiles, counts, quarantines (a
read set no compile of this code wrote is only said) or writes: entries are read without a trace
(``Store.inspect``), in the local layers (a remote tier's entries are not looked up: a
lookup there publishes what it finds).

The reads of the entry used are not made twice: its check found each as it was. The reads
of an entry passed are made once more (:func:`~bridge.readsets.read_sets.wants`) to say which
find something else. What a read found is shown where its read set holds it as a short plain
value (a number, a short string, Triton's own objects); otherwise only whether it is the
same. An environment variable's read is only named: its read set holds a keyed digest of the
value, and nothing of the value is shown.
"""

from __future__ import annotations

import functools
import json
import struct
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kernelcache import Artifact

from ..compile import fetch
from ..entries import failures, metadata
from ..entries.failures import FAILURE
from ..entries.kernels import PTX, ptx_pairs
from ..entries.metadata import OPS
from ..identity import frontend
from ..identity.namespaces import module_map_of
from ..readsets import read_sets

if TYPE_CHECKING:
    from kernelcache import Cache

    from ..identity.specialize import Specialization

#: the longest operand or value shown
WIDE = 60
#: how many differing reads a line names
FEW = 3


def where(hops: int) -> str:
    """Where an entry is from the call's key."""
    return "under its key" if hops == 0 else f"{_hops(hops)} from its key"


def _hops(n: int) -> str:
    return f"{n} hop" + ("" if n == 1 else "s")


@dataclass(frozen=True)
class Read:
    """One read of a read set: its operation ``op``, what it read (``operand``, for a person:
    ``helper.SCALE``, ``scale()``, a variable's name), whether it finds what it found, and what
    it found then (``was``) and now (``now``) where those are short plain values (never for
    an environment variable)."""

    op: str
    operand: str
    same: bool
    was: str | None = None
    now: str | None = None

    @property
    def kind(self) -> str:
        return OPS[self.op].one if self.op in OPS else self.op

    def found(self) -> str:
        if self.same:
            return "same"
        if self.was is not None and self.now is not None:
            return f"was {self.was}, now {self.now}"
        return "differs"

    def text(self) -> str:
        return f"{self.op:<2} {self.operand}: {self.found()}"

    def to_json(self) -> dict[str, Any]:
        return {
            "op": self.op,
            "kind": self.kind,
            "operand": self.operand,
            "same": self.same,
            "was": self.was,
            "now": self.now,
        }


@dataclass(frozen=True)
class Passed:
    """An entry the lookup found and passed: its reads find something else now, or were not
    made (``unchecked`` says why: a read set no compile of this code wrote, or one of an earlier
    format), so the lowering looks under the next key."""

    key: str
    hops: int  # how many keys the lookup was chained before this one
    layer: str
    reads: tuple[Read, ...]
    partial: tuple[str, ...]
    unchecked: str | None = None

    @property
    def differs(self) -> tuple[Read, ...]:
        return tuple(r for r in self.reads if not r.same)

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "hops": self.hops,
            "layer": self.layer,
            "unchecked": self.unchecked,
            "partial": list(self.partial),
            "reads": [r.to_json() for r in self.reads],
        }

    def text(self) -> str:
        head = f"the entry {where(self.hops)} ({self.key[:16]}, {self.layer})"
        if self.unchecked is not None:
            return f"{head}: its reads were not made: {self.unchecked}"
        named = [f"{r.operand} {r.found()}" for r in self.differs[:FEW]]
        more = len(self.differs) - FEW
        if more > 0:
            named.append(f"and {more} more")
        return f"{head} was compiled from other reads: {'; '.join(named) or 'its reads differ'}"


@dataclass(frozen=True)
class Lookup:
    """What a lowering's lookup of one specialization comes to: ``status`` ``"hit"`` (the
    entry ``key``, ``hops`` keys chained from the call's, in ``layer``, with its ``reads``:
    None where it records none, and its read set as stored, ``text``), ``"miss"`` or
    ``"left-out"`` (``note`` says why where more than the absence of an entry), and the entries
    ``passed`` on the way."""

    status: str
    key: str | None = None
    hops: int | None = None
    layer: str | None = None
    reads: tuple[Read, ...] | None = None
    partial: tuple[str, ...] = ()
    passed: tuple[Passed, ...] = ()
    note: str | None = None
    text: str | None = None


def follow(spec: Specialization, cache: Cache) -> Lookup:
    """The lookups a lowering of ``spec`` makes in ``cache`` (the walk of
    :func:`bridge.readsets.read_sets.follow`), and where they end."""
    passed: list[Passed] = []
    unpaired: list[str] = []

    def entry(key: str) -> Artifact | None:
        art = inspected(cache, key, spec.ext)
        if art is not None and spec.target.vendor.has_ptx and not _paired(cache, key, art):
            unpaired.append(key)  # (a lowering compiles it again: a miss)
            return None
        return art

    def now(key: str, art: Artifact) -> read_sets.Verdict:
        verdict = fetch.stale(spec, art.meta)
        if not verdict.fresh:
            passed.append(_passed(spec, art, len(passed), verdict))
        return verdict

    key, art = read_sets.follow(spec.key, entry, now)
    went = tuple(passed)
    if art is not None:
        text = art.meta.get("reads")
        rows = read_sets.parse(text) if isinstance(text, str) else None
        found = None if rows is None else tuple(_reads(rows, None))
        read_set = text if isinstance(text, str) else None
        return Lookup(
            "hit", key, len(passed), art.source, found, _partial(text), went, text=read_set
        )
    if key is None:
        note = (
            f"its reads found something else under each of its {read_sets.MAX_HOPS + 1} keys: "
            "compiled in memory at each lowering"
        )
        return Lookup("miss", passed=went, note=note)
    if unpaired:
        note = "the entry is there, but not the PTX it was built from (pruned?): compiled again"
        return Lookup("miss", passed=went, note=note)
    failed = _failed(cache, key)
    if failed is not None:
        return Lookup("left-out", passed=went, note=failed)
    kept = "nothing is kept for what they find now: a lowering compiles the kernel"
    return Lookup("miss", passed=went, note=kept if passed else None)


def inspected(cache: Cache, key: str, ext: str) -> Artifact | None:
    """The entry ``key`` of the first layer of ``cache`` that holds it whole, read leaving no
    trace (no hit counted, no last-used stamp refreshed)."""
    for store in cache.layers:
        art = store.inspect(key, ext)
        if isinstance(art, Artifact):
            return art
    return None


def _failed(cache: Cache, key: str) -> str | None:
    """Why the kernel ``key`` cannot compile, where a layer remembers it
    (:mod:`bridge.entries.failures`)."""
    for store in cache.layers:
        art = store.inspect(FAILURE.key(key), FAILURE.ext)
        if isinstance(art, Artifact):
            return failures.parse(art.data, key)
    return None


def _paired(cache: Cache, key: str, art: Artifact) -> bool:
    """Whether a layer holds the PTX ``art``'s metadata names (what a lowering needs with it)."""
    for store in cache.layers:
        ptx = store.inspect(PTX.key(key), PTX.ext)
        if isinstance(ptx, Artifact) and ptx_pairs(art.meta, ptx.data):
            return True
    return False


def _partial(text: Any) -> tuple[str, ...]:
    """What the read set ``text`` says its witness could not follow (nothing where it is no
    read set)."""
    if not isinstance(text, str) or metadata.problem(text) is not None:
        return ()
    return tuple(_short(str(p), 300) for p in json.loads(text).get("partial", ()))


def _passed(spec: Specialization, art: Artifact, hops: int, now: read_sets.Verdict) -> Passed:
    """``art``, whose reads find ``now`` (:func:`bridge.compile.fetch.stale`), its reads made
    once more to say which differ."""
    text = art.meta["reads"]
    rows = read_sets.parse(text)
    if rows is None:
        why = "a read set of an earlier format, or none this version reads"
        return Passed(art.key, hops, art.source, (), (), why)
    if now.kind == read_sets.REFUSED:
        return Passed(art.key, hops, art.source, (), _partial(text), _refused(now.reason))
    wants = read_sets.wants(
        text,
        spec.source.fn,
        read_sets.params(spec.source),
        module_map_of(spec.backend),
        spec.backend,
        expected=lambda: [frontend.specialization(spec.source, spec.bound.options)],
    )
    if isinstance(wants, read_sets.Verdict):  # (refused on this second making)
        reason = wants.reason or "not a read set"
        return Passed(art.key, hops, art.source, (), _partial(text), _refused(reason))
    return Passed(art.key, hops, art.source, tuple(_reads(rows, wants)), _partial(text))


def _refused(reason: str) -> str:
    why = _short(reason, 300)
    return f"a read set no compile of this code wrote ({why}): a lowering sets the entry aside"


def _reads(rows: Sequence[tuple[int, str, Any, str]], now: Sequence[str] | None) -> list[Read]:
    """The rows of a read set as :class:`Read` s: each the same where ``now`` is None (its check
    found every read as it was), else as ``now`` (what each finds now) says."""
    names: list[str] = []
    out = []
    for index, (parent, op, operand, want) in enumerate(rows):
        name = _operand(names, parent, op, operand)
        names.append(name)
        found = want if now is None else now[index]
        if found == want:
            out.append(Read(op, name, True))
        elif op == "e":
            out.append(Read(op, name, False))
        else:
            out.append(Read(op, name, False, _value(want), _value(found)))
    return out


def _operand(names: Sequence[str], parent: int, op: str, operand: Any) -> str:
    """What a row reads, for a person (:func:`bridge.entries.metadata.worded`), from the
    ``names`` of the rows before it."""
    base = names[parent] if 0 <= parent < len(names) else None
    return _short(metadata.worded(op, operand, base, functools.partial(_argument, names)))


def _kind(op: str, count: int) -> str:
    return OPS[op].one if count == 1 else OPS[op].several


def _argument(names: Sequence[str], arg: Any) -> str:
    tag, body = arg
    if tag in ("r", "rk"):
        return names[body] if 0 <= body < len(names) else "?"
    return _plain(body) or "…"


def _value(want: str) -> str | None:
    """What a read found, where its digest holds it as a short plain value; None where only a
    digest says it."""
    if want == "absent":
        return "absent"
    if want == "error":
        return "a failed read"
    if want.startswith("same:"):
        return _short(f"what read {want[5:]} found")
    if not want.startswith(("[", '"')):
        return None  # (a digest of a description)
    try:
        return _plain(json.loads(want))
    except ValueError:
        return None


def _plain(desc: Any, depth: int = 0) -> str | None:
    """A plain value described as :func:`~bridge.identity.namespaces.exact` describes it (or
    a module, or Triton's own object), shortly; None for anything else."""
    if desc == "N":
        return "None"
    if not isinstance(desc, list) or not desc or depth > 3:
        return None
    tag, body = desc[0], desc[1] if len(desc) > 1 else None
    text: str | None = None
    if tag == "module" and len(desc) == 1:
        text = "a module"
    elif tag == "triton" and len(desc) == 3:
        text = ".".join(p for p in desc[1:] if isinstance(p, str) and p)
    elif tag == "b":
        text = str(bool(body))
    elif tag == "i" or tag == "d":
        text = str(body)
    elif tag == "f" and isinstance(body, str) and len(body) == 16:
        text = repr(struct.unpack("<d", bytes.fromhex(body))[0])
    elif tag == "s" and isinstance(body, str):
        text = repr(body)
    elif tag in ("t", "l") and isinstance(body, list):
        items = [_plain(v, depth + 1) or "…" for v in body]
        text = ("({})" if tag == "t" else "[{}]").format(", ".join(items))
    elif tag == "k":
        inner = _plain(body, depth + 1)
        text = None if inner is None else f"constexpr({inner})"
    return None if text is None else _short(text)


def _short(text: str, wide: int = WIDE) -> str:
    """``text`` printable (a read set is anyone's: no control character of it reaches a
    terminal) and at most ``wide`` characters long."""
    text = "".join(c if c.isprintable() else "?" for c in text)
    return text if len(text) <= wide else text[: wide - 1] + "…"


# -- for a person -------------------------------------------------------------------------------
def counted(reads: Sequence[Read]) -> dict[str, int]:
    """How many of ``reads`` there are of each kind, in the order of the read ops'
    table (:data:`bridge.entries.metadata.OPS`)."""
    found = Counter(r.op for r in reads)
    return {OPS[op].one: found[op] for op in OPS if found[op]}


def summary(reads: Sequence[Read]) -> str:
    """``reads`` counted by kind: ``"2 globals, 1 attribute"``."""
    found = Counter(r.op for r in reads)
    return ", ".join(f"{found[op]} {_kind(op, found[op])}" for op in OPS if found[op]) or "none"


def lines(
    hit: bool,
    reads: tuple[Read, ...] | None,
    partial: Sequence[str],
    passed: Sequence[Passed],
    every: bool,
) -> list[str]:
    """What an explanation says of the reads: of each entry ``passed`` and, for a ``hit``, of
    the entry used (``reads``: None where it records none; ``partial``: why its read set is
    partial); ``every``: each read on a line of its own."""
    out = []
    for p in passed:
        out.append(p.text())
        if every:
            out += [f"  {r.text()}" for r in p.reads]
    if not hit:
        return out
    if reads is None:
        return [*out, "the entry records no read set (an earlier version's): used on its key alone"]
    out.append(f"{len(reads)} reads, each finds what it found: {summary(reads)}")
    if partial:
        out.append(
            f"the read set is partial ({'; '.join(partial)}): the IR decides (Triton's "
            "frontend is run again at each lookup)"
        )
    if every:
        out += [f"  {r.text()}" for r in reads]
    return out


def reads_json(reads: tuple[Read, ...] | None) -> dict[str, Any] | None:
    if reads is None:
        return None
    return {"count": len(reads), "by_kind": counted(reads), "rows": [r.to_json() for r in reads]}
