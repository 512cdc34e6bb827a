"""Lowered calls as cache entries: a warm process lowers a call with one key computation and one
read, and the opaque it embeds is the one the first process built.

The key of a call's lowering (:func:`lowering_key`) is derived, without binding or keying any
kernel, from everything that decides the opaque: the kernel (its code as
:mod:`bridge.identity.jit` identifies it without parsing it: a superset of what Triton's
``cache_key`` covers, its source and the jitted functions and constants it uses, plus its
decorator's settings; and its autotune and heuristics layers), the call's arguments (arrays by
shape, dtype and buffer; scalars and constexprs by value; JIT functions passed as arguments by
their identity), keywords and
options, every variant as the kernel's layers make it (heuristics, pruning and pre_hooks
applied) with its grid and zeroed outputs, the buffer layout, the target, the embedding, the
local device, and the software: the bridge, Triton (the identity of its files), the backend
(ptxas), Triton's cache-invalidating environment and knobs, jaxlib. A value known only by its
address makes a call unkeyable: it is lowered as before, and nothing is stored. Other values
are described exactly, as kernel keys describe constexprs (:func:`bridge.identity.jit.constant`).

An autotuned call's lowering depends on its decision (:mod:`bridge.entries.decisions`), which can
appear later: its entry (``<key>.variants``) holds the kernel keys of its variants, and each
outcome (every variant for jaxlib to autotune, or one chosen variant) is an entry of its own
(``<key>.lowering``: a small header and the opaque). Where jaxlib assembles the PTX itself, the
key holds the release of the ptxas it runs (the PTX's ``.version`` is written for it). Calls
that hand a file over (``embed="path"``) are not stored: their opaque names a file of the process.
A whole program's lowerings are also kept together, so that a warm process reads one entry for
all its calls (:mod:`bridge.entries.programs`, which serves exactly what these entries hold).
"""

from __future__ import annotations

import hashlib
import json
import struct
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kernelcache import __version__
from kernelcache.keys import KEY_PATTERN

from .. import backends, versions
from ..call import binding
from ..call.binding import ArgArray
from ..call.placeholders import dtype_name
from ..compile import ptxisa
from ..errors import Unkeyable
from ..identity import compiler, jit
from ..identity.keys import PIPELINE_VERSION, derived_key, env_digest
from . import decisions

if TYPE_CHECKING:
    from kernelcache import Cache

    from ..call.tracing import CallSpec
    from ..targets import Target

#: extensions and kind of the entries
STATE_EXT = "lowering"
VARIANTS_EXT = "variants"
KIND = "lowering"
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


def _canon(value: Any, buffers: Mapping[int, int]) -> Any:
    """``value`` as plain data whose ``repr`` identifies it exactly (see the module
    docstring). The types calls pass are told by identity first (this runs for every value of
    every call)."""
    kind = type(value)
    if kind is str or kind is bool or kind is int or value is None:
        return value  # (the key is their repr: 1, True and '1' are told apart)
    if kind is tuple or kind is list:
        return ["tuple", [_canon(v, buffers) for v in value]]
    if kind is dict:
        return _mapping(value, buffers)
    if kind is ArgArray:
        return _array(value, buffers)
    return _canon_other(value, buffers)


def _array(value: ArgArray, buffers: Mapping[int, int]) -> list[Any]:
    return ["array", value.dtype_name, list(value.shape), buffers.get(id(value))]


def _mapping(value: Mapping[Any, Any], buffers: Mapping[int, int]) -> list[Any]:
    if not value:
        return ["map", []]
    keys = sorted(value)  # (keys of types that do not compare: TypeError, unkeyable too)
    for k in keys:
        if not isinstance(k, str):
            raise Unkeyable(f"a mapping with keys that are not strings: {value!r:.60}")
    return ["map", [[k, _canon(value[k], buffers)] for k in keys]]


def _canon_other(value: Any, buffers: Mapping[int, int]) -> Any:
    """:func:`_canon` of a value of any other type: subclasses of the plain types, JIT
    functions, constexprs, dtypes, tensor descriptors and NumPy scalars."""
    if isinstance(value, ArgArray):
        return _array(value, buffers)
    if isinstance(value, str):
        return str(value)
    if isinstance(value, int):  # bool cannot be subclassed: it was told by identity
        return ["int", str(value)]
    if isinstance(value, float):
        return ["float", repr(value)]
    if isinstance(value, (tuple, list)):
        return ["tuple", [_canon(v, buffers) for v in value]]
    if isinstance(value, Mapping):
        return _mapping(value, buffers)
    kind = type(value).__name__
    if jit.is_jit(value):  # a JIT function
        return ["jit", jit.identity(value)]
    if kind == "constexpr":
        return _canon(value.value, buffers)
    if kind == "dtype" and hasattr(value, "name"):
        return ["dtype", str(value.name)]
    base = getattr(value, "base", None)
    if isinstance(base, ArgArray) and hasattr(value, "block_shape"):  # a tensor descriptor
        from ..lowering.record import plain

        return ["descriptor", type(value).__module__, plain(value), buffers.get(id(base))]
    item = getattr(value, "item", None)
    if callable(item) and getattr(value, "shape", None) == ():  # a NumPy scalar
        return _canon(item(), buffers)
    try:  # (a class, an enum, a dataclass, an object with fields: as a kernel key has it)
        return ["value", jit.constant(value)]
    except ValueError as e:
        raise Unkeyable(f"{kind} {value!r:.60} is known only by its address") from e


