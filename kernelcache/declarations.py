"""How an environment variable is declared and parsed: a :class:`Variable` (name, parser,
default, meaning, and what a job does when its value cannot be used), declared as a field of a
settings dataclass with :func:`setting`, and :func:`parser`, which parses a set of them from an
environment, strictly (commands) or :func:`in a job <parser>` (a value that cannot be used costs
only its own variable).

:mod:`kernelcache.config` declares kernelcache's own variables with these and keeps the
registry of every package's; it re-exports the names here, which are its public surface.

Invariants: a secret's value is never shown (``***``); a parse reads each variable once, and is
done again only when one of their values (or HOME) changed.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any, TypeVar

from .errors import ConfigError


@dataclass(frozen=True)
class Variable:
    """One environment variable: how it is parsed, its default, and what it means."""

    name: str
    field: str  #: the attribute of :class:`Settings` it sets
    parse: Callable[[str], Any]  #: raises ValueError (or ConfigError) for a bad value
    default: Any
    shown_default: str  #: the default as the documentation shows it
    meaning: str
    secret: bool = False  #: never shown in messages or diagnostics
    #: set but blank is an error (fail closed), not the default: what turns a protection on
    required_if_set: bool = False
    #: in a job, a value that cannot be used costs only this variable: its field takes its
    #: default, and these (field, value) pairs are set besides (e.g. the cache off, for a root
    #: that cannot be used); ``instead`` says what the job does until it is fixed
    in_a_job: tuple[tuple[str, Any], ...] = ()
    instead: str = ""


def setting(
    name: str,
    parse: Callable[[str], Any],
    default: Any,
    shown_default: str,
    meaning: str,
    *,
    secret: bool = False,
    required_if_set: bool = False,
    in_a_job: tuple[tuple[str, Any], ...] = (),
    instead: str = "",
) -> Any:
    """A field of :class:`Settings` declared with its variable: the one place a setting's name,
    parser, default and meaning are written (and, with ``in_a_job`` and ``instead``, what a
    job does when its value cannot be used, when that is more than its default: see
    :class:`Variable`)."""
    var = Variable(
        name, "", parse, default, shown_default, meaning, secret, required_if_set, in_a_job, instead
    )
    return field(default=default, repr=not secret, metadata={"variable": var})


def variables_of(declared: type) -> tuple[Variable, ...]:
    """The variables of a dataclass whose fields are declared with :func:`setting`, in its
    order (a package built on kernelcache declares its settings so too)."""
    return tuple(replace(f.metadata["variable"], field=f.name) for f in fields(declared))


def parse_variable(var: Variable, environ: Mapping[str, str] | None = None) -> Any:
    """The value of one variable in ``environ`` (default: ``os.environ``), or its default.

    Raises:
        ConfigError: the variable is set to a value that cannot be used (or, for a variable
            :attr:`Variable.required_if_set`, set but blank); the message names it, the value,
            what is wrong and what is accepted.
    """
    raw = (os.environ if environ is None else environ).get(var.name)
    if raw is None:
        return var.default
    if not raw.strip():
        if var.required_if_set:
            raise ConfigError(
                f"{var.name} is set but blank: give it a value or unset it (a blank value "
                "would turn off what it protects)"
            )
        return var.default
    try:
        return var.parse(raw)
    except (ValueError, ConfigError) as e:
        shown = "***" if var.secret else repr(raw)
        raise ConfigError(f"{var.name}={shown}: {e}") from None


T = TypeVar("T")


def parser(
    declared: Sequence[Variable], make: Callable[..., T], *, in_a_job: bool = False
) -> Callable[..., T]:
    """A function that parses the ``declared`` variables from an environment (default:
    ``os.environ``) into ``make(**{field: value})``, again only when one of their values (or
    HOME, for ``~`` in paths) changed since its last call. A variable that cannot be used
    raises ConfigError naming it.

    ``in_a_job``: for code that runs in a user's job, which a setting must never fail. A
    variable that cannot be used costs only itself: it is said once (its name, its value, what
    is accepted and what the job does instead), its field takes its default and its
    :attr:`Variable.in_a_job` fields are set; every other variable is used as given."""
    names = (*(var.name for var in declared), "HOME")
    last: list[tuple[tuple[str | None, ...], T]] = []

    def parse(environ: Mapping[str, str] | None = None) -> T:
        env = os.environ if environ is None else environ
        raw = tuple(map(env.get, names))
        if last and last[0][0] == raw:
            return last[0][1]
        values = {n: v for n, v in zip(names, raw, strict=True) if v is not None}  # read once
        parsed: dict[str, Any] = {}
        instead: dict[str, Any] = {}
        for var in declared:
            try:
                parsed[var.field] = parse_variable(var, values)
            except ConfigError as e:
                if not in_a_job:
                    raise
                parsed[var.field] = var.default
                instead.update(var.in_a_job)
                _say_unusable(var, e)
        made = make(**{**parsed, **instead})
        last[:] = [(raw, made)]
        return made

    return parse


def _say_unusable(var: Variable, error: ConfigError) -> None:
    """Warn once that ``var`` cannot be used in this job, and what the job does instead."""
    from .process import warn_once

    instead = var.instead or f"its default ({var.shown_default}) is used"
    warn_once(
        logging.getLogger("kernelcache"),
        ("settings", str(error)),
        "kernelcache: %s; %s until it is fixed (the other settings apply; `kernelcache doctor` "
        "checks every variable)",
        error,
        instead,
    )
