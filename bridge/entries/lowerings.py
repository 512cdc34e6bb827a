"""Lowered calls as cache entries: a warm process lowers a call with one key computation and one
read, and the opaque it embeds is the one the first process built.

Keyed by the call's lowering key (:mod:`bridge.lowering.lowering_keys`). An autotuned call's lowering
depends on its decision (:mod:`bridge.entries.decisions`), which can appear later: its entry
(``<key>.variants``) holds the kernel keys of its variants, and each outcome (every variant for
jaxlib to autotune, or one chosen variant) is an entry of its own (``<key>.lowering``: a small
header and the opaque). Calls that hand a file over (``embed="path"``) are not stored: their
opaque names a file of the process. A whole program's lowerings are also kept together, so that
a warm process reads one entry for all its calls (:mod:`bridge.entries.programs`, which serves
exactly what these entries hold).
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kernelcache.keys import KEY_PATTERN

from . import decisions
from .kinds import EntryKind

if TYPE_CHECKING:
    from kernelcache import Cache

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


@dataclass(frozen=True)
class Lowered:
    """What a call lowers to: the opaque, the embedding, whether jaxlib autotunes it, and the
    oldest jaxlib release that can run it."""

    opaque: bytes
    embed: str
    autotuned: bool
    needs: tuple[int, ...] = (0,)
    #: what the frontend read for the kernels it embeds (their read sets: see
    #: :mod:`bridge.identity.witness`), checked before it is used again
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
    found = LOWERING.load(cache, key, _intact, part=state)
    return None if found is None else found[1]


def _intact(data: bytes) -> Lowered | None:
    """The lowering in ``data``, if it decodes and its opaque inflates whole."""
    found = decode(data)
    return found if found is not None and whole(found.opaque) else None


def whole(opaque: bytes) -> bool:
    """Whether ``opaque`` inflates completely, with nothing after its end: what jaxlib does
    with an opaque first (zlib-compressed, see :func:`bridge.lowering.proto.compress`)."""
    inflater = zlib.decompressobj()
    try:
        inflater.decompress(opaque)
    except zlib.error:
        return False
    return inflater.eof and not inflater.unused_data


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
    program entries (:mod:`bridge.entries.programs`) lay out their bytes."""
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
) -> None:
    """Keep what a lowering of ``call`` made (never fails the lowering: a failing put is a
    lowering done again next time). Never waits: a key whose lock is held is being written by
    another process, with the same bytes."""
    from kernelcache import CacheError

    data = encode(done)
    meta = metadata(call, target)
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
    keys = decisions.keys_for(call.parts, call.named, names, devices)
    found = decisions.find(cache, keys, names)
    return None if found is None else str(found.chosen)
