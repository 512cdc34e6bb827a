"""The one parser of sizes, durations and booleans written by people.

Used by the command line (``--max-size 10G``, ``--older-than 30d``), the Redis URL's options
(``?max_size=64M&ttl=7d``) and the environment variables, so that "64MB" means the same bytes
everywhere:

* **sizes**: a number (decimals allowed) and a unit, case-insensitive. ``K``, ``M``, ``G``,
  ``T`` and ``KiB``, ``MiB``, ``GiB``, ``TiB`` are powers of 1024 (as in ``du -h``); ``KB``,
  ``MB``, ``GB``, ``TB`` are powers of 1000; ``B`` means bytes. Where a bare number is accepted
  it means bytes; the command line and ``KERNELCACHE_MAX_SIZE`` refuse it (``--max-size 10``
  could mean 10 bytes or, as some caches read it, 10 GB), except ``0``.
* **durations**: a number and a unit ``ms``, ``s``, ``m`` (minutes), ``h``, ``d``, ``w``,
  possibly combined (``1d12h``). Where a bare number is accepted it means seconds; the command
  line refuses it (``--older-than 30`` is ambiguous).
* **booleans**: ``1``, ``true``, ``yes``, ``on`` and ``0``, ``false``, ``no``, ``off``.
* **one word of a fixed list** (:func:`choice`, case-insensitive), as the settings read them.

Every function raises ValueError with a message that shows the accepted forms.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable

from .errors import InvalidValue

SIZE_UNITS: dict[str, int] = {
    "": 1,
    "b": 1,
    "k": 1 << 10,
    "ki": 1 << 10,
    "kib": 1 << 10,
    "kb": 10**3,
    "m": 1 << 20,
    "mi": 1 << 20,
    "mib": 1 << 20,
    "mb": 10**6,
    "g": 1 << 30,
    "gi": 1 << 30,
    "gib": 1 << 30,
    "gb": 10**9,
    "t": 1 << 40,
    "ti": 1 << 40,
    "tib": 1 << 40,
    "tb": 10**12,
}
DURATION_UNITS: dict[str, float] = {
    "ms": 0.001,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
    "d": 86400.0,
    "w": 604800.0,
}
TRUE = frozenset({"1", "true", "yes", "on"})
FALSE = frozenset({"0", "false", "no", "off"})

_NUMBER = r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
_SIZE = re.compile(rf"({_NUMBER})\s*([a-z]*)")
_DURATION_PART = re.compile(rf"({_NUMBER})\s*(ms|s|m|h|d|w)")
#: beyond this, a number is a typo, not a size or a duration (and floats lose integers)
_LIMIT = 2.0**63

SIZE_FORMS = (
    "a number with a unit, e.g. 500M, 10G, 1.5GiB, 2TB, 4096B "
    "(K/M/G/T and KiB/MiB/GiB/TiB are powers of 1024; KB/MB/GB/TB of 1000; B bytes)"
)
DURATION_FORMS = (
    "a number with a unit ms, s, m, h, d or w (milliseconds, seconds, minutes, hours, days, "
    "weeks), e.g. 500ms, 30s, 90m, 12h, 30d, 1d12h"
)


def parse_size(text: str, *, bare_bytes: bool = True) -> int:
    """Bytes from ``"4096"``, ``"4096B"``, ``"512K"``, ``"64MB"``, ``"1.5GiB"``, ``"2TB"``.

    ``bare_bytes``: whether a number without a unit is accepted (as bytes); ``0`` always is.

    Raises:
        ValueError: not a size (the message shows the accepted forms).
    """
    match = _SIZE.fullmatch(text.strip().lower())
    unit = match.group(2) if match else None
    if match is None or unit not in SIZE_UNITS:
        raise InvalidValue(f"invalid size {text!r}: use {SIZE_FORMS}")
    number = float(match.group(1))
    if not unit and not bare_bytes and number != 0:
        raise InvalidValue(
            f"invalid size {text!r}: a number needs a unit, e.g. {match.group(1)}G or "
            f"{match.group(1)}M ({match.group(1)}B for bytes)"
        )
    value = number * SIZE_UNITS[unit]
    if value >= _LIMIT:
        raise InvalidValue(f"invalid size {text!r}: too large")
    return int(value)


def parse_duration(text: str, *, bare_seconds: bool = True) -> float:
    """Seconds from ``"0.5"``, ``"500ms"``, ``"30s"``, ``"10m"``, ``"12h"``, ``"7d"``, ``"1d12h"``.

    ``bare_seconds``: whether a number without a unit is accepted (as seconds).

    Raises:
        ValueError: not a non-negative duration (the message shows the accepted forms).
    """
    compact = text.strip().lower()
    forms = DURATION_FORMS + ("" if not bare_seconds else "; a bare number means seconds")
    if bare_seconds and re.fullmatch(_NUMBER, compact):
        value = float(compact)
    else:
        parts = _DURATION_PART.findall(compact)
        if not compact or "".join(n + u for n, u in parts) != compact.replace(" ", ""):
            raise InvalidValue(f"invalid duration {text!r}: use {forms}")
        value = sum(float(n) * DURATION_UNITS[u] for n, u in parts)
    if not math.isfinite(value) or value >= _LIMIT:
        raise InvalidValue(f"invalid duration {text!r}: too large")
    return value


def parse_bool(text: str) -> bool:
    """True for ``1``, ``true``, ``yes``, ``on``; False for ``0``, ``false``, ``no``, ``off``.

    Raises:
        ValueError: anything else.
    """
    value = text.strip().lower()
    if value in TRUE:
        return True
    if value in FALSE:
        return False
    raise InvalidValue(f"invalid boolean {text!r}: use 1 or 0 (or true/false, yes/no, on/off)")


def human_size(n: float) -> str:
    """Bytes in binary units: ``512 B``, ``1.5 MiB``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def size_cap(raw: str) -> int:
    """A size cap: a size with its unit (a bare number other than 0 is ambiguous)."""
    return parse_size(raw, bare_bytes=False)


def choice(*allowed: str) -> Callable[[str], str]:
    """A parser of one of ``allowed`` (case-insensitive)."""

    def parse(raw: str) -> str:
        value = raw.strip().lower()
        if value not in allowed:
            raise InvalidValue(f"not one of {', '.join(allowed)}")
        return value

    return parse


def stripped(raw: str) -> str:
    """The text without surrounding blanks."""
    return raw.strip()
