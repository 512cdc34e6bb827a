"""The key of a call's lowering, derived without binding or keying any kernel.

From everything that decides the opaque but what the frontend reads: the kernel (its own code
as :func:`bridge.identity.jit.identity` holds it, what Triton's ``cache_key`` covers of it and
its JIT helpers, plus its decorator's settings; and its autotune and heuristics layers), the
call's arguments (arrays by shape, dtype and buffer; scalars and constexprs by value, floats by
their bits, objects by content: :func:`bridge.identity.jit.constant`), keywords and options,
every variant as the kernel's layers make it (heuristics, pruning and pre_hooks applied) with
its grid and zeroed outputs, the buffer layout, the target, the embedding, the local device,
and the software (:func:`context`): the bridge, Triton (the identity of its files), the backend
(what its vendor says its identity reads: ptxas on CUDA), the compiler's environment (every
variable and knob that changes code: :mod:`bridge.identity.compiler_identity`), jaxlib. The
process-wide ingredients of every kernel key are in the context through the same functions,
and the kernel's own follow from the call's description. What the frontend read while it
generated the kernels (the read sets of the kernels a lowering embeds) is stored with it and
checked before it is used again (:mod:`bridge.lowering.lower`). A value with no description
by content makes a call unkeyable: it is lowered as before, and nothing is stored. Where
jaxlib assembles the PTX itself, the key holds the release of the ptxas it runs (the PTX's
``.version`` is written for it).

The key is the digest of named steps (:data:`STEPS`, :func:`kernelcache.keys.digest_of`, as a
kernel key is), and a stored lowering records them, so that a miss can name the steps that
differ from the nearest lowering stored (:mod:`.misses`).

Invariants: the same call in any process with the same software gets the same key; the stored
lowering (:mod:`bridge.entries.lowerings`) is found under it.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from kernelcache import __version__
from kernelcache.plugin import digest_of

from .. import versions
from ..call import kernel_objects
from ..call.placeholders import ArgArray, dtype_name
from ..embed import ptxisa
from ..entries.lowerings import FORMAT
from ..exceptions import Unkeyable
from ..identity import compiler_identity, jit
from ..identity.static_reads import plain_text
from ..vendors import backends

if TYPE_CHECKING:
    from kernelcache import Cache

    from ..call.tracing import CallSpec
    from ..vendors.targets import Target


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
    if isinstance(value, float):  # (by its bits: every NaN's repr is "nan", whatever its sign)
        return ["float", plain_text(float.__float__(value))]
    if isinstance(value, (tuple, list)):
        return ["tuple", [_canon(v, buffers) for v in value]]
    if isinstance(value, Mapping):
        return _mapping(value, buffers)
    kind = type(value).__name__
    if jit.is_jit(value):  # a JIT function
        return ["jit", _identity(value)]
    if kind == "constexpr":  # (bound at compile time even on a runtime parameter: not the value)
        return ["constexpr", _canon(value.value, buffers)]
    if kind == "dtype" and hasattr(value, "name"):
        return ["dtype", str(value.name)]
    base = getattr(value, "base", None)
    if isinstance(base, ArgArray) and hasattr(value, "block_shape"):  # a tensor descriptor
        from ..call.plain import plain

        return ["descriptor", type(value).__module__, plain(value), buffers.get(id(base))]
    item = getattr(value, "item", None)
    if callable(item) and getattr(value, "shape", None) == ():  # a NumPy scalar
        return _canon(item(), buffers)
    try:  # (a class, an enum, a dataclass, an object with fields: as a kernel key has it)
        return ["value", jit.constant(value)]
    except ValueError as e:
        raise Unkeyable(f"{kind} {value!r:.60} is known only by its address") from e


def _libraries(options: Mapping[str, Any]) -> Mapping[str, Any]:
    """``options`` with the content of each extern library it names beside its path, as a
    kernel key holds it: a library replaced by another of the same size and modification
    time changes the key (the digest is memoized per process by the file's identity)."""
    libs = options.get("extern_libs")
    if not libs:
        return options
    pairs = libs.items() if isinstance(libs, Mapping) else libs
    rows = [[str(name), compiler_identity.tool_digest(str(path))] for name, path in pairs]
    return {**options, "extern_libs_files": rows}


def _kernel(parts: Any, known: dict[int, tuple[Any, str]] | None) -> list[Any]:
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
    fn = parts.fn
    found = None if known is None else known.get(id(fn))
    if found is None or found[0] is not fn:
        found = (fn, _identity(fn))
        if known is not None:
            known[id(fn)] = found
    return [parts.qualname, parts.language, found[1], layers]


def _identity(fn: Any) -> str:
    """The identity of the JIT function ``fn`` with every default and annotation by content:
    a lowering has no read of what the call leaves to a default."""
    try:
        return jit.identity(fn, strict=True)
    except (ValueError, RecursionError) as e:
        raise Unkeyable(f"{getattr(fn, '__name__', 'a JIT function')}: {e}") from e


#: the steps of a lowering key, in order, and what each is (how a miss is explained): the
#: software and setting every key of a setup starts with (:func:`context`), then the call's own
STEPS: dict[str, str] = {
    "format": "lowering entry format",
    "bridge": "kernelcache version",
    "pipeline": "bridge pipeline",
    "triton": "Triton's files",
    "backend": "backend identity",
    "environment": "compiler environment",
    "fp_fusion": "default fp fusion",
    "jaxlib": "jaxlib version",
    "assembler": "PTX assembler",
    "target": "target",
    "device": "local device",
    "embed": "embedding",
    "kernel": "kernel code and layers",
    "named": "arguments",
    "kwargs": "keywords",
    "options": "options",
    "variants": "variants (configs, grids)",
    "layout": "buffer layout",
    "name": "call name",
    "metadata": "call metadata",
}
#: the steps of :func:`context`, which every lowering of a setup shares (the others are the
#: call's own): lowerings of one call that differ in these are the same call lowered apart
CONTEXT_STEPS = tuple(STEPS)[: tuple(STEPS).index("kernel")]
#: a lowering key, the number of its call's variants, and the steps it is the digest of
Keyed = tuple[str, int, dict[str, str]]
#: a step's value longer than this is recorded as its digest
SHORT = 128
_DIGEST = re.compile(r"[0-9a-f]{64}")


def _step(value: Any) -> str:
    """A step's value as the key records it: its exact ``repr`` (plain lists, strings and
    numbers), or that text's sha256 where it is long."""
    text = repr(value)
    return text if len(text) <= SHORT else hashlib.sha256(text.encode()).hexdigest()


def digested(recorded: str) -> bool:
    """Whether ``recorded``, a step's value as a key records it (:func:`_step`), is the digest
    of a long value rather than the value itself (a person is told it differs, not shown it)."""
    return _DIGEST.fullmatch(recorded) is not None


def context(
    target: Target, embed: str, jaxlib: str, device: Any, cache: Cache
) -> dict[str, str] | None:
    """The steps every lowering key for ``target``, ``embed``, ``jaxlib`` and ``device`` starts
    with (:data:`STEPS`): the software that decides a lowering (see the module docstring); None
    where it cannot be told (nothing is stored)."""
    try:
        values = {
            "format": FORMAT,
            "bridge": __version__,
            "pipeline": compiler_identity.PIPELINE_VERSION,
            "triton": compiler_identity.triton_fingerprint(),
            "backend": target.vendor.backend_fingerprint(target.arch),
            "environment": compiler_identity.environment_digest(cache),
            "fp_fusion": backends.default_fp_fusion(),
            "jaxlib": jaxlib,
            "assembler": _assembler(target, embed, jaxlib, cache),
            "target": str(target),
            "device": None if device is None else str(getattr(device, "device_kind", device)),
            "embed": embed,
        }
        return {name: _step(value) for name, value in values.items()}
    except (TypeError, ValueError):
        return None


def lowering_key(
    call: CallSpec,
    target: Target,
    context: Mapping[str, str],
    variants: Sequence[kernel_objects.Variant],
    known: dict[int, tuple[Any, str]] | None = None,
) -> Keyed | None:
    """The key of ``call``'s lowering for ``target`` and the :func:`context` of its lowering,
    the number of its variants and the steps the key is the digest of (None: it is not
    stored; see the module docstring). ``variants`` are the call's variants for ``target``
    (:func:`bridge.call.kernel_objects.expand_variants`); ``known``, where given, holds the
    identities of the JIT functions keyed so far in one lowering of a module (by id, with the
    function), so that the calls of one kernel compute its identity once."""
    parts, buffers = call.parts, call.buffers
    try:
        rows = []
        for variant in variants:
            bound = kernel_objects.parameter_values(parts, call.named, variant)
            if bound is None:
                return None  # the lowering says what does not bind
            zeroed = call.zeroed(dict(bound)) if callable(call.zeroed) else call.zeroed
            rows.append(
                [
                    _mapping(variant.kwargs, buffers),
                    _mapping(_libraries(kernel_objects.launch_options(parts, variant)), buffers),
                    variant.description,
                    sorted(variant.zero),
                    _mapping(variant.args, buffers),
                    list(kernel_objects.eval_grid(call.grid, bound)),
                    _canon(list(zeroed or ()), buffers),
                ]
            )
        steps = dict(context)
        steps["kernel"] = _step(_kernel(parts, known))
        steps["named"] = _step(_mapping(call.named, buffers))
        steps["kwargs"] = _step(_mapping(call.kwargs, buffers))
        steps["options"] = _step(_mapping(_libraries(call.options), buffers))
        steps["variants"] = _step(rows)
        steps["layout"] = _step(
            [
                call.n_operands,
                [[list(a.shape), dtype_name(a.dtype)] for a in call.out_avals],
                [list(x) for x in call.aliases],
                [list(x) for x in call.restore],
                sorted(buffers[i] for i in call.writable if i in buffers),
                [buffers.get(id(a)) for a in call.zero_targets],
            ]
        )
        steps["name"] = _step(call.name)
        steps["metadata"] = _step(call.metadata.hex())
    except (Unkeyable, TypeError, ValueError):
        return None
    return digest_of(steps), len(variants), steps


def _assembler(target: Target, embed: str, jaxlib: str, cache: Cache) -> list[Any] | None:
    """The PTX assembler jaxlib runs, where the PTX the call embeds is written for it."""
    if not target.vendor.has_ptx or (embed != "ptx" and versions.honours_module_image(jaxlib)):
        return None
    found = ptxisa.jaxlib_assembler(cache)
    return None if found is None else [found.cuda, found.isa]


# -- entries ------------------------------------------------------------------------------------
