"""The one place that reads kernelcache's environment variables: how a variable is declared
and parsed, kernelcache's own, those of packages built on it, and the environment held
against them.

Each variable is declared once, as a :class:`Variable` (name, parser, default, meaning, and
what a job does when its value cannot be used), a field of a settings dataclass made with
:func:`setting`: kernelcache's own in :class:`Settings` (:data:`VARIABLES`), those of packages
built on it through :func:`register_variables`. Tools (``doctor``, the documentation's table)
list :func:`variables`. :func:`settings` parses kernelcache's own, again only when one of their
values in the environment changed (:func:`parser`), so tests and launchers can change variables
between calls. A command fails on a variable that cannot be used (:func:`settings`); a job
never does (:func:`job_settings`): that variable alone is left out, said once. What is set is
held against the declarations: those a command reads parsed (:func:`check_variables`, what
every command does first), those in effect (for diagnostics), and the ``KERNELCACHE_*`` names no
package declares (a misspelled variable, said once in a job: :func:`warn_unknown_in_a_job`).
The signing key's own checks: :mod:`kernelcache.signing_key`.

Invariants: nothing else reads ``os.environ`` for kernelcache's configuration, and nothing
here changes it. An unset or empty variable means its default, except a secret's (the signing
key, its file): set but blank, it is an error naming it, never signing turned off without a
word. A secret's value is never shown (``***``).
"""

from __future__ import annotations

import difflib
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

from . import units
from .errors import ConfigError, DeclarationError, InvalidValue, UnknownVariable
from .process import warn_once
from .signing_key import check_signing_key, read_key_file

#: the prefix of every variable kernelcache and the packages built on it declare
PREFIX = "KERNELCACHE_"
#: the entry-point group through which packages add subcommands to ``kernelcache``; importing a
#: plugin's module declares that package's variables
COMMANDS_GROUP = "kernelcache.commands"


# -- declaring and parsing a variable ------------------------------------------------------
class Variable(NamedTuple):
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
    return tuple(f.metadata["variable"]._replace(field=f.name) for f in fields(declared))


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
    instead = var.instead or f"its default ({var.shown_default}) is used"
    warn_once(
        logging.getLogger("kernelcache"),
        ("settings", str(error)),
        "kernelcache: %s; %s until it is fixed (the other settings apply; `kernelcache doctor` "
        "checks every variable)",
        error,
        instead,
    )


# -- kernelcache's variables ----------------------------------------------------------------
def path(raw: str) -> Path:
    """A path (``~`` expanded)."""
    try:
        return Path(raw.strip()).expanduser()
    except RuntimeError:  # "~user/..." for a user that does not exist, or no home directory
        home = raw.strip().split("/")[0]
        raise InvalidValue(f"cannot expand {home!r}: no such home directory") from None


def _paths(raw: str) -> tuple[Path, ...]:
    return tuple(path(p) for p in raw.split(os.pathsep) if p.strip())


def choice(*allowed: str) -> Callable[[str], str]:
    """A parser of one of ``allowed`` (case-insensitive)."""

    def parse(raw: str) -> str:
        value = raw.strip().lower()
        if value not in allowed:
            raise InvalidValue(f"not one of {', '.join(allowed)}")
        return value

    return parse


def _stripped(raw: str) -> str:
    return raw.strip()


def _cap(raw: str) -> int:
    """A size cap: a size with its unit (a bare number other than 0 is ambiguous)."""
    return units.parse_size(raw, bare_bytes=False)


def _key(raw: str) -> bytes:
    # its length is checked where it is used (Settings.signing_secret): a job warns and turns
    # its remote tier off, a command fails; the other settings stay usable either way
    return raw.strip().encode()


#: what a job does instead of using a root or a switch it cannot read
_CACHE_OFF = (("disable", True),)
_SAID_OFF = "the cache is off in this process (kernels compile in memory)"
#: what a job does instead of using a signing key it cannot read (never unsigned values)
_REMOTE_OFF = (("remote", None),)
_SAID_REMOTE_OFF = "the remote tier is off (local layers still work; never unsigned values)"
#: how a root's locks may be taken: probed (``auto``), flock, or soft locks
LOCK_MODES = ("auto", "flock", "soft")


