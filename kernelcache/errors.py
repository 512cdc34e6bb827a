"""Every exception kernelcache raises, under one base, :class:`KernelCacheError`.

Each also derives from the built-in a caller would catch for its kind of failure
(``OSError``, ``ValueError``, ``RuntimeError``), so ``except OSError`` keeps working.
"""

from __future__ import annotations

from dataclasses import dataclass


class KernelCacheError(Exception):
    """The base of every exception kernelcache raises."""


class CacheError(KernelCacheError, OSError):
    """The cache could not do what was asked (unwritable root, full disk, read-only root, ...).

    The message names the path and what to do. ``get`` never raises it (a failure is a miss);
    ``put`` raises it; ``get_or_create`` catches it, warns once and returns the built artifact
    from memory.
    """


class LockTimeout(CacheError):
    """A per-key lock could not be had within the configured timeout."""


class LockUnavailable(CacheError):
    """Locks cannot be taken under this root at all (e.g. the lock directory is not writable)."""


class ConfigError(KernelCacheError, ValueError):
    """An environment variable (or a setting given in code) holds a value kernelcache cannot
    use; the message names it."""


class NotRegularFile(KernelCacheError, OSError):
    """A path that should name a regular file names a FIFO, a device, a directory, ..."""


class WrongExt(KernelCacheError, ValueError):
    """The key already holds an artifact with another extension."""


class BundleError(KernelCacheError, ValueError):
    """A bundle cannot be written or is rejected; the message says which member and why.

    ``imported`` counts the entries an import published and could not remove again after the
    error (normally 0: an import publishes everything or nothing).
    """

    def __init__(self, message: str, imported: int = 0) -> None:
        super().__init__(message)
        self.imported = imported


class MissingDependency(KernelCacheError, RuntimeError):
    """An optional package is needed; the message says what to install."""


@dataclass(frozen=True)
class Problem:
    """Why an entry (in a root, a remote value or a bundle) cannot be served: a value returned,
    never raised. ``corrupt`` problems get the entry quarantined; ``untrusted`` ones (written or
    writable by users the trust policy excludes) are skipped; ``outdated`` ones (written by an
    older kernelcache) are misses, replaced by the next put."""

    key: str
    reason: str
    corrupt: bool = True
    untrusted: bool = False
    outdated: bool = False
    ext: str | None = None  #: the stored artifact's extension, where the metadata names one


__all__ = [
    "BundleError",
    "CacheError",
    "ConfigError",
    "KernelCacheError",
    "LockTimeout",
    "LockUnavailable",
    "MissingDependency",
    "NotRegularFile",
    "Problem",
    "WrongExt",
]
