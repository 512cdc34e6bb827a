"""What the Redis tier runs on the server and how it reads the server's answers: the Lua scripts
(a bounded read, the lock's acquire, renew and release, each only by its token's owner), the
cluster's slot map, and who holds a lock. A reply that is not what these scripts return is a
:class:`~kernelcache.errors.RemoteError`, never trusted.
"""

from __future__ import annotations

import bisect
import hashlib
import math
from typing import Any

from ...errors import RemoteError

# -- scripts ----------------------------------------------------------------------------------
# They run atomically in Redis. In the lock scripts KEYS[1] is the lock, KEYS[2] the entry. A
# lock's value is "<its lease in ms>:<host>:<pid>:<token>", set (and renewed) with that expiry,
# so that the time since it was last set is that lease minus its PTTL. An acquire that finds
# the entry returns it (its length where it is longer than ARGV[4], the most a value may be):
# a waiter's last try is its read.
_GET = """
local n = redis.call('strlen', KEYS[1])
if n > tonumber(ARGV[1]) then return n end
return redis.call('get', KEYS[1])
"""
_ACQUIRE = """
if redis.call('exists', KEYS[2]) == 1 then
  local n = redis.call('strlen', KEYS[2])
  if n > tonumber(ARGV[4]) then return {2, n} end
  return {2, redis.call('get', KEYS[2])}
end
local lease = tonumber(ARGV[2])
if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', lease) then return {1, ''} end
local left = redis.call('pttl', KEYS[1])
local held = redis.pcall('get', KEYS[1])
if type(held) ~= 'string' then held = '' end
local set_ttl = tonumber(string.match(held, '^(%d+):'))
local longest = tonumber(ARGV[3])
local stale = left == -1
if not stale and left > 0 then
  if set_ttl then stale = set_ttl - left > longest else stale = left > longest end
end
if stale then
  redis.call('set', KEYS[1], ARGV[1], 'PX', lease)
  return {3, held}
end
return {0, held}
"""
_RENEW = """
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) end
return 0
"""
_RELEASE = """
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end
return 0
"""
SCRIPTS = {"get": _GET, "acquire": _ACQUIRE, "renew": _RENEW, "release": _RELEASE}
SHAS = {name: hashlib.sha1(text.encode()).hexdigest() for name, text in SCRIPTS.items()}
ACQUIRED, READY, BROKEN = 1, 2, 3
#: the most bytes a reply other than a value may take (a cluster's slot map, a lock state)
REPLY_LIMIT = 4 << 20
#: the last hash slot of a Redis Cluster
_MAX_SLOT = 16383
#: the shard of the hash slots a cluster's slot map gives no primary (it may leave out a failed
#: one): skipped as one shard
UNSERVED = "(slots without a primary)"


def serving(slots: list[tuple[int, int, str]], name: str) -> str:
    """The primary ("host:port") that serves the slot of the Redis key ``name``, or
    :data:`UNSERVED`."""
    from redis.crc import key_slot

    slot = key_slot(name.encode())
    at = bisect.bisect_right(slots, (slot, _MAX_SLOT + 1, "")) - 1
    if at < 0 or not slots[at][0] <= slot <= slots[at][1]:
        return UNSERVED
    return slots[at][2]


def slot_ranges(reply: Any, asked: str) -> list[tuple[int, int, str]]:
    """``(first slot, last slot, "host:port" of its primary)`` of a ``CLUSTER SLOTS`` reply,
    sorted (a primary announced without a host is the node ``asked``).

    Raises:
        ValueError: the reply is not a slot map.
    """
    ranges = []
    try:
        for row in reply:
            first, last, primary = int(row[0]), int(row[1]), row[2]
            host = primary[0].decode() if isinstance(primary[0], bytes) else str(primary[0])
            host = host or asked
            host = f"[{host}]" if ":" in host and not host.startswith("[") else host
            ranges.append((first, last, f"{host}:{int(primary[1])}"))
    except (TypeError, IndexError, ValueError, UnicodeDecodeError) as e:
        raise RemoteError(f"CLUSTER SLOTS gave no slot map ({e!r})") from None
    if not ranges:
        raise RemoteError("CLUSTER SLOTS gave an empty slot map")
    return sorted(ranges)


def milliseconds(seconds: float) -> str:
    return str(max(1, math.ceil(seconds * 1000)))


def holder_of(value: bytes | str) -> str:
    """Who holds a lock, from its value ("<ms>:<host>:<pid>:<token>"): "host pid N", or
    "unknown" (another client's format)."""
    text = value.decode(errors="replace") if isinstance(value, bytes) else str(value)
    parts = text.split(":")
    if len(parts) >= 4 and parts[-2].isdigit():
        return f"{':'.join(parts[1:-2])[:200]} pid {parts[-2]}"
    return "unknown"


#: the most keys ``kernelcache stats --remote`` scans in one namespace