@dataclass(frozen=True)
class Settings:
    """A snapshot of the environment, parsed and validated: a field per :func:`setting`."""

    root: Path | None = setting(
        "KERNELCACHE_DIR",
        path,
        None,
        "platformdirs user cache dir for 'kernelcache'",
        "writable cache root",
        in_a_job=_CACHE_OFF,
        instead=_SAID_OFF,
    )
    readonly_roots: tuple[Path, ...] = setting(
        "KERNELCACHE_READONLY_DIRS",
        _paths,
        (),
        "(none)",
        "read-only roots searched after the writable root, separated by ':'",
    )
    remote: str | None = setting(
        "KERNELCACHE_REMOTE",
        _stripped,  # checked by kernelcache.remote.check_url when opened (and by doctor)
        None,
        "(none)",
        "remote tier URLs, tried in order, separated by whitespace, e.g. redis://host:6379/0 s3://bucket/kc",
    )
    max_size: int = setting(
        "KERNELCACHE_MAX_SIZE",
        _cap,
        0,
        "0",
        "size cap of the writable root, e.g. 50G: least recently used entries are evicted "
        "past it (0: no cap)",
    )
    lock_timeout: float = setting(
        "KERNELCACHE_LOCK_TIMEOUT",
        units.parse_duration,
        120.0,
        "120",
        "seconds to wait for a per-key lock before going private",
    )
    lock_mode: str = setting(
        "KERNELCACHE_LOCK_MODE",
        choice(*LOCK_MODES),
        "auto",
        "auto",
        "auto, flock or soft (O_EXCL lock files for NFS)",
    )
    lock_stale: float = setting(
        "KERNELCACHE_LOCK_STALE",
        units.parse_duration,
        300.0,
        "300",
        "seconds after which another host's soft lock is stale",
    )
    disable: bool = setting(
        "KERNELCACHE_DISABLE",
        units.parse_bool,
        False,
        "0",
        "1: bypass the cache entirely (compile in memory)",
        in_a_job=_CACHE_OFF,  # (it is set only to turn the cache off)
        instead=_SAID_OFF,
    )
    stats_log: bool = setting(
        "KERNELCACHE_STATS_LOG",
        units.parse_bool,
        True,
        "1",
        "0: do not append per-process stats logs under the root",
    )
    progress_interval: float = setting(
        "KERNELCACHE_PROGRESS_INTERVAL",
        units.parse_duration,
        10.0,
        "10",
        "seconds between two plain progress lines of long commands off a terminal (0: one per step)",
    )
    trust: str = setting(
        "KERNELCACHE_TRUST",
        choice("group", "owner", "any"),
        "group",
        "group",
        "whose artifacts are served: group (owner, root, root dir's owner and group), owner, any",
        in_a_job=(("trust", "owner"),),  # the strictest: it costs hits, never safety
        instead="the strictest policy, owner, applies",
    )
    remote_overwrite: bool = setting(
        "KERNELCACHE_REMOTE_OVERWRITE",
        units.parse_bool,
        False,
        "0",
        "1: a job replaces remote values it cannot verify (another signing key, unsigned) when "
        "it rebuilds them; 0: leaves them for the jobs that can",
    )
    signing_key: bytes | None = setting(
        "KERNELCACHE_SIGNING_KEY",
        _key,
        None,
        "(none)",
        "sign Redis values and bundles with this key (HMAC-SHA256, at least 16 bytes); refuse "
        "unsigned ones",
        secret=True,
        required_if_set=True,
        in_a_job=_REMOTE_OFF,
        instead=_SAID_REMOTE_OFF,
    )
    signing_key_file: Path | None = setting(
        "KERNELCACHE_SIGNING_KEY_FILE",
        path,
        None,
        "(none)",
        "read the signing key from this file instead (not readable by every user)",
        required_if_set=True,
        in_a_job=_REMOTE_OFF,
        instead=_SAID_REMOTE_OFF,
    )

    def signing_secret(self) -> bytes | None:
        """The key that signs and authenticates Redis values and bundles, or None.

        Raises:
            ConfigError: both variables are set, the key is shorter than
                :data:`~kernelcache.signing_key.MIN_KEY_BYTES`, or the key file is unusable.
        """
        if self.signing_key is not None and self.signing_key_file is not None:
            raise ConfigError(
                "set KERNELCACHE_SIGNING_KEY or KERNELCACHE_SIGNING_KEY_FILE, not both"
            )
        if self.signing_key_file is not None:
            return read_key_file(self.signing_key_file)
        if self.signing_key is not None:
            return check_signing_key(self.signing_key, "KERNELCACHE_SIGNING_KEY")
        return None


