"""The remote tier, shared by many machines: its interface (:mod:`.tier`), the value every tier
stores (:mod:`.codec`), remote URLs (:mod:`.url`), the tiers by URL scheme (:mod:`.registry`)
and the built-in Redis tier (:mod:`.redis`). See docs/remote.md.

The Redis tier's module is imported only when it is used (``open_remote`` of a Redis URL, or
``RedisTier`` read from this package): the cache needs the interface and the registry only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .codec import MAGIC, REMOTE_FORMAT, authenticate, decode_value, encode_value, make_value
from .registry import GROUP, check_url, open_remote, schemes
from .tier import RemoteTier, TierClass
from .url import (
    CLIENT_OPTIONS,
    OPTIONS,
    REDIS_MAX_STRING,
    SCHEMES,
    RemoteOptions,
    parse_url,
    redact,
    scrub,
    secrets_of,
)

if TYPE_CHECKING:
    from .redis import RedisTier


def __getattr__(name: str) -> object:
    if name == "RedisTier":
        from .redis import RedisTier

        return RedisTier
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "CLIENT_OPTIONS",
    "GROUP",
    "MAGIC",
    "OPTIONS",
    "REDIS_MAX_STRING",
    "REMOTE_FORMAT",
    "SCHEMES",
    "RedisTier",
    "RemoteOptions",
    "RemoteTier",
    "TierClass",
    "authenticate",
    "check_url",
    "decode_value",
    "encode_value",
    "make_value",
    "open_remote",
    "parse_url",
    "redact",
    "schemes",
    "scrub",
    "secrets_of",
]
