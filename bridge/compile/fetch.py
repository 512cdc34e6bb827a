"""Fetching compiled kernels from the kernel cache, compiling them on a miss: the one fetch of
the bridge (:func:`fetch` and :func:`fetch_many` for specializations, :func:`fetch_requests`
for what a warm worker asks).

One entry per kernel key, the PTX beside it where the target has PTX (CUDA); what the entries
hold, and how a PTX pairs with its binary, is declared in :mod:`bridge.entries.kernels`. A PTX
entry is only ever used together with the binary whose metadata names its digest, so a pruned
or mismatched companion costs a recompile, never a wrong pairing.

A kernel that cannot compile for a reason Triton's autotuner leaves its config out for is
remembered beside it (see :mod:`bridge.entries.failures`), under the kernel's build lock: no process
sharing the cache compiles it again, and it is returned as a :class:`~bridge.exceptions.LeftOut`.

Cache failures never fail the caller: ``get_or_create_each`` degrades to an in-memory artifact,
and a companion that cannot be stored is rebuilt next time.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kernelcache.plugin import warn_once

from ..entries import failures, kernels, kinds
from ..entries.kernels import PTX, kernel_kind
from ..exceptions import LeftOut
from ..identity import frontend
from ..identity.specialize import Specialization, Usable, components
from ..readsets import read_sets
from . import compiler_process, hit_audit
from .compiler import Compiled, binary_problem, compile_source

if TYPE_CHECKING:
    from kernelcache import Artifact, Cache


logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class KernelBinary:
    """A compiled kernel as the lowering needs it. ``meta`` holds only the metadata fields the
    cache's entry digest covers (``kernelcache.schema.covered_metadata``): a kernel is never
    launched with a field that could have changed on disk unnoticed."""

    key: str
    ext: str
    binary: bytes
    meta: Mapping[str, Any]
    ptx: str | None
    built: bool  # compiled by this call (a kernel-cache miss)


def _binary(
    key: str, ext: str, data: bytes, meta: Mapping[str, Any], ptx: str | None, built: bool
) -> KernelBinary:
    from kernelcache.plugin import covered_metadata

    return KernelBinary(key, ext, data, covered_metadata(meta), ptx, built)


@dataclass(frozen=True)
class Request:
    """One kernel asked of :func:`fetch_requests`: ``build()`` compiles it on a miss, ``describe``
    turns the compile result into the entry's metadata; ``need_ptx``: the PTX is wanted too;
    an entry whose metadata ``usable`` rejects is compiled again and used from memory;
    ``about``: the metadata of a failure entry (kernel, name, target) if it cannot compile."""

    key: str
    ext: str
    build: Callable[[], Compiled]
    describe: Callable[[Compiled], dict[str, Any]]
    need_ptx: bool
    #: whether a cached entry's metadata has what this call needs (None: any entry will do)
    usable: Callable[[Mapping[str, Any]], bool] | None = None
    about: Mapping[str, Any] = field(default_factory=dict)
    #: False: compiled in this process and never looked up nor stored (its reads found
    #: other values under too many keys: see :func:`_chained`)
    stored: bool = True
    #: whether a cached kernel's reads (its metadata) find what they found
    #: (:func:`bridge.readsets.read_sets.stale`'s verdict); None: not checked
    check: Callable[[Mapping[str, Any]], read_sets.Verdict] | None = None
    #: how many times the key was chained already (see :func:`_chained`)
    hops: int = 0
    #: an audit of this hit (:mod:`bridge.compile.hit_audit`): given a cached kernel's full
    #: metadata, machine code and PTX served, its compile now where they differ from it, else None
    audit: Callable[[Mapping[str, Any], bytes, str | None], Compiled | None] | None = None


def fetch_request(cache: Cache, request: Request) -> KernelBinary:
    """The kernel of ``request`` from ``cache``, compiled by its ``build()`` on a miss (once
    across processes sharing the cache); with its PTX where ``need_ptx``.

    Raises:
        LeftOut: the kernel cannot compile (see :mod:`bridge.entries.failures`).
        whatever else ``build`` raises.
    """
    (found,) = fetch_requests(cache, [request])
    if isinstance(found, LeftOut):
        raise found
    return found


def fetch_requests(cache: Cache, requests: Sequence[Request]) -> list[KernelBinary | LeftOut]:
    """The kernels of ``requests``, in order, the missing ones compiled with work stealing
    across the processes sharing ``cache`` (see :func:`fetch_each`); a :class:`LeftOut` for
    each that cannot compile.

    Raises:
        whatever else the first failing ``build`` raises.
    """
    out: list[KernelBinary | LeftOut | None] = [None] * len(requests)
    for index, result in fetch_each(cache, requests):
        if isinstance(result, Exception) and not isinstance(result, LeftOut):
            raise result
        out[index] = result
    return [kb for kb in out if kb is not None]


def fetch_each(
    cache: Cache, requests: Sequence[Request], *, wait: bool = True
) -> Iterator[tuple[int, KernelBinary | Exception | None]]:
    """Yield ``(index, kernel)`` for every request as its kernel is ready.

    Through :meth:`kernelcache.Cache.get_or_create_each`: this process compiles every missing
    kernel whose build lock is free, then waits for those that other processes are compiling
    (taking over any whose compiler died); each kernel is compiled once across the processes
    sharing the cache. On CUDA the PTX is stored before the binary, under the build lock, so a
    process that reads the binary finds its PTX. Whoever compiled what, the returned kernels
    (binary, metadata fields, PTX) are the same. The compiles share one compiler process
    (:func:`bridge.compile.compiler_process.session`), forked at the first miss.

    Yields:
        ``(index, result)`` in completion order: the :class:`KernelBinary`, a
        :class:`LeftOut` for a kernel that cannot compile (remembered, or found now), the
        exception its compile raised, or (``wait=False``) None for a kernel another process is
        compiling.
    """

    #: what this process compiled, per (key, ext): requests for the same kernel share it
    built: dict[tuple[str, str], list[Compiled]] = {(r.key, r.ext): [] for r in requests}

    def compile_or_leave_out(request: Request) -> Compiled:
        known = failures.remembered(cache, request.key)
        if known is not None:
            raise LeftOut(known, remembered=True)
        try:
            compiled = request.build()
        except Exception as e:
            reason = failures.reason_of(e)
            if reason is None:
                raise
            if failures.lasting(e):  # before the build lock is released: nobody compiles it again
                failures.remember(cache, request.key, reason, request.about)
            raise LeftOut(reason) from e
        return compiled

    def builder(request: Request) -> Callable[[], tuple[bytes, dict[str, Any]]]:
        def build_entry() -> tuple[bytes, dict[str, Any]]:
            compiled = compile_or_leave_out(request)
            built[(request.key, request.ext)].append(compiled)
            meta = _described(request, compiled)
            why = _entry_problem(request.ext, compiled.binary, meta)
            if why is not None:  # before anything is stored: no companion without its entry
                raise _Unstorable(why, _made(request.key, request, compiled))
            if compiled.ptx is not None and request.need_ptx:
                # before the binary, under the build lock: readers find both
                kernels.store_ptx(cache, request.key, compiled.ptx, meta)
            return compiled.binary, meta

        return build_entry

    stale: list[tuple[int, Request]] = []
    with compiler_process.session():  # the compiles of these requests share one process
        for index, request in enumerate(requests):
            if not request.stored:
                yield index, _in_memory(request)
        cached = [i for i, r in enumerate(requests) if r.stored]
        wanted = [
            (kernel_kind(requests[i].ext), requests[i].key, builder(requests[i])) for i in cached
        ]
        accepts = [_admitted(requests[i]) for i in cached]
        for index, art in kinds.get_or_create_each(cache, wanted, wait=wait, accepts=accepts):
            index = cached[index]
            if isinstance(art, _Unstorable):
                _not_stored(cache, requests[index], art)
                yield index, art.kernel
                continue
            if art is None or isinstance(art, Exception):
                yield index, art
                continue
            try:
                request = requests[index]
                here = built[(request.key, request.ext)]
                whole = art if here else _whole(cache, art, builder(request))
                kernel = (
                    _rebuilt(request) if whole is None else _paired(cache, request, whole, here)
                )
                now = None if kernel.built or request.check is None else request.check(kernel.meta)
                if now is not None and not now.fresh:
                    if now.kind == read_sets.REFUSED:
                        refused(cache, art, now)
                    stale.append((index, _chained(request, now)))
                    continue
                if not kernel.built and request.audit is not None:
                    fresh = request.audit(art.meta, kernel.binary, kernel.ptx)
                    kernel = kernel if fresh is None else _made(request.key, request, fresh)
                yield index, kernel
            except Exception as e:  # a failing recompile, reported per request
                yield index, e
    if stale:
        again = fetch_each(cache, [r for _, r in stale], wait=wait)
        for at, result in again:
            yield stale[at][0], result


def _admitted(request: Request) -> kinds.Accept | None:
    """The check of a kernel the remote tier holds for ``request``, before any copy of it is
    made here (:func:`bridge.readsets.read_sets.door`)."""
    check = request.check
    if check is None:
        return None
    return lambda art: read_sets.door(check(art.meta))


def _chained(request: Request, now: read_sets.Verdict) -> Request:
    """``request`` for code whose reads find what ``now`` says, where a cached kernel's reads
    found something else: under the next key of the one walk
    (:func:`bridge.readsets.read_sets.hop`), or past the last a compile kept in memory."""
    key = read_sets.hop(request.key, now, request.hops)
    if key is None:
        return dataclasses.replace(request, stored=False, check=None)
    return dataclasses.replace(request, key=key, hops=request.hops + 1)


def followed(
    spec: Specialization, entry: Callable[[str], Artifact | None]
) -> tuple[str | None, Artifact | None]:
    """The kernel entry of ``spec`` a lookup would use, each read by ``entry(key)``, and its
    key: :func:`bridge.readsets.read_sets.follow` with :func:`stale` as the check."""
    return read_sets.follow(spec.key, entry, lambda _, art: stale(spec, art.meta))


def stale(spec: Specialization, meta: Mapping[str, Any]) -> read_sets.Verdict:
    """Whether the kernel of ``spec`` whose metadata is ``meta`` was compiled from what the
    frontend would read now: the verdict of its read set
    (:func:`bridge.readsets.read_sets.stale`)."""
    return read_sets.stale(
        [meta.get("reads")],
        spec.source.fn,
        read_sets.params(spec.source),
        spec.backend,
        expected=lambda: [frontend.specialization(spec.source, spec.bound.options)],
    )


def refused(cache: Cache, art: Artifact, refusal: read_sets.Verdict) -> None:
    """Set aside ``art``, a cached kernel whose read set no compile of this code wrote (or
    past a bound of what a check does): said once, quarantined where the cache can."""
    warn_once(
        logger,
        ("refused", art.key),
        "kernelcache: the cached kernel %s holds a read set no compile of this code wrote "
        "(%s), so it is set aside and the kernel compiled again",
        art.key,
        refusal.reason,
    )
    kernel_kind(art.ext).quarantine(cache, art, refusal.said[:300])


def _whole(
    cache: Cache, art: Artifact, build: Callable[[], tuple[bytes, dict[str, Any]]]
) -> Artifact | None:
    """``art``, a cached kernel, if its machine code is what a compile gives (whole, for its
    vendor's machine: :func:`bridge.compile.compiler.binary_problem`). Otherwise the entry is corrupt
    (one an older version stored cut short, say): it is reported to the cache (counted,
    quarantined) and compiled again by ``build`` (once across processes) and stored; None
    where the cache still serves the broken copy (a read-only root): compile it here."""
    problem = binary_problem(art.ext, art.data)
    if problem is None:
        return art
    logger.warning(
        "kernelcache: cached kernel %s is corrupt (%s); compiling it again", art.key, problem
    )
    kind = kernel_kind(art.ext)
    kind.quarantine(cache, art, problem)
    again = kind.get_or_create(cache, art.key, build)
    return again if binary_problem(again.ext, again.data) is None else None


def _in_memory(request: Request) -> KernelBinary | Exception:
    """The kernel of a request that is not stored, compiled here, under a key derived from its
    machine code (what the opaque names it by: the same binary, the same opaque); a
    :class:`LeftOut` (not remembered) or the compile's own exception if it cannot compile."""
    try:
        compiled = request.build()
    except Exception as e:  # reported per request, as for stored kernels
        reason = failures.reason_of(e)
        return e if reason is None else LeftOut(reason)
    key = hashlib.sha256(b"in-memory\0" + compiled.binary).hexdigest()
    return _made(key, request, compiled)


class _Unstorable(Exception):
    """A kernel compiled for a request whose entry the cache's own checks refuse (its
    metadata, as :func:`_entry_problem` says): nothing of it was stored; ``kernel`` is the
    compile, kept in memory."""

    def __init__(self, why: str, kernel: KernelBinary) -> None:
        super().__init__(why)
        self.kernel = kernel


#: the fields of a kernel entry that describe it without being launched with: an in-memory
#: kernel whose entry the cache refuses keeps what it is launched with only
_DESCRIPTIVE = ("reads", "components", "ir")


def _described(request: Request, compiled: Compiled) -> dict[str, Any]:
    """The metadata of the entry of ``compiled``, the kernel of ``request``."""
    meta = request.describe(compiled)
    if compiled.ptx is not None:
        meta["ptx_sha256"] = kernels.ptx_sha256(compiled.ptx)
    return meta


#: a key of the form every key has, for checks of what does not depend on the key
_ANY_KEY = "0" * 64


def _entry_problem(ext: str, binary: bytes, meta: Mapping[str, Any]) -> str | None:
    """Why the cache would refuse an entry of ``binary`` with ``meta`` whatever its key (the
    schema's form checks, a put's), None where it takes it."""
    from kernelcache.plugin import make_metadata

    try:
        make_metadata(_ANY_KEY, ext, binary, meta)
    except ValueError as e:
        return str(e)
    return None


def _not_stored(cache: Cache, request: Request, unstorable: _Unstorable) -> None:
    """Say once that the kernel of ``request`` is used from memory, its entry refused by the
    cache's own checks: a failure of the cache, which costs a compile in the next process,
    never the lowering."""
    warn_once(
        logger,
        (cache.root, "unstorable", request.key),
        "kernelcache: the kernel %s (%s) is used from memory and not stored: %s",
        request.key,
        request.about.get("kernel", "?"),
        unstorable,
    )


def _made(key: str, request: Request, compiled: Compiled) -> KernelBinary:
    """``compiled``, the kernel of ``request``, kept in memory under ``key``: with the metadata
    a stored entry of it would have (its covered fields, as for a cached kernel); where the
    cache's checks refuse that, with the fields it is launched with only."""
    from kernelcache.plugin import make_metadata

    meta = _described(request, compiled)
    if _entry_problem(request.ext, compiled.binary, meta) is not None:
        meta = {k: v for k, v in meta.items() if k not in _DESCRIPTIVE}
    doc = make_metadata(key, request.ext, compiled.binary, meta)
    return _binary(key, request.ext, compiled.binary, doc, compiled.ptx, True)


def _rebuilt(request: Request) -> KernelBinary:
    """The kernel of ``request`` compiled again here, kept in memory."""
    return _made(request.key, request, request.build())


def _paired(cache: Cache, request: Request, art: Artifact, built: list[Compiled]) -> KernelBinary:
    """The kernel of ``art``, with its PTX when the request needs it (recompiled when the
    cache has no matching PTX)."""
    key, ext = request.key, request.ext
    if request.usable is not None and not built and not request.usable(art.meta):
        logger.warning(
            "kernelcache: the metadata of %s lacks what this lowering needs, or says the kernel "
            "cannot be launched here (an entry of an older version, or another writer's); "
            "compiling it again in memory",
            key,
        )
        return _rebuilt(request)
    if not request.need_ptx:
        return _binary(key, ext, art.data, art.meta, None, bool(built))
    if built and built[0].binary == art.data:
        ptx = built[0].ptx
        assert ptx is not None
        return _binary(key, ext, art.data, art.meta, ptx, True)
    companion = PTX.get(cache, key)
    if companion is not None and kernels.ptx_pairs(art.meta, companion.data):
        return _binary(key, ext, art.data, art.meta, companion.data.decode(), False)
    # the PTX is missing (pruned) or belongs to another build: compile again for a matching pair
    logger.info("kernelcache: PTX of %s missing from the cache; recompiling", key)
    compiled = request.build()
    meta = dict(art.meta)
    if compiled.binary == art.data:
        kernels.store_ptx(cache, key, compiled.ptx or "", meta)
        return _binary(key, ext, art.data, meta, compiled.ptx, True)
    meta.update(request.describe(compiled), ptx_sha256=kernels.ptx_sha256(compiled.ptx or ""))
    return _binary(key, ext, compiled.binary, meta, compiled.ptx, True)


def request(spec: Specialization, usable: Usable | None = None) -> Request:
    """What :func:`fetch_requests` is asked for the kernel of ``spec``: its key, how to
    compile it and describe the result, that its PTX is wanted too (where the target has PTX),
    and which cached entries will do (``usable``: see :class:`Request`)."""
    target, bound = spec.target, spec.bound
    return Request(
        spec.key,
        spec.ext,
        build=functools.partial(compile_source, spec.source, target, spec.backend, bound.options),
        describe=kernels.entry_metadata(
            spec.parts,
            target,
            bound,
            functools.partial(components, spec),
        ),
        need_ptx=target.vendor.has_ptx,
        usable=usable,
        about={"name": spec.parts.name, "kernel": spec.parts.qualname, "target": str(target)},
        check=functools.partial(stale, spec),
        audit=functools.partial(hit_audit.audited, spec),
    )


def compiled_here(spec: Specialization) -> KernelBinary | Exception:
    """The kernel of ``spec`` compiled in this process and kept in memory, whatever the cache
    says of it (nothing is looked up or stored); a :class:`LeftOut` or the compile's own
    exception where it cannot compile."""
    return _in_memory(dataclasses.replace(request(spec), stored=False, check=None))


def fetch(spec: Specialization, cache: Cache, usable: Usable | None = None) -> KernelBinary:
    """The kernel of ``spec`` from ``cache``, compiled on a miss (once across the processes
    sharing the cache); on CUDA with the PTX that produced it .
    An entry whose metadata ``usable`` rejects is compiled again in memory.

    Raises:
        LeftOut: the kernel cannot compile (see :mod:`bridge.entries.failures`).
        whatever else Triton raises.
    """
    (found,) = fetch_many([spec], cache, [usable])
    if isinstance(found, LeftOut):
        raise found
    return found


def fetch_many(
    specs: Sequence[Specialization],
    cache: Cache,
    usable: Sequence[Usable | None] | None = None,
) -> list[KernelBinary | LeftOut]:
    """The kernels of ``specs``, in order, the missing ones compiled with work stealing: this
    process compiles those no other process is compiling, then waits for the rest (see
    :func:`fetch_each`). Each is compiled once across the processes sharing
    the cache. ``usable[i]``, if given, tells which cached entries will do for ``specs[i]``.
    A kernel that cannot compile is a :class:`~bridge.exceptions.LeftOut`.

    Raises:
        whatever else Triton raises for the first kernel that fails to compile.
    """
    checks = list(usable) if usable is not None else [None] * len(specs)
    return fetch_requests(cache, [request(s, u) for s, u in zip(specs, checks, strict=True)])