#: kernelcache's own variables, in the order :class:`Settings` declares them
VARIABLES: tuple[Variable, ...] = variables_of(Settings)
#: every setting at its default (what a function's default argument takes)
DEFAULTS = Settings()


_registered: dict[str, Variable] = {}


def register_variables(*declared: Variable) -> None:
    """Declare the variables of a package built on kernelcache (once per process; declaring
    the same variable again is a no-op), so that ``doctor`` and the documentation list them.

    Raises:
        ValueError: a name kernelcache already declares, or one declared differently before.
    """
    own = {var.name for var in VARIABLES}
    for var in declared:
        if var.name in own or _registered.get(var.name, var) != var:
            raise DeclarationError(f"the variable {var.name} is already declared differently")
        _registered[var.name] = var


def variables() -> tuple[Variable, ...]:
    """Every declared variable: kernelcache's own, then the registered ones."""
    return VARIABLES + tuple(_registered.values())


def variable(name: str) -> Variable:
    """The declaration of the variable ``name``.

    Raises:
        KeyError: no such variable is declared.
    """
    for var in variables():
        if var.name == name:
            return var
    raise UnknownVariable(name)


_parse = parser(VARIABLES, Settings)


def settings(environ: Mapping[str, str] | None = None) -> Settings:
    """Parse kernelcache's variables from ``environ`` (default: ``os.environ``; parsed again only
    when one of their values changed).

    Raises:
        ConfigError: a variable is set to a value that cannot be used; the message names it.
    """
    return _parse(environ)


_job_parse = parser(VARIABLES, Settings, in_a_job=True)


def job_settings(environ: Mapping[str, str] | None = None) -> Settings:
    """:func:`settings` in a user's job (:func:`parser`, ``in_a_job``): a variable that cannot
    be used is said once and costs only itself (its default; for a root or a switch that cannot
    be read, the cache off; for a trust policy, the strictest; for a signing key, the remote
    tier off)."""
    return _job_parse(environ)


# -- the environment held against the declared variables ------------------------------------
def check_variables(
    also: Sequence[Variable] = (), environ: Mapping[str, str] | None = None
) -> None:
    """Parse kernelcache's variables and ``also`` (a package's, that a command reads).

    Raises:
        ConfigError: the first one set to a value that cannot be used (the message names it).
    """
    env = os.environ if environ is None else environ
    for var in (*VARIABLES, *also):
        parse_variable(var, env)


def environment_in_effect(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The declared variables that are set, for diagnostics (as given; secrets as ``***``)."""
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


def misspelt(name: str, environ: Mapping[str, str] | None = None) -> str | None:
    """What to say, where the variable ``name`` was needed and is not set, of the
    ``KERNELCACHE_*`` names set that no package declares and whose nearest declared name is
    ``name`` (a misspelling of it); None when there is none."""
    found = [n for n, near in unknown_variables(environ) if near == name]
    said = (f"{n} is not a variable kernelcache reads; did you mean {name}?" for n in found)
    return "; ".join(said) or None


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
