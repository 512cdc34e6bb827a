"""What several ``kernelcache`` commands share besides their output: size and age arguments,
the root a command works on, and a writable store for it.
"""

from __future__ import annotations

import argparse
import os
import re

from ..config import settings
from ..store import Store
from .output import CommandFailed, UsageError

_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 1 << 10,
    "kib": 1 << 10,
    "ki": 1 << 10,
    "kb": 10**3,
    "m": 1 << 20,
    "mib": 1 << 20,
    "mi": 1 << 20,
    "mb": 10**6,
    "g": 1 << 30,
    "gib": 1 << 30,
    "gi": 1 << 30,
    "gb": 10**9,
    "t": 1 << 40,
    "tib": 1 << 40,
    "ti": 1 << 40,
    "tb": 10**12,
}
_SIZE = re.compile(r"([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)")
_AGE_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_AGE_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)([smhdw])")


def parse_size(text: str) -> int:
    """``10G``, ``500M``, ``1.5GiB``, ``2TB``, ``4096`` -> bytes.

    K, M, G, T (and KiB, MiB, ...) are powers of 1024, like ``du -h``; KB, MB, GB, TB are
    powers of 1000. Units are case-insensitive.

    Raises:
        UsageError: anything else, with what is accepted.
    """
    match = _SIZE.fullmatch(text.strip())
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _SIZE_UNITS:
        raise UsageError(
            f"invalid size {text!r}: use a number with an optional unit, e.g. 500M, 10G, "
            "1.5GiB, 2TB (K/M/G/T and KiB/MiB/GiB/TiB are powers of 1024; KB/MB/GB/TB of 1000)"
        )
    return int(float(match.group(1)) * _SIZE_UNITS[unit])


def parse_age(text: str) -> float:
    """``30d``, ``12h``, ``90m``, ``45s``, ``2w``, ``1d12h`` -> seconds.

    Raises:
        UsageError: anything else (a bare number is refused: say which unit).
    """
    compact = text.strip().lower()
    parts = _AGE_PART.findall(compact)
    if not compact or "".join(n + u for n, u in parts) != compact:
        raise UsageError(
            f"invalid age {text!r}: use a number with a unit s, m, h, d or w "
            "(seconds, minutes, hours, days, weeks), e.g. 30d, 12h, 90m, 1d12h"
        )
    return sum(float(n) * _AGE_UNITS[u] for n, u in parts)


def size_arg(text: str) -> int:
    """:func:`parse_size` as an argparse ``type``."""
    try:
        return parse_size(text)
    except UsageError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def age_arg(text: str) -> float:
    """:func:`parse_age` as an argparse ``type``."""
    try:
        return parse_age(text)
    except UsageError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def root_of(args: argparse.Namespace) -> str:
    """The absolute cache root a command works on: ``--root``, else the default root."""
    if args.root:
        return os.path.abspath(os.path.expanduser(args.root))
    from ..cache import default_root

    return os.path.abspath(default_root())


def lock_settings() -> tuple[str, float]:
    """The configured lock mode and soft-lock staleness (seconds)."""
    cfg = settings()
    return cfg.lock_mode, cfg.lock_stale


def writer(root: str, lock_timeout: float = 0.0) -> Store:
    """A writable store for this root; per-key locks are tried once unless told otherwise."""
    mode, stale = lock_settings()
    return Store(
        root, lock_mode=mode, lock_stale=stale, lock_timeout=lock_timeout, trust=settings().trust
    )


def check_writable(root: str) -> None:
    """Refuse, before changing anything, to work on a root this user cannot write."""
    if os.path.isdir(root) and not os.access(root, os.W_OK):
        raise CommandFailed(
            f"{root} is not writable by this user (or is on a read-only filesystem); "
            "nothing was changed"
        )
