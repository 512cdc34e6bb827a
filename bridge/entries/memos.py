"""Small text values memoized in the kernel cache, across processes.

A value is stored under a key made of two named steps, a label and a fingerprint of what it
was computed from (:func:`kernelcache.keys.digest_of`; an ``ident`` entry with metadata
``kind: identity``); a changed input changes the fingerprint, so a stale value is never found.
Cache failures only cost the recomputation: they are logged, never raised.

A value found is whoever could write the root's word: it is used only where it is text of at
most :data:`MAX_VALUE` characters that its reader's ``valid`` accepts (each reader says what
its value looks like); anything else is computed again, as if it were not there.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from kernelcache.plugin import digest_of

from .kinds import EntryKind

if TYPE_CHECKING:
    from kernelcache import Cache

#: a value memoized across processes, such as the compiler's identity, under its own key
MEMO = EntryKind("ident", role=None, counted="memo", sparse=True)

logger = logging.getLogger(__name__)
#: the longest value a memo may hold (the longest written, a compiler environment's variable
#: names, is a few KB)
MAX_VALUE = 64 << 10


def memo_key(label: str, fingerprint: str) -> str:
    """The key of the value memoized under ``(label, fingerprint)``."""
    return digest_of({"memo": label, "fingerprint": fingerprint})


def lookup(
    cache: Cache | None, label: str, fingerprint: str, valid: Callable[[str], object]
) -> str | None:
    """The value memoized in ``cache`` (or None) under ``(label, fingerprint)``, if there is
    one that ``valid`` accepts (see the module docstring)."""
    if cache is None:
        return None
    art = MEMO.get(cache, memo_key(label, fingerprint))
    if art is None or len(art.data) > MAX_VALUE:
        return None
    try:
        value = art.data.decode()
        return value if valid(value) else None
    except (UnicodeDecodeError, ValueError, TypeError, RecursionError):
        return None


def remember(cache: Cache | None, label: str, fingerprint: str, value: str) -> None:
    """Memoize ``value`` in ``cache`` under ``(label, fingerprint)``; failures are logged only."""
    from kernelcache import CacheError

    if cache is None:
        return
    try:
        MEMO.put(
            cache, memo_key(label, fingerprint), value.encode(), {"kind": "identity", "name": label}
        )
    except (CacheError, ValueError) as e:
        logger.debug("cannot memoize the %s identity: %s", label, e)


def memoized(
    cache: Cache | None,
    label: str,
    fingerprint: str,
    compute: Callable[[], str],
    valid: Callable[[str], object],
) -> str:
    """``compute()``, stored in ``cache`` under a key derived from ``(label, fingerprint)``;
    a value found there is used where ``valid`` accepts it."""
    known = lookup(cache, label, fingerprint, valid)
    if known is not None:
        return known
    value = compute()
    remember(cache, label, fingerprint, value)
    return value
