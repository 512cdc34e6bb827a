"""What several ``kernelcache`` commands share besides their output: size and age arguments,
the root a command works on, and a writable store for it.
"""

from __future__ import annotations

import argparse
import os

from .. import units
from ..config import settings
from ..store import Store
from .output import CommandFailed, UsageError


def parse_size(text: str) -> int:
    """``10G``, ``500M``, ``1.5GiB``, ``2TB``, ``4096`` -> bytes (see :mod:`kernelcache.units`:
    K/M/G/T and KiB/MiB/GiB/TiB are powers of 1024, KB/MB/GB/TB powers of 1000).

    Raises:
        UsageError: anything else, with what is accepted.
    """
    try:
        return units.parse_size(text)
    except ValueError as e:
        raise UsageError(str(e)) from None


def parse_age(text: str) -> float:
    """``30d``, ``12h``, ``90m``, ``45s``, ``2w``, ``1d12h`` -> seconds (see
    :mod:`kernelcache.units`).

    Raises:
        UsageError: anything else (a bare number is refused: say which unit).
    """
    try:
        return units.parse_duration(text, bare_seconds=False)
    except ValueError as e:
        raise UsageError(str(e)) from None


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


def count_arg(text: str) -> int:
    """A count (``--limit``, ``--top``): a whole number, 0 or more, as an argparse ``type``."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"invalid count {text!r}: use a whole number, 0 or more")
    return value


#: the compression levels ``export --level`` accepts (zstd's)
ZSTD_LEVELS = range(1, 23)


def level_arg(text: str) -> int:
    """A zstd compression level, 1 (fastest) to 22 (smallest), as an argparse ``type``."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value not in ZSTD_LEVELS:
        raise argparse.ArgumentTypeError(
            f"invalid level {text!r}: use 1 (fastest) to 22 (smallest); the default is 3"
        )
    return value


def root_of(args: argparse.Namespace) -> str:
    """The absolute cache root a command works on: ``--root``, else the default root.

    Raises:
        ConfigError: no ``--root`` and ``$KERNELCACHE_DIR`` cannot be used.
    """
    if args.root:
        return os.path.abspath(os.path.expanduser(args.root))
    from ..cache import default_root

    return os.path.abspath(default_root())


def existing_root(args: argparse.Namespace) -> str:
    """:func:`root_of`, for a command that reads a root (or removes from it): the root must be
    an existing directory. A mistyped ``--root`` is an error, never an empty cache, and
    nothing is created.

    Raises:
        UsageError: the root does not exist or is not a directory (the message names it).
    """
    root = root_of(args)
    if not os.path.isdir(root):
        what = "is not a directory" if os.path.lexists(root) else "does not exist"
        raise UsageError(f"the cache root {root} {what} (check --root or KERNELCACHE_DIR)")
    return root


def lock_settings() -> tuple[str, float]:
    """The configured lock mode and soft-lock staleness (seconds)."""
    cfg = settings()
    return cfg.lock_mode, cfg.lock_stale


def writer(root: str, lock_timeout: float = 0.0) -> Store:
    """A writable store for this root, as configured (lock mode, staleness, trust); per-key
    locks are tried once unless told otherwise."""
    return Store.from_settings(root, lock_timeout=lock_timeout)


def check_writable(root: str) -> None:
    """Refuse, before changing anything, to work on a root this user cannot write."""
    if os.path.isdir(root) and not os.access(root, os.W_OK):
        raise CommandFailed(
            f"{root} is not writable by this user (or is on a read-only filesystem); "
            "nothing was changed"
        )
