"""Every exception class of the bridge, under one base, :class:`BridgeError`, itself a
:class:`kernelcache.errors.KernelCacheError`.

Every error names what was wrong and what to do about it. They subclass the closest built-in
exception as well, so ``except ValueError`` style handling keeps working. Importing this module
imports neither jax nor triton.
"""

from __future__ import annotations

from kernelcache.plugin import KernelCacheError


class BridgeError(KernelCacheError):
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


class PinError(BridgeError, ValueError):
    """A pin names a config its kernel does not have, or a kernel that is not autotuned."""


class Unlaunchable(BridgeError, RuntimeError):
    """A config of an autotuned call that cannot be launched on the GPU measuring it (the
    message says why): it is not measured, never chosen, and listed in the decision."""


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


class MasqueradeError(BridgeError, ImportError):
    """``import jax_triton`` cannot give the bridge in this process (the message says why and
    what to do): see :mod:`bridge.masquerade`."""


class Unkeyable(BridgeError):
    """A value of the call is known only by its address: the call is not stored."""


class LeftOut(BridgeError):
    """A kernel that cannot compile for its target, for a reason Triton's autotuner leaves its
    config out for (``reason``: one line); ``remembered``: the cache said so (a failure entry),
    no compile of this process."""

    def __init__(self, reason: str, remembered: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.remembered = remembered


class CompilerCrash(BridgeError, RuntimeError):
    """The compiler process died while compiling (``reason``: one line naming the signal or
    exit status, and the compiler's last error line). ``lasting``: the compiler crashed by
    itself, so the same compile would crash again; False when it was killed from outside."""

    def __init__(self, reason: str, lasting: bool) -> None:
        super().__init__(reason)
        self.reason = reason
        self.lasting = lasting

    def __reduce__(self) -> tuple[type[CompilerCrash], tuple[str, bool]]:
        return type(self), (self.reason, self.lasting)


class CompilerTraceback(BridgeError):
    """Where the compiler process raised: its traceback as text (the innermost cause of the
    exception raised again here)."""


class RootError(BridgeError, OSError):
    """The writable cache root cannot take entries: nothing would be kept (exit 1)."""


class ManifestError(BridgeError, ValueError):
    """The manifest cannot be read at all, or is not a manifest (a usage error: exit 2)."""


__all__ = [
    "AutotuneError",
    "BackendUnavailable",
    "BridgeError",
    "CompilerCrash",
    "CompilerTraceback",
    "EmbedError",
    "IncompleteOutput",
    "KernelArgumentError",
    "LeftOut",
    "ManifestError",
    "MasqueradeError",
    "NoConfigError",
    "OptionError",
    "RootError",
    "TargetError",
    "Unkeyable",
    "UnsupportedTransformation",
]


class OverBudget(BridgeError, RuntimeError):
    """A description of what reads found, made under a budget (a check of a stored read set),
    went past it: the entry is refused (:mod:`bridge.identity.namespaces`)."""
