"""The remote tiers, shared by many machines: their interface (:mod:`.tier`), the value every
tier stores (:mod:`.codec`), remote URLs (:mod:`.url`), the tiers by URL scheme
(:mod:`.registry`), the built-in tiers (:mod:`.redis`, :mod:`.objstore`, sharing
:mod:`.base`, the failure policy's :mod:`.policy` with its shared :mod:`.breakers` and
first contacts (:mod:`.contact`), and the build locks' :mod:`.leases`) and an ordered list of
tiers (:mod:`.layered`). See docs/remote.md.

A built-in tier's module is imported only when it is used (``open_remote`` of its URL, or
its class read from this package): the cache needs the interface and the registry only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .codec import (
    MAGIC,
    REMOTE_FORMAT,
    authenticate,
    check_entry,
    decode_value,
    encode_value,
    make_value,
)
from .registry import (
    GROUP,
    SCHEMES,
    check_url,
    client_of,
    open_one,
    open_remote,
    probe,
    schemes,
    split_urls,
)
from .tier import Busy, RemoteTier, TierClass
from .url import (
    CLIENT_OPTIONS,
    OPTIONS,
    REDIS_MAX_STRING,
    RemoteOptions,
    parse_url,
    redact,
    scrub,
    secrets_of,
)

if TYPE_CHECKING:
    from .layered import LayeredTier
    from .objstore import ObjectStoreTier
    from .redis import RedisTier

_LAZY = {"RedisTier": ".redis", "ObjectStoreTier": ".objstore", "LayeredTier": ".layered"}


def __getattr__(name: str) -> object:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "CLIENT_OPTIONS",
    "GROUP",
    "MAGIC",
    "OPTIONS",
    "REDIS_MAX_STRING",
    "REMOTE_FORMAT",
    "SCHEMES",
    "Busy",
    "LayeredTier",
    "ObjectStoreTier",
    "RedisTier",
    "RemoteOptions",
    "RemoteTier",
    "TierClass",
    "authenticate",
    "check_entry",
    "check_url",
    "client_of",
    "decode_value",
    "encode_value",
    "make_value",
    "open_one",
    "open_remote",
    "parse_url",
    "probe",
    "redact",
    "schemes",
    "scrub",
    "secrets_of",
    "split_urls",
]
