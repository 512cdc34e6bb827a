"""What is set in an environment, held against the declared variables
(:func:`kernelcache.config.variables`): each one parsed (:func:`check_variables`, what every
command does first), those set (:func:`environment_in_effect`, for diagnostics) and the
``KERNELCACHE_*`` names no package declares (:func:`unknown_variables`: a misspelled variable
is otherwise ignored without a word; a job says each once, :func:`warn_unknown_in_a_job`).

Invariants: nothing here changes the environment or a setting; a secret's value is never
returned (``***`` instead).
"""

from __future__ import annotations

import difflib
import logging
import os
from collections.abc import Mapping

from .config import COMMANDS_GROUP, PREFIX, parse_variable, variables
from .process import warn_once


def check_variables(environ: Mapping[str, str] | None = None) -> None:
    """Parse every declared variable (kernelcache's and the registered ones).

    Raises:
        ConfigError: the first one set to a value that cannot be used (the message names it).
    """
    env = os.environ if environ is None else environ
    for var in variables():
        parse_variable(var, env)


def environment_in_effect(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The declared variables that are set, for diagnostics (values as given; secrets as
    ``***``)."""
    env = os.environ if environ is None else environ
    return {
        var.name: "***" if var.secret else env[var.name] for var in variables() if var.name in env
    }


def unknown_variables(environ: Mapping[str, str] | None = None) -> list[tuple[str, str | None]]:
    """The ``KERNELCACHE_*`` names set in ``environ`` (default: ``os.environ``) that no package
    declares, each with the declared name nearest to it (None when none is near), sorted."""
    env = os.environ if environ is None else environ
    known = {var.name[len(PREFIX) :]: var.name for var in variables()}
    found = []
    for name in sorted(n for n in env if n.startswith(PREFIX) and n not in known.values()):
        near = difflib.get_close_matches(name[len(PREFIX) :], list(known), n=1, cutoff=0.6)
        found.append((name, known[near[0]] if near else None))
    return found


def unknown_message(name: str, near: str | None) -> str:
    """What is said of ``name``, a ``KERNELCACHE_*`` variable nothing declares (``near``: the
    declared name nearest to it)."""
    hint = f" (did you mean {near}?)" if near else ""
    return f"kernelcache: {name} is not a kernelcache variable: ignored{hint}"


_plugins_loaded: list[bool] = []


def warn_unknown_in_a_job(environ: Mapping[str, str] | None = None) -> None:
    """Say once, in a job, each ``KERNELCACHE_*`` name set that no package declares.

    A package declares its variables when it is imported; so that a job that has not imported
    one does not take its variables for misspellings, the modules of the command plugins
    (entry-point group :data:`~kernelcache.config.COMMANDS_GROUP`, imported as the command
    imports them) are imported first, once, and only when some name is unknown."""
    if not unknown_variables(environ):
        return
    if not _plugins_loaded:
        _plugins_loaded.append(True)
        from importlib import import_module
        from importlib.metadata import entry_points

        for ep in entry_points(group=COMMANDS_GROUP):
            try:
                import_module(ep.module)
            except ImportError:  # an optional package missing: its variables stay unknown
                continue
    for name, near in unknown_variables(environ):
        warn_once(logging.getLogger("kernelcache"), ("unknown", name), unknown_message(name, near))
