"""Exceptions raised by kernelcache."""

from __future__ import annotations

from .config import ConfigError


class CacheError(OSError):
    """The cache could not do what was asked (unwritable root, full disk, read-only root, ...).

    The message names the path and what to do. ``get`` never raises it (a failure is a miss);
    ``put`` raises it; ``get_or_create`` catches it, warns once and returns the built artifact
    from memory.
    """


class LockTimeout(CacheError):
    """A per-key lock could not be had within the configured timeout."""


class LockUnavailable(CacheError):
    """Locks cannot be taken under this root at all (e.g. the lock directory is not writable)."""


__all__ = ["CacheError", "ConfigError", "LockTimeout", "LockUnavailable"]
