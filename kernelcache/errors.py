"""Every exception kernelcache raises, under one base, :class:`KernelCacheError`.

Each also derives from the built-in a caller would catch for its kind of failure
(``OSError``, ``ValueError``, ``RuntimeError``), so ``except OSError`` keeps working.
"""

from __future__ import annotations


class KernelCacheError(Exception):
    """The base of every exception kernelcache raises."""


class CacheError(KernelCacheError, OSError):
    """The cache could not do what was asked (unwritable root, full disk, read-only root, ...).

    The message names the path and what to do. ``get`` never raises it (a failure is a miss);
    ``put`` raises it; ``get_or_create`` catches it, warns once and returns the built artifact
    from memory. Shown as its message alone (``errno`` is an attribute, not a ``[Errno N]``
    prefix for people to read).
    """

    def __str__(self) -> str:
        message = self.strerror
        if not isinstance(message, str) or not message:
            return super().__str__()
        return message if self.filename is None else f"{message}: {self.filename!r}"


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


class UsageError(KernelCacheError):
    """Bad input from the command line or the environment: the command exits with code 2."""


class NothingDone(UsageError):
    """A command stopped before changing anything (a question not confirmed, an input refused
    whole): like a usage error, it exits with code 2, which says nothing was done."""


class CommandFailed(KernelCacheError):
    """A command could not do what was asked: it exits with code 1."""


class InvalidKey(KernelCacheError, ValueError):
    """A key or an artifact extension that kernelcache does not accept; raised before any file
    is touched."""


class InvalidValue(KernelCacheError, ValueError):
    """A value given in code or as text that kernelcache cannot use: a size, a duration, a
    boolean, a mode or policy outside its choices, an argument out of range."""


class InvalidMetadata(KernelCacheError, ValueError):
    """Metadata given to ``put`` (or built for an entry) that the schema refuses; the message
    names the key and the field."""


class DeclarationError(KernelCacheError, ValueError):
    """A package declared a variable, metadata field or directory that clashes with one
    already declared, or that cannot be declared."""


class UnknownVariable(KernelCacheError, KeyError):
    """No variable of that name is declared."""


class UnreadableFile(KernelCacheError, ValueError):
    """A file kernelcache keeps (a summary, a JSON document) cannot be parsed."""


class FileTooLarge(KernelCacheError, OSError):
    """A file kernelcache reads is larger than it will read."""


class RemoteError(KernelCacheError, OSError):
    """A remote store answered with something other than what was asked (an object too large,
    a failed read or write, a malformed reply)."""


class RemoteTimeout(RemoteError, TimeoutError):
    """A remote call ran past its deadline."""


class ObjectExists(RemoteError, FileExistsError):
    """An object that would be written exists already (and replacing it was not asked)."""


class ObjectMissing(RemoteError, FileNotFoundError):
    """No object at the path asked for."""


class BadPlugin(KernelCacheError, TypeError):
    """A plugin from an entry-point group made something that is not what the group asks."""


class WrongType(KernelCacheError, TypeError):
    """A value of the wrong type, such as artifact data that is not bytes."""


__all__ = [
    "BadPlugin",
    "BundleError",
    "CacheError",
    "CommandFailed",
    "ConfigError",
    "DeclarationError",
    "FileTooLarge",
    "InvalidKey",
    "InvalidMetadata",
    "InvalidValue",
    "KernelCacheError",
    "LockTimeout",
    "LockUnavailable",
    "MissingDependency",
    "NotRegularFile",
    "ObjectExists",
    "ObjectMissing",
    "RemoteError",
    "RemoteTimeout",
    "UnknownVariable",
    "UnreadableFile",
    "UsageError",
    "WrongExt",
    "WrongType",
]


class IncompleteEntry(KernelCacheError, ValueError):
    """An entry given to ``put`` (or ``replace``, or made by a build) is not whole: its artifact
    is not a whole artifact of its extension (cut short, code for another machine, PTX without
    the kernel its metadata names) or its metadata lacks launch fields its extension requires.
    The message says which and what to do; nothing was written."""
