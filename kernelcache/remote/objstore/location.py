"""Object-store URLs: ``s3://bucket/prefix`` and ``gs://bucket/prefix`` with their options
(:data:`OPTIONS`), parsed into an :class:`ObjectURL`. A URL with credentials is refused:
credentials come only from the client library's standard sources.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from ...errors import (
    ConfigError,
    InvalidValue,
)
from ...units import parse_bool, parse_duration, parse_size
from ..url import default_lease, lease_problems, read_options, redact

#: the URL schemes of object stores
SCHEMES = ("s3", "gs")


def _endpoint(text: str) -> str:
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.username:
        raise InvalidValue("expected http(s)://host[:port], without credentials")
    return text.rstrip("/")


#: option -> (parser, meaning)
OPTIONS: dict[str, tuple[Callable[[str], Any], str]] = {
    "timeout": (parse_duration, "seconds one request may take in all (default 5)"),
    "connect_timeout": (parse_duration, "seconds to connect (default 2)"),
    "max_size": (parse_size, "entries larger than this are not sent or read (default 64M)"),
    "breaker": (parse_duration, "after a failure, skip the store this long (default 30s)"),
    "read_only": (parse_bool, "1: only read this tier: no puts, backfill or locks (default 0)"),
    "lock_ttl": (parse_duration, "a build lock is renewed for at most this long (default 120s)"),
    "lease": (
        parse_duration,
        "a build lock not renewed for this long is taken over (default 2 x timeout, at least 5s)",
    ),
    "endpoint": (_endpoint, "the store's URL, for S3-compatible stores and emulators"),
    "region": (str, "the S3 region (default: from the environment)"),
}


@dataclass(frozen=True)
class ObjectURL:
    """An object-store URL: scheme, bucket, path (a prefix, or an object) and options."""

    scheme: str
    bucket: str
    path: str
    timeout: float = 5.0
    connect_timeout: float = 2.0
    max_size: int = 64 << 20
    breaker: float = 30.0
    read_only: bool = False
    lock_ttl: float = 120.0
    lease: float | None = None
    endpoint: str | None = None
    region: str | None = None

    @property
    def lease_s(self) -> float:
        """The lease of a build lock, in seconds (given, or :func:`default_lease`)."""
        return default_lease(self.timeout, self.lock_ttl) if self.lease is None else self.lease


def parse_object_url(url: str) -> ObjectURL:
    """Read an ``s3://`` or ``gs://`` URL.

    Raises:
        ConfigError: another scheme, no bucket, credentials in the URL, an unknown option or
            a bad value; the message names it.
    """
    shown = redact(url)
    try:
        parts = urlsplit(url.strip())
    except ValueError as e:
        raise ConfigError(f"remote URL {shown!r} is malformed: {e}") from None
    if parts.scheme not in SCHEMES:
        raise ConfigError(f"remote URL {shown!r}: use s3://bucket/prefix or gs://bucket/prefix")
    if "@" in parts.netloc:
        raise ConfigError(
            f"remote URL {shown!r}: credentials do not go in the URL; the client library reads "
            "them from the environment (AWS_ACCESS_KEY_ID, GOOGLE_APPLICATION_CREDENTIALS, ...)"
        )
    if not parts.netloc:
        raise ConfigError(f"remote URL {shown!r} names no bucket; use {parts.scheme}://bucket/...")
    parsers = {name: parser for name, (parser, _) in OPTIONS.items()}
    values = read_options(shown, parts.query, parsers)
    if parts.scheme == "gs" and "region" in values:
        raise ConfigError(f"remote URL {shown!r}: region is an option of s3:// URLs")
    found = ObjectURL(parts.scheme, parts.netloc, parts.path.strip("/"), **values)
    problems = []
    for name in ("timeout", "connect_timeout"):
        if not (0 < getattr(found, name) <= 86400):
            problems.append(f"{name} must be more than 0 and at most 1d")
    if found.max_size <= 0:
        problems.append("max_size must be more than 0")
    if not (0.001 <= found.lock_ttl <= 10**9):
        problems.append("lock_ttl must be from 1ms to 1,000,000,000s")
    problems += lease_problems(found.lease, found.timeout, found.lock_ttl)
    if problems:
        raise ConfigError(f"remote URL {shown!r}: {'; '.join(problems)}")
    return found
