"""The one place that reads kernelcache's environment variables.

Each variable is declared once, as a :class:`Variable` (name, parser, default, meaning; the
machinery, re-exported here, is :mod:`kernelcache.declarations`): kernelcache's own in
:data:`VARIABLES`, those of packages built on it through
:func:`register_variables`. Tools (``doctor``, the documentation's table) list :func:`variables`.
:func:`settings` parses kernelcache's own; it re-parses only when one of their values in the
environment changed, so tests and launchers can change variables between calls. Nothing else
reads ``os.environ`` for kernelcache's configuration.

An unset or empty variable means its default, except a secret's (the signing key, its file):
set but blank, it is an error naming it, never signing turned off without a word. A command
fails on a variable that cannot be used (:func:`settings`); a job never does
(:func:`job_settings`): that variable alone is left out, said once.

What is set, held against these declarations (every variable parsed, those in effect, the
names no package declares): :mod:`kernelcache.variable_checks`. The signing key's own checks:
:mod:`kernelcache.signing_key`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from . import units
from .declarations import Variable as Variable
from .declarations import parse_variable as parse_variable
from .declarations import parser as parser
from .declarations import setting as setting
from .declarations import variables_of as variables_of
from .errors import ConfigError, DeclarationError, InvalidValue, UnknownVariable
from .signing_key import check_signing_key, read_key_file

#: the prefix of every variable kernelcache and the packages built on it declare
PREFIX = "KERNELCACHE_"
#: the entry-point group through which packages add subcommands to ``kernelcache``; importing a
#: plugin's module declares that package's variables
COMMANDS_GROUP = "kernelcache.commands"


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


@dataclass(frozen=True)
class Settings:
    """A snapshot of the environment, parsed and validated: one field per variable, each
    declared with :func:`setting`."""

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
        choice("auto", "flock", "soft"),
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
