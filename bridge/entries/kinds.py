"""Every kind of entry the bridge stores in the kernel cache, by extension, and the one way a
companion entry's key is derived from the key it belongs to.

A kernel is stored under its kernel key with its vendor's extension (``cubin``, ``hsaco``:
:attr:`bridge.vendors.base.Vendor.binary_ext`); every other entry the bridge stores has one of
the extensions below, and every key but a kernel's, a lowering's and a decision's is
:func:`derived_key` of the key it belongs to and its role (by convention, its extension).

Invariants: no other module of the bridge names these extensions (``tests/
test_layering_bridge.py`` checks it); a derived key is the same in every process and release,
so changing :func:`derived_key` orphans every stored companion; a derived key shares the
group of the key it belongs to.
"""

from __future__ import annotations

import hashlib

from kernelcache.keys import GROUP_CHARS, KEY_PATTERN, group_of
from kernelcache.remote.tier import declare_sparse

#: the PTX a CUDA kernel was compiled from, beside it (:mod:`bridge.compile.fetch`)
PTX = "ptx"
#: a kernel that cannot compile for its target (:mod:`.failures`)
FAILURE = "failure"
#: a call's lowering, one per state of its decision (:mod:`.lowerings`)
LOWERING = "lowering"
#: the kernel keys of an autotuned call's variants (:mod:`.lowerings`)
VARIANTS = "variants"
#: a program's lowerings as one entry (:mod:`.programs`)
PROGRAM = "program"
#: an autotune decision (:mod:`.decisions`)
DECISION = "decision"
#: one config's screening for a decision being made by several GPUs (:mod:`.samples`)
SAMPLE = "sample"
#: a value memoized across processes, such as the compiler's identity (:mod:`.memos`)
MEMO = "ident"

#: every extension above
EXTENSIONS = (PTX, FAILURE, LOWERING, VARIANTS, PROGRAM, DECISION, SAMPLE, MEMO)
#: those usually absent when looked up: a miss of one must not wait on a slow remote tier
declare_sparse(FAILURE, DECISION, SAMPLE, MEMO)


def derived_key(key: str, role: str) -> str:
    """The key of a companion entry of ``key`` (e.g. ``role="ptx"``): in ``key``'s group (see
    :func:`kernelcache.keys.group_of`) where ``key`` is a cache key, so that a remote tier keeps
    an entry and its companions together."""
    digest = hashlib.sha256(f"{key}:{role}".encode()).hexdigest()
    if KEY_PATTERN.fullmatch(key) is None:
        return digest
    return group_of(key) + digest[GROUP_CHARS:]
