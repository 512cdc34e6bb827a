"""Exceptions raised by the bridge.

Every error names what was wrong and what to do about it. They subclass the closest built-in
exception as well, so ``except ValueError`` style handling keeps working.
"""

from __future__ import annotations


class BridgeError(Exception):
    """Base class of every error the bridge raises on purpose."""


class TargetError(BridgeError, ValueError):
    """A compile target is malformed, cannot be detected, or does not match the device."""


class BackendUnavailable(BridgeError, ImportError):
    """A required piece of software is missing: Triton, one of its vendor backends, or jaxlib's
    Triton support. The message says exactly which, and how to get it."""


class KernelArgumentError(BridgeError, TypeError, ValueError):
    """The arguments of a kernel call do not fit the kernel's signature or the target.

    Both a TypeError and a ValueError: jax-triton raises one or the other for the same
    mistakes (a parameter given twice, aliases that do not fit), so either ``except`` works."""


class OptionError(BridgeError, ValueError):
    """An unknown or invalid compile option (the message lists the valid ones)."""


class EmbedError(BridgeError, ValueError):
    """The requested embedding of machine code cannot work with this target or jaxlib."""


class AutotuneError(BridgeError, RuntimeError):
    """No autotune decision where one is required, or none could be made (the message says
    how to make one)."""


class NoConfigError(BridgeError, RuntimeError):
    """No config of a kernel call can compile or launch for its target (the message names each
    config and why)."""


class IncompleteOutput(BridgeError, OSError):
    """A compile's output is not whole (see :mod:`kernelcache.formats`): the compiler ran out
    of room in its temporary directory (``TMPDIR``), or cut its output short some other way.
    The message names the directory and its free space. Nothing is stored, and the kernel is
    compiled again next time: the environment failed, not the kernel."""


class UnsupportedTransformation(BridgeError, NotImplementedError):
    """A JAX transformation (grad, vmap, ...) that a raw Triton kernel call cannot support."""


__all__ = [
    "AutotuneError",
    "BackendUnavailable",
    "BridgeError",
    "EmbedError",
    "IncompleteOutput",
    "KernelArgumentError",
    "NoConfigError",
    "OptionError",
    "TargetError",
    "UnsupportedTransformation",
]
