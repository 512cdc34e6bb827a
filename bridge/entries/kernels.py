"""A compiled kernel as a cache entry: its metadata, and the PTX stored beside it on CUDA.

The machine code (``<key>.cubin`` / ``<key>.hsaco``) is the entry, of the kind of its vendor's
machine code (:data:`KERNELS`, :func:`kernel_kind`: under the kernel key itself, counted as the
lookups the hit rate is about); its metadata records the kernel name, launch geometry, shared
memory, scratch sizes, target and producer versions, the components of its key and, on CUDA, the
sha256 of the PTX, which is stored as its own entry under :data:`PTX`. Fetching and compiling
them is :mod:`bridge.compile.fetch`'s.

Invariants: a PTX entry is only ever paired with the binary whose metadata names its digest
(:func:`ptx_pairs`); metadata is plain JSON with no absolute paths; one kind per extension of
machine code, declared here for every registered vendor (at import, so that
:func:`~.kinds.declared_kinds` lists them; a vendor registered later, on first use).
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from ..call.plain import plain
from ..vendors.vendor import registered
from ..versions import triton_version
from .kinds import EntryKind

if TYPE_CHECKING:
    from kernelcache import Cache

    from ..call.binding import Bound
    from ..call.kernel_objects import KernelParts
    from ..vendors.targets import Target

#: the PTX a CUDA kernel was compiled from, beside it
PTX = EntryKind("ptx", role="ptx", counted="companion")

logger = logging.getLogger(__name__)

#: the kinds of kernels' own entries, by the extension of their machine code
KERNELS: dict[str, EntryKind] = {}
_declaring = threading.Lock()


def kernel_kind(ext: str) -> EntryKind:
    """The kind of the entries of kernels whose machine code has the extension ``ext`` (their
    vendor's :attr:`~bridge.vendors.vendor.Vendor.binary_ext`): stored under the kernel key
    itself, a lookup counted as one the hit rate is about. Declared once per extension."""
    kind = KERNELS.get(ext)
    if kind is None:
        with _declaring:
            kind = KERNELS.get(ext)
            if kind is None:
                kind = KERNELS[ext] = EntryKind(ext, role=None, counted=True)
    return kind


for _vendor in registered():
    kernel_kind(_vendor.binary_ext)


def ptx_sha256(text: str) -> str:
    """The digest of a PTX text, as a binary's entry names it (``ptx_sha256``)."""
    return hashlib.sha256(text.encode()).hexdigest()


def ptx_pairs(meta: Mapping[str, Any], ptx: bytes) -> bool:
    """Whether ``ptx`` (a PTX entry's bytes) is the PTX of the binary whose metadata is
    ``meta``: the sha256 the binary's entry names. A binary is only ever used with such a PTX."""
    want = meta.get("ptx_sha256")
    return isinstance(want, str) and bool(want) and hashlib.sha256(ptx).hexdigest() == want


def store_ptx(cache: Cache, key: str, ptx: str, meta: Mapping[str, Any]) -> None:
    """Store ``ptx`` as the companion of the kernel ``key`` (whose entry's metadata is
    ``meta``); a root that cannot take it is said once, never raised."""
    from kernelcache import CacheError
    from kernelcache.plugin import warn_once

    fields = {
        "kind": PTX.ext,
        "of": key,
        "name": meta.get("name"),
        "kernel": meta.get("kernel"),
        "target": meta.get("target"),
    }
    try:
        PTX.put(cache, key, ptx.encode(), {k: v for k, v in fields.items() if v is not None})
    except (CacheError, ValueError) as e:  # the root's write problem: said once, as the cache's
        warn_once(
            logger, (cache.root, "write"), "kernelcache: cannot store the PTX of %s: %s", key, e
        )


def launch_fields(md: Mapping[str, Any], target: Target) -> dict[str, Any]:
    """What an entry keeps of Triton's metadata ``md`` of a kernel compiled for ``target``:
    its name and what it is launched with."""
    return {
        "name": md["name"],
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
    }


def entry_metadata(
    parts: KernelParts,
    target: Target,
    bound: Bound,
    components: Callable[[], Mapping[str, str]] | None = None,
) -> Callable[[Any], dict[str, Any]]:
    """A function turning a compile result of ``bound`` into the cache entry's metadata (plain
    JSON, no absolute paths); ``components()`` gives the key's components to record (see
    :func:`bridge.identity.kernel_keys.key_components`), computed only when something is compiled. The digest of the IR
    the compile started from (``ir``) is recorded for ``kernelcache audit``."""

    def describe(compiled: Any) -> dict[str, Any]:  # a bridge.compile.compiler.Compiled
        return {
            **launch_fields(compiled.metadata, target),
            "kernel": parts.qualname,
            "language": parts.language,
            "target": str(target),
            "signature": plain(dict(bound.signature)),
            "producer": {"triton": triton_version()},
            **({"components": dict(components())} if components is not None else {}),
            **({"ir": compiled.ir} if getattr(compiled, "ir", None) else {}),
            **({"reads": compiled.reads} if getattr(compiled, "reads", None) else {}),
        }

    return describe
