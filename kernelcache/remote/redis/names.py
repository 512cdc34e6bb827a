"""The Redis keys of the Redis tier: how an entry is named, on a single server and on a
cluster (a key's group as the hash tag, and the group's fallback slots while its shard is
down), and how the entries of a namespace are counted.

Invariants: on a cluster an entry, its lock (its name plus ``:lock``) and the entries whose
keys were derived from its key (same group: :func:`kernelcache.keys.group_of`) share one slot,
at home and at each fallback; every process computes the same names.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from typing import Any

from ...keys import GROUP_CHARS, group_of
from .scripts import slot_ranges

#: how many fallback slots a group is given while its own shard is down (the first whose shard
#: is up serves)
FALLBACKS = 4

#: ``attempt(fn, *args) -> (result, error or None, overrun)``: one bounded call of the server
Attempt = Callable[..., tuple[Any, Exception | None, bool]]


def entry_name(prefix: str, key: str, cluster: bool) -> str:
    """The Redis key of the entry ``key`` at home: ``<prefix><key>`` on a single server,
    ``<prefix>{<group>}<rest of the key>`` on a cluster."""
    if not cluster:
        return prefix + key
    return f"{prefix}{{{group_of(key)}}}{key[GROUP_CHARS:]}"


def fallback_names(prefix: str, key: str) -> list[str]:
    """The Redis keys of the entry ``key`` in its group's fallback slots, in order."""
    found = []
    for i in range(FALLBACKS):
        tag = hashlib.sha256(f"{group_of(key)}:fallback:{i}".encode()).hexdigest()
        found.append(f"{prefix}{{{tag[:GROUP_CHARS]}}}{key}")
    return found


def spare_name(prefix: str, key: str, serving: Callable[[str], str]) -> str | None:
    """Where a process that found the home shard of ``key`` down published it: the group's
    first fallback that ``serving`` (Redis key -> its shard) gives another shard than home
    (None: every fallback is on the home shard). After a failover, a home miss looks there."""
    home = serving(entry_name(prefix, key, True))
    return next((n for n in fallback_names(prefix, key) if serving(n) != home), None)


def first_slot_map(
    order: list[str], ask: Callable[[str], Any], errors: Any
) -> list[tuple[int, int, str]]:
    """The slot map (``CLUSTER SLOTS``) from the first node of ``order`` that answers
    ``ask(node)``; ``errors``: redis-py's exceptions module.

    Raises:
        the last failure, when no node answers.
    """
    failure: Exception = errors.ConnectionError("the cluster names no node")
    for name in order:
        try:
            reply = ask(name)
        except (errors.RedisError, OSError) as e:
            failure = e
            continue
        return slot_ranges(reply, name.rpartition(":")[0])
    raise failure


def _strlens(client: Any, names: list[bytes]) -> list[int]:
    """The length of each value of ``names``, in one round trip."""
    pipe = client.pipeline(transaction=False)
    for name in names:
        pipe.strlen(name)
    return list(pipe.execute())


def count_entries(attempt: Attempt, prefix: str, limit: int, seconds: float) -> dict[str, Any]:
    """``{"entries", "bytes", "complete"}`` of the namespace ``prefix`` on one server:
    ``SCAN`` of its keys, 1,000 a call, and ``STRLEN`` of each in one pipeline a batch,
    stopping after ``limit`` keys or ``seconds``, or at a cursor given before (``complete``
    false: at least that many; Redis never gives a cursor twice in one scan, so a server that
    does, or that pages nothing forever, is stopped there or by the time); None values where
    the server failed."""
    out: dict[str, Any] = {"entries": None, "bytes": None, "complete": False}
    pattern = f"{prefix}*"
    cursor, entries, total = 0, 0, 0
    until = time.monotonic() + seconds
    given: set[int] = set()
    while True:
        found, error, _ = attempt(lambda c, at=cursor: c.scan(cursor=at, match=pattern, count=1000))
        if error is not None:
            return out
        cursor, names = found
        names = [n for n in names if not n.endswith(b":lock")]
        if names:
            lengths, error, _ = attempt(_strlens, names)
            if error is not None:
                return out
            entries += len(names)
            total += sum(int(n) for n in lengths)
        if int(cursor) == 0 or entries >= limit or time.monotonic() >= until:
            break
        if int(cursor) in given:
            break
        given.add(int(cursor))
    out.update(entries=entries, bytes=total, complete=int(cursor) == 0)
    return out
