"""The launch metadata of machine code: part of the on-disk format, known to kernelcache itself.

An entry of machine code (``cubin``, ``hsaco``) is only usable with what a loader launches it
with: the kernel's name, its launch geometry (warps, CTAs), its shared memory, its scratch
buffers. These fields, their types and ranges (:data:`LAUNCH_CHECKS`) are declared here, not by
the package that writes them, so that a process that never imported that package (an
operator's box, a plain ``import kernelcache``) checks them the same way: ``put`` refuses
``num_warps=-1`` whoever calls it. The entry digest of every document covers them
(:data:`LAUNCH_FIELDS`, with ``name`` and ``target``).

Some are required (:data:`REQUIRED`): an entry of machine code holds its name, target, warps,
CTAs and shared memory; a PTX entry holds the name of the kernel (``.entry``) it defines. A
document of such an extension without one of them is refused by ``put`` and is a corrupt
entry wherever it is read (quarantined, rebuilt): a reader never launches with a default it
made up for a field the writer left out. Optional fields (scratch sizes, TMA metadata, ...)
mean their default when absent.

Invariants: :func:`launch_problem` never raises; it is part of the one contract of an entry,
:func:`kernelcache.schema.entry_problem`, and of every check of a document read from
anywhere (:func:`kernelcache.schema.check_document`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from .format import COVERS_FIELD
from .values import Check, integer, objects, pattern, power_of_two, text

_U32 = (1 << 32) - 1
_SHA256 = re.compile(r"[0-9a-f]{64}")

#: what machine code is launched or embedded with, and what each must be (besides ``name`` and
#: ``target``, kernelcache's own fields)
LAUNCH_CHECKS: Mapping[str, Check] = {
    "arch": text(64),
    "warp_size": integer(1, 1024),
    "num_warps": integer(1, 1024),
    "num_ctas": integer(1, 1024),
    "shared": integer(0, _U32),
    "global_scratch_size": integer(0, _U32),
    "global_scratch_align": power_of_two(1 << 20),
    "profile_scratch_size": integer(0, _U32),
    "tmem_size": integer(0, _U32),
    "tensordesc_meta": objects(64),
    "ptx_sha256": pattern(_SHA256, "64 lowercase hexadecimal digits"),
}
#: the launch fields, all covered by the entry digest of every document written
LAUNCH_FIELDS = frozenset(LAUNCH_CHECKS)
#: the fields an entry of each extension must hold (covered by its digest)
_MACHINE_CODE = frozenset({"name", "target", "num_warps", "num_ctas", "shared"})
REQUIRED: Mapping[str, frozenset[str]] = {
    "cubin": _MACHINE_CODE,
    "hsaco": _MACHINE_CODE,
    "ptx": frozenset({"name"}),
}


def launch_problem(ext: str, doc: Mapping[str, Any]) -> str | None:
    """Why the document ``doc`` of an entry of extension ``ext`` lacks launch metadata it must
    hold (:data:`REQUIRED`), or holds it outside its digest; None when it has it all (and
    for extensions that require none). The fields' values are checked with the document's
    other fields (:func:`kernelcache.schema.fields.check_fields`). Never raises."""
    required = REQUIRED.get(ext)
    if required is None:
        return None
    covers = doc.get(COVERS_FIELD)
    if required <= doc.keys() and isinstance(covers, list) and required.issubset(covers):
        return None  # (every entry written whole: one pass)
    missing = sorted(name for name in required if name not in doc)
    if missing:
        return (
            f"incomplete launch metadata: a .{ext} entry holds {_listed(sorted(required))}, "
            f"and this one has no {_listed(missing)}"
        )
    uncovered = sorted(
        name for name in required if not isinstance(covers, list) or name not in covers
    )
    return (
        f"incomplete launch metadata: its digest does not cover {_listed(uncovered)}, "
        f"which a .{ext} entry is launched with"
    )


def _listed(names: list[str]) -> str:
    return ", ".join(repr(name) for name in names)
