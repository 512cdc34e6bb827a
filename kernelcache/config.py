"""The one place that reads kernelcache's settings: how a variable is declared and parsed,
kernelcache's own, those of packages built on it, and the environment held against them.

Each variable is declared once, as a :class:`Variable` (name, parser, default, meaning, what a
job does when its value cannot be used, whether a root's own configuration file may set it),
a field of a settings dataclass made with :func:`setting`: kernelcache's own in
:class:`Settings`, packages' through :func:`register_variables`; :func:`variables` lists them.
:func:`settings` parses kernelcache's own, again only when a value changed (:func:`parser`). A
value comes from the environment, else the root's file (``file``, as
:mod:`kernelcache.store.settings_file` read it), else the default (:func:`origins` says which).
A command fails on a variable it uses (``strict``) that cannot be used; any other, and every
one in a job (:func:`job_settings`), costs only itself, said once. ``KERNELCACHE_*`` names no
package declares are said too (:func:`warn_unknown_in_a_job`).

Invariants: nothing else reads ``os.environ`` for kernelcache's configuration, and nothing
here changes it. An unset or empty variable means the root's file's value or the default,
except a secret's (the signing key, its file; never in a file): set but blank, it is an error
naming it, never signing turned off without a word. A secret's value is never shown (``***``).
"""

from __future__ import annotations

import difflib
import logging
import os
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

from . import units
from .errors import ConfigError, DeclarationError, InvalidValue, UnknownVariable
from .process import warn_once
from .signing_key import check_signing_key, read_key_file
from .units import choice, size_cap, stripped

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
    #: whether a root's own configuration file may set it (under the environment); never a
    #: secret, the root or what decides whose files are served
    in_file: bool = False

    @property
    def key(self) -> str:
        """The name a root's configuration file and ``kernelcache -o`` give it: ``max_size``."""
        return self.name.removeprefix(PREFIX).lower()


def setting(
    name: str, parse: Callable[[str], Any], default: Any, shown: str, meaning: str, **how: Any
) -> Any:
    """A field of :class:`Settings` declared with its variable: the one place a setting's name,
    parser, default (``shown``: as the documentation shows it) and meaning are written, and
    ``how`` it is read (the keywords of :class:`Variable` from ``secret`` on: what a job does
    when its value cannot be used, whether a root's configuration file may set it)."""
    var = Variable(name, "", parse, default, shown, meaning, **how)
    return field(default=default, repr=not var.secret, metadata={"variable": var})


def variables_of(declared: type) -> tuple[Variable, ...]:
    """The variables of a dataclass whose fields are declared with :func:`setting`, in its
    order (a package built on kernelcache declares its settings so too)."""
    return tuple(f.metadata["variable"]._replace(field=f.name) for f in fields(declared))


#: what a root's configuration file gives: variable name -> (the file's path, the value)
FileValues = Mapping[str, tuple[str, str]]


def parse_variable(
    var: Variable, environ: Mapping[str, str] | None = None, file: FileValues | None = None
) -> Any:
    """The value of one variable in ``environ`` (default: ``os.environ``), else in ``file``
    (where :attr:`Variable.in_file`), else its default.

    Raises:
        ConfigError: the value cannot be used, or a :attr:`Variable.required_if_set` one is
            set but blank; the message names the variable (or the file's key and the file),
            the value, what is wrong and what is accepted.
    """
    name, where, raw = var.name, "", (os.environ if environ is None else environ).get(var.name)
    if raw is not None and not raw.strip() and var.required_if_set:
        raise ConfigError(
            f"{var.name} is set but blank: give it a value or unset it (a blank value "
            "would turn off what it protects)"
        )
    if (raw is None or not raw.strip()) and var.in_file and file and var.name in file:
        name, where, raw = var.key, f" in {file[var.name][0]}", file[var.name][1]
    if raw is None or not raw.strip():
        return var.default
    try:
        return var.parse(raw)
    except (ValueError, ConfigError) as e:
        shown = "***" if var.secret else repr(raw)
        raise ConfigError(f"{name}={shown}{where}: {e}") from None


T = TypeVar("T")


def parser(
    declared: Sequence[Variable], make: Callable[..., T], *, in_a_job: bool = False
) -> Callable[..., T]:
    """``parse(environ=None, file=None, strict=None)``: the ``declared`` variables of an
    environment (default: ``os.environ``) over a root's file (:data:`FileValues`), made into
    ``make(**{field: value})``, again only when a value (or HOME, for ``~``) changed. A
    variable that cannot be used raises ConfigError naming it where ``strict`` (names; None:
    all) holds it. Elsewhere, and everywhere ``in_a_job`` (a user's job, which a setting must
    never fail), it costs only itself: said once (its name, its value, what is accepted and
    what is done instead), its field takes its default and its :attr:`Variable.in_a_job`
    fields are set; every other variable is used as given."""
    names = (*(var.name for var in declared), "HOME")
    last: list[tuple[object, T]] = []

    def parse(
        environ: Mapping[str, str] | None = None,
        file: FileValues | None = None,
        strict: Collection[str] | None = None,
    ) -> T:
        env = os.environ if environ is None else environ
        raw = tuple(map(env.get, names))
        stamp = (raw, tuple(sorted((file or {}).items())), strict and tuple(sorted(strict)))
        if last and last[0][0] == stamp:
            return last[0][1]
        values = {n: v for n, v in zip(names, raw, strict=True) if v is not None}  # read once
        parsed: dict[str, Any] = {}
        instead: dict[str, Any] = {}
        for var in declared:
            try:
                parsed[var.field] = parse_variable(var, values, file)
            except ConfigError as e:
                if not in_a_job and (strict is None or var.name in strict):
                    raise
                parsed[var.field] = var.default
                instead.update(var.in_a_job)
                _say_unusable(var, e)
        made = make(**{**parsed, **instead})
        last[:] = [(stamp, made)]
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


