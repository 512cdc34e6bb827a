"""kernelcache's optional packages: the extra of ``kernelcache`` that installs each (pyproject's
``optional-dependencies``), and the one way a missing one is said (:func:`needs`): what needs
it and the command that installs it.

Invariants: a command that cannot do what was asked without one raises
:class:`~kernelcache.errors.MissingDependency` (:func:`require`) before it changes or writes
anything, which the command line says as a usage error (exit 2), in text and ``--json``. A job
never fails for one: a remote tier whose client is missing is a setting that cannot be used
(:class:`~kernelcache.errors.ConfigError`, its message made by :func:`needs`), and the job runs
without the tier.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from .errors import MissingDependency

#: an optional package (its module) -> the extra of kernelcache that installs it
EXTRAS: dict[str, str] = {
    "redis": "redis",
    "obstore": "s3",
    "zstandard": "zstd",
}


def needs(what: str, module: str) -> str:
    """What is said when ``what`` needs the optional package ``module`` and it cannot be
    imported: the package and the command that installs it."""
    return (
        f"{what} needs {module}, which is not installed here: "
        f"pip install 'kernelcache[{EXTRAS[module]}]'"
    )


def require(module: str, what: str) -> ModuleType:
    """The optional package ``module``, imported, for ``what`` (e.g. ``"--to s3://b/x.tar"``).

    Raises:
        MissingDependency: it cannot be imported; the message is :func:`needs`'.
    """
    try:
        return importlib.import_module(module)
    except ImportError:
        raise MissingDependency(needs(what, module)) from None