def _kernel(parts: Any) -> list[Any]:
    layers = []
    for layer in parts.layers:
        row: list[Any] = [type(layer).__name__]
        configs = getattr(layer, "configs", None)
        if configs is not None:
            row += [[str(c) for c in configs], list(getattr(layer, "keys", None) or ())]
        values = getattr(layer, "values", None)
        if values is not None and isinstance(values, Mapping):
            row.append(sorted(values))
        layers.append(row)
    return [parts.qualname, parts.language, jit.identity(parts.fn), layers]


def context(target: Target, embed: str, jaxlib: str, device: Any, cache: Cache) -> bytes | None:
    """What every lowering key for ``target``, ``embed``, ``jaxlib`` and ``device`` starts with:
    the software that decides a lowering (see the module docstring), serialized; None where it
    cannot be told (nothing is stored)."""
    try:
        doc = [
            FORMAT,
            [
                __version__,
                PIPELINE_VERSION,
                compiler.triton_fingerprint(),
                target.vendor.backend_fingerprint(target.arch),
                env_digest(),
                backends.default_fp_fusion(),
                jaxlib,
                _assembler(target, embed, jaxlib, cache),
            ],
            str(target),
            None if device is None else str(getattr(device, "device_kind", device)),
            embed,
        ]
        return json.dumps(doc, separators=(",", ":")).encode()
    except (TypeError, ValueError):
        return None


def lowering_key(
    call: CallSpec, target: Target, context: bytes, variants: Sequence[binding.Variant]
) -> tuple[str, int] | None:
    """The key of ``call``'s lowering for ``target`` and the :func:`context` of its lowering,
    and the number of its variants (None: it is not stored; see the module docstring).
    ``variants`` are the call's variants for ``target``
    (:func:`bridge.identity.specialize.call_variants`)."""
    parts, buffers = call.parts, call.buffers
    try:
        rows = []
        for variant in variants:
            bound = binding.parameter_values(parts, call.named, variant)
            if bound is None:
                return None  # the lowering says what does not bind
            zeroed = call.zeroed(dict(bound)) if callable(call.zeroed) else call.zeroed
            rows.append(
                [
                    _mapping(variant.kwargs, buffers),
                    _mapping(binding.launch_options(parts, variant), buffers),
                    variant.description,
                    sorted(variant.zero),
                    _mapping(variant.args, buffers),
                    list(binding.eval_grid(call.grid, bound)),
                    _canon(list(zeroed or ()), buffers),
                ]
            )
        doc = {
            "kernel": _kernel(parts),
            "named": _mapping(call.named, buffers),
            "kwargs": _mapping(call.kwargs, buffers),
            "options": _mapping(call.options, buffers),
            "variants": rows,
            "layout": [
                call.n_operands,
                [[list(a.shape), dtype_name(a.dtype)] for a in call.out_avals],
                [list(x) for x in call.aliases],
                [list(x) for x in call.restore],
                sorted(buffers[i] for i in call.writable if i in buffers),
                [buffers.get(id(a)) for a in call.zero_targets],
            ],
            "name": call.name,
            "metadata": call.metadata.hex(),
        }
        text = repr(doc)  # (plain lists, strings, numbers: exact, and cheaper than JSON)
    except (Unkeyable, TypeError, ValueError):
        return None
    return hashlib.sha256(context + b"\0" + text.encode()).hexdigest(), len(variants)


def _assembler(target: Target, embed: str, jaxlib: str, cache: Cache) -> list[Any] | None:
    """The PTX assembler jaxlib runs, where the PTX the call embeds is written for it."""
    if not target.vendor.has_ptx or (embed != "ptx" and versions.honours_module_image(jaxlib)):
        return None
    found = ptxisa.jaxlib_assembler(cache)
    return None if found is None else [found.cuda, found.isa]


# -- entries ------------------------------------------------------------------------------------
def metadata(call: CallSpec, target: Target) -> dict[str, Any]:
    """The metadata of the entries of ``call``'s lowering."""
    parts = call.parts
    return {"kind": KIND, "name": parts.name, "kernel": parts.qualname, "target": str(target)}


def variant_keys(cache: Cache, key: str) -> list[str] | None:
    """The kernel keys of the variants of the call whose lowering key is ``key``."""
    art = cache.get(derived_key(key, "variants"), VARIANTS_EXT, counted=False)
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
    art = cache.get(derived_key(key, state), STATE_EXT, counted=False)
    if art is None:
        return None
    found = decode(art.data)
    if found is None or not whole(found.opaque):
        cache.quarantine(art, "a lowering entry that does not decode")
        return None
    return found


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
    return {"embed": done.embed, "autotuned": done.autotuned, "needs": list(done.needs)}


def from_head(head: Any, opaque: bytes) -> Lowered | None:
    """The lowering whose :func:`head` is ``head`` (untrusted), or None."""
    if not isinstance(head, dict):
        return None
    embed, autotuned, needs = head.get("embed"), head.get("autotuned"), head.get("needs")
    if not isinstance(embed, str) or type(autotuned) is not bool:
        return None
    if not isinstance(needs, list) or not all(type(n) is int and n >= 0 for n in needs):
        return None
    return Lowered(opaque, embed, autotuned, tuple(needs))


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
            cache.put(derived_key(key, "variants"), VARIANTS_EXT, doc, meta, wait=0)
        cache.put(derived_key(key, state), STATE_EXT, data, meta, wait=0)
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
