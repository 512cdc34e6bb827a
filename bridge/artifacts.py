"""Kernels in the kernel cache: one entry per kernel key, the PTX beside it on CUDA.

The machine code (``<key>.cubin`` / ``<key>.hsaco``) is the entry; its metadata records the
kernel name, launch geometry, shared memory, scratch sizes, target and producer versions, and,
on CUDA, the sha256 of the PTX, which is stored as its own entry under a key derived from
``(key, "ptx")``. A PTX entry is only ever used together with the binary whose metadata names
its digest, so a pruned or mismatched companion costs a recompile, never a wrong pairing.

Cache failures never fail the caller: ``get_or_create`` degrades to an in-memory artifact, and a
companion that cannot be stored is rebuilt next time.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeAlias

from .compile import Compiled
from .keys import derived_key
from .record import plain
from .versions import triton_version

if TYPE_CHECKING:
    from kernelcache import Cache
    from kernelcache.config import Settings

    from .binding import Bound
    from .kernels import KernelParts
    from .targets import Target

    #: what callers may pass as a cache: a Cache, a cache root directory, or None (the default)
    CacheArg: TypeAlias = Cache | str | os.PathLike[str] | None

logger = logging.getLogger(__name__)

PTX_EXT = "ptx"
_default: dict[Settings, Cache] = {}
_default_lock = threading.Lock()


def default_cache(cfg: Settings | None = None) -> Cache:
    """The process's kernel cache configured from the environment (one per configuration;
    ``cfg`` is a ``kernelcache.config.settings()`` snapshot, read now when None)."""
    import kernelcache
    from kernelcache.config import settings

    cfg = cfg or settings()
    with _default_lock:
        cache = _default.get(cfg)
        if cache is None:
            cache = _default[cfg] = kernelcache.Cache()
        return cache


def as_cache(cache: CacheArg, cfg: Settings | None = None) -> Cache:
    """``cache`` as a kernelcache.Cache: None for the default, or a root directory path."""
    if cache is None:
        return default_cache(cfg)
    if isinstance(cache, (str, os.PathLike)):
        import kernelcache

        return kernelcache.Cache(root=cache)
    return cache


@dataclass(frozen=True)
class KernelBinary:
    """A compiled kernel as the lowering needs it. ``meta`` holds only the metadata fields the
    cache's entry digest covers (``kernelcache.schema.COVERED_FIELDS``): a kernel is never
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
    from kernelcache.schema import covered_metadata

    return KernelBinary(key, ext, data, covered_metadata(meta), ptx, built)


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _store_ptx(cache: Cache, key: str, ptx: str, meta: Mapping[str, Any]) -> None:
    from kernelcache import CacheError

    fields = {"kind": "ptx", "of": key, "name": meta.get("name"), "target": meta.get("target")}
    try:
        cache.put(
            derived_key(key, PTX_EXT),
            PTX_EXT,
            ptx.encode(),
            {k: v for k, v in fields.items() if v is not None},
        )
    except (CacheError, ValueError) as e:
        logger.warning("kernelcache: cannot store the PTX of %s: %s", key, e)


def fetch(
    cache: Cache,
    key: str,
    ext: str,
    build: Callable[[], Compiled],
    describe: Callable[[Compiled], dict[str, Any]],
    need_ptx: bool,
    usable: Callable[[Mapping[str, Any]], bool] | None = None,
) -> KernelBinary:
    """The kernel ``key`` from ``cache``, compiled by ``build()`` on a miss (once across
    processes sharing the cache). ``describe`` turns a compile result into the entry's metadata.
    With ``need_ptx``, the PTX that produced the binary is returned too. An entry whose
    metadata ``usable`` rejects (written by an older bridge without what this call needs) is
    compiled again and used from memory."""
    built: list[Compiled] = []

    def build_entry() -> tuple[bytes, dict[str, Any]]:
        compiled = build()
        built.append(compiled)
        meta = describe(compiled)
        if compiled.ptx is not None:
            meta["ptx_sha256"] = _sha256(compiled.ptx)
            if need_ptx:  # before the binary, under the build lock: waiters then find both
                _store_ptx(cache, key, compiled.ptx, meta)
        return compiled.binary, meta

    art = cache.get_or_create(key, ext, build_entry)
    if usable is not None and not built and not usable(art.meta):
        logger.warning(
            "kernelcache: the metadata of %s lacks what this lowering needs (an entry from an "
            "older version?); compiling it again in memory",
            key,
        )
        compiled = build()
        meta = describe(compiled)
        return _binary(key, ext, compiled.binary, meta, compiled.ptx, True)
    if not need_ptx:
        return _binary(key, ext, art.data, art.meta, None, bool(built))
    if built and built[0].binary == art.data:
        ptx = built[0].ptx
        assert ptx is not None
        return _binary(key, ext, art.data, art.meta, ptx, True)
    want = art.meta.get("ptx_sha256")
    companion = cache.get(derived_key(key, PTX_EXT), PTX_EXT)
    if companion is not None and want and _sha256(companion.data.decode()) == want:
        return _binary(key, ext, art.data, art.meta, companion.data.decode(), False)
    # the PTX is missing (pruned) or belongs to another build: compile again for a matching pair
    logger.info("kernelcache: PTX of %s missing from the cache; recompiling", key)
    compiled = build()
    meta = dict(art.meta)
    if compiled.binary == art.data:
        _store_ptx(cache, key, compiled.ptx or "", meta)
        return _binary(key, ext, art.data, meta, compiled.ptx, True)
    meta.update(describe(compiled), ptx_sha256=_sha256(compiled.ptx or ""))
    return _binary(key, ext, compiled.binary, meta, compiled.ptx, True)


def entry_metadata(
    parts: KernelParts, target: Target, bound: Bound
) -> Callable[[Compiled], dict[str, Any]]:
    """A function turning a compile result of ``bound`` into the cache entry's metadata (plain
    JSON, no absolute paths)."""

    def describe(compiled: Compiled) -> dict[str, Any]:
        md = compiled.metadata
        return {
            "name": md["name"],
            "kernel": parts.qualname,
            "language": parts.language,
            "target": str(target),
            "arch": str(md.get("arch", target.arch)),
            "warp_size": int(md.get("warp_size", target.warp_size)),
            "num_warps": int(md["num_warps"]),
            "num_ctas": int(md.get("num_ctas", 1)),
            "num_stages": int(md.get("num_stages", 0)),
            "shared": int(md.get("shared") or 0),
            "global_scratch_size": int(md.get("global_scratch_size") or 0),
            "global_scratch_align": int(md.get("global_scratch_align") or 1),
            "profile_scratch_size": int(md.get("profile_scratch_size") or 0),
            "tmem_size": int(md.get("tmem_size") or 0),
            "tensordesc_meta": plain(list(md.get("tensordesc_meta") or [])),
            "signature": plain(dict(bound.signature)),
            "producer": {"triton": triton_version()},
        }

    return describe