def paths(raw: str) -> tuple[Path, ...]:
    return tuple(path(p) for p in raw.split(os.pathsep) if p.strip())


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
#: how a root writes new entries' artifacts (kernelcache.store.compression)
COMPRESSIONS = ("none", "zstd")


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
        paths,
        (),
        "(none)",
        "read-only roots searched after the writable root, separated by ':'",
    )
    remote: str | None = setting(
        "KERNELCACHE_REMOTE",
        stripped,  # checked by kernelcache.remote.check_url when opened (and by doctor)
        None,
        "(none)",
        "remote tier URLs, tried in order, separated by whitespace, e.g. redis://host:6379/0 s3://bucket/kc",
    )
    max_size: int = setting(
        "KERNELCACHE_MAX_SIZE",
        size_cap,
        0,
        "0",
        "size cap of the writable root, e.g. 50G: least recently used entries are evicted "
        "past it (0: no cap)",
        in_file=True,
    )
    lock_timeout: float = setting(
        "KERNELCACHE_LOCK_TIMEOUT",
        units.parse_duration,
        120.0,
        "120",
        "seconds to wait for a per-key lock before going private",
        in_file=True,
    )
    lock_mode: str = setting(
        "KERNELCACHE_LOCK_MODE",
        choice(*LOCK_MODES),
        "auto",
        "auto",
        "auto, flock or soft (O_EXCL lock files for NFS)",
        in_file=True,
    )
    lock_stale: float = setting(
        "KERNELCACHE_LOCK_STALE",
        units.parse_duration,
        300.0,
        "300",
        "seconds after which another host's soft lock is stale",
        in_file=True,
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
        in_file=True,
    )
    compression: str = setting(
        "KERNELCACHE_COMPRESSION",
        choice(*COMPRESSIONS),
        "none",
        "none",
        "how new entries' artifacts are written: none (as loaders take them) or zstd (smaller; "
        "each read decompresses); usually the root's own setting (`kernelcache -o "
        "compression=zstd`)",
        in_file=True,
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
    """Declare the variables of a package built on kernelcache (again: a no-op), so that
    ``doctor`` and the documentation list them; ValueError for a name declared otherwise."""
    own = {var.name for var in VARIABLES}
    for var in declared:
        if var.name in own or _registered.get(var.name, var) != var:
            raise DeclarationError(f"the variable {var.name} is already declared differently")
        _registered[var.name] = var


def variables() -> tuple[Variable, ...]:
    """Every declared variable: kernelcache's own, then the registered ones."""
    return VARIABLES + tuple(_registered.values())


def variable(name: str) -> Variable:
    """The declaration of the variable ``name`` (KeyError: none is declared)."""
    for var in variables():
        if var.name == name:
            return var
    raise UnknownVariable(name)


_parse = parser(VARIABLES, Settings)


def settings(
    environ: Mapping[str, str] | None = None,
    file: FileValues | None = None,
    strict: Collection[str] | None = None,
) -> Settings:
    """kernelcache's variables of ``environ`` (default: ``os.environ``) over a root's file;
    ConfigError naming one (of ``strict``, None: any) that cannot be used."""
    return _parse(environ, file, strict)


_job_parse = parser(VARIABLES, Settings, in_a_job=True)


def job_settings(
    environ: Mapping[str, str] | None = None, file: FileValues | None = None
) -> Settings:
    """:func:`settings` in a user's job (:func:`parser`, ``in_a_job``): a variable that cannot
    be used is said once and costs only itself (its default, or :attr:`Variable.in_a_job`)."""
    return _job_parse(environ, file)


def origins(
    environ: Mapping[str, str] | None = None, file: FileValues | None = None
) -> list[tuple[Variable, str | None, str]]:
    """Every declared variable, the value given (None: the default; a secret's ``***``) and
    where from: ``environment``, the root's file (its path) or ``default``."""
    env = os.environ if environ is None else environ
    found: list[tuple[Variable, str | None, str]] = []
    for var in variables():
        raw = env.get(var.name)
        if raw is not None and (raw.strip() or var.required_if_set):
            found.append((var, "***" if var.secret else raw, "environment"))
        elif var.in_file and file and var.name in file:
            found.append((var, file[var.name][1], file[var.name][0]))
        else:
            found.append((var, None, "default"))
    return found


# -- the environment held against the declared variables ------------------------------------
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
    """Say once, in a job, each ``KERNELCACHE_*`` name set that no package declares (the
    modules of the command plugins, :data:`COMMANDS_GROUP`, imported first, once, where one is
    unknown: they declare their variables, which are no misspellings)."""
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
