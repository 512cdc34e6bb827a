"""What every ``kernelcache`` command shares besides its output: the global options, how a
command is added (:func:`add_command`), argument types (sizes, ages, counts), and the
:class:`Context` it works in: the root and the settings, each resolved once per command.
"""

from __future__ import annotations

import argparse
import fnmatch
import logging
import os
import stat
import string
import sys
from collections.abc import Callable, Sequence
from functools import cached_property
from typing import TypeAlias

from .. import schema, units
from ..config import Settings, Variable, origins, parse_variable, settings
from ..errors import ConfigError, NothingDone, UsageError
from ..store.layout import UNREADABLE_HINT, RootFile, readable, resolve_root, writable
from ..store.root import Store

logger = logging.getLogger("kernelcache")

#: what ``register(subparsers)`` is given
Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def parse_size(text: str) -> int:
    """``10G``, ``500M``, ``1.5GiB``, ``2TB``, ``4096B`` -> bytes (see :mod:`kernelcache.units`:
    K/M/G/T and KiB/MiB/GiB/TiB are powers of 1024, KB/MB/GB/TB powers of 1000, B bytes).

    Raises:
        UsageError: anything else, with what is accepted (a bare number other than 0 is
            refused: say which unit).
    """
    try:
        return units.parse_size(text, bare_bytes=False)
    except ValueError as e:
        raise UsageError(str(e)) from None


def parse_age(text: str) -> float:
    """``30d``, ``12h``, ``90m``, ``45s``, ``2w``, ``1d12h`` -> seconds (see
    :mod:`kernelcache.units`).

    Raises:
        UsageError: anything else (a bare number is refused: say which unit).
    """
    try:
        return units.parse_duration(text, bare_seconds=False)
    except ValueError as e:
        raise UsageError(str(e)) from None


def size_arg(text: str) -> int:
    """:func:`parse_size` as an argparse ``type``."""
    try:
        return parse_size(text)
    except UsageError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def age_arg(text: str) -> float:
    """:func:`parse_age` as an argparse ``type``."""
    try:
        return parse_age(text)
    except UsageError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def count_arg(text: str) -> int:
    """A count (``--limit``, ``--top``): a whole number, 0 or more, as an argparse ``type``."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"invalid count {text!r}: use a whole number, 0 or more")
    return value


#: the compression levels ``export --level`` accepts (zstd's)
ZSTD_LEVELS = range(1, 23)


def level_arg(text: str) -> int:
    """A zstd compression level, 1 (fastest) to 22 (smallest), as an argparse ``type``."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value not in ZSTD_LEVELS:
        raise argparse.ArgumentTypeError(
            f"invalid level {text!r}: use 1 (fastest) to 22 (smallest); the default is 3"
        )
    return value


def confirm_everything(command: str, what: str, hint: str = "") -> None:
    """Ask, on a terminal, before ``command`` deletes ``what``: every entry of its scope (every
    kernel of a root, every entry of JAX's cache); elsewhere refuse. ``--yes`` skips this.

    Raises:
        NothingDone: not confirmed (or no terminal to ask on): nothing was changed.
    """
    if not sys.stdin.isatty():
        raise NothingDone(
            f"this {command} would delete {what}: nothing was done; pass --yes to do it, or "
            f"--dry-run to see the plan{hint}"
        )
    sys.stderr.write(f"This {command} deletes {what}. Go ahead? [y/N] ")
    sys.stderr.flush()
    if sys.stdin.readline().strip().lower() not in ("y", "yes"):
        raise NothingDone("not confirmed: nothing was removed")


def common_options() -> argparse.ArgumentParser:
    """--root, --json and -v, accepted before and after the command name."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--root",
        metavar="DIR",
        default=argparse.SUPPRESS,
        help="cache root (default: $KERNELCACHE_DIR, else the user cache directory)",
    )
    common.add_argument(
        "--json",
        action="store_true",
        default=argparse.SUPPRESS,
        help="print one JSON document (its fields: `kernelcache help commands`)",
    )
    common.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=argparse.SUPPRESS,
        help="log more; -vv for debug messages and tracebacks",
    )
    return common


#: kernelcache's variables of a root's commands: the root itself
ROOT = ("KERNELCACHE_DIR",)
#: ... and those a command that removes from a root or writes to it works by: whose files it
#: serves, how it locks, which roots are read-only
CHANGES = (
    *ROOT,
    "KERNELCACHE_TRUST",
    "KERNELCACHE_LOCK_MODE",
    "KERNELCACHE_LOCK_STALE",
    "KERNELCACHE_READONLY_DIRS",
)
#: ... and the signing key, of a command that signs or authenticates
SIGNS = ("KERNELCACHE_SIGNING_KEY", "KERNELCACHE_SIGNING_KEY_FILE")


def add_command(
    subparsers: Subparsers,
    name: str,
    help_: str,
    *,
    variables: Sequence[Variable] = (),
    uses: Sequence[str] | None = None,
) -> argparse.ArgumentParser:
    """Add a subcommand that takes the global options (--root, --json, -v) too.

    The caller adds its arguments and sets ``func(args, out) -> exit code`` with
    ``set_defaults``; ``args.json``, ``args.verbose`` and ``args.context`` (the
    :class:`Context`; the root is also :func:`root_of`) are always present. ``uses``: the names
    of kernelcache's variables the command works by (None: every one): one of them that cannot
    be used is a usage error before it runs; any other is said and costs only itself (its
    default, or the safe fallback a job takes), so that a bad setting of the jobs never stops
    a command that does not use it. ``variables``: those of a package built on kernelcache that
    the command reads, parsed before it runs the same way (the variables of a package that a
    command does not read never stop it; ``doctor`` checks every one).
    """
    p = subparsers.add_parser(name, parents=[common_options()], help=help_, description=help_)
    p.set_defaults(variables_read=tuple(variables), uses=None if uses is None else tuple(uses))
    return p


def kernel_arg(text: str) -> str:
    """A kernel name as an entry's metadata may hold one, or an :mod:`fnmatch` pattern that
    one could match, as an argparse ``type``."""
    return _field_arg(text, "kernel name", schema.KERNEL_NAME)


def target_arg(text: str) -> str:
    """A target name by kernelcache's generic rule (see :mod:`kernelcache.schema`), or an
    :mod:`fnmatch` pattern that one could match (``cuda:*``), as an argparse ``type``: a filter
    no entry could match is an error, never an empty match."""
    return _field_arg(text, "target", schema.TARGET_NAME)


def _field_arg(text: str, what: str, check: schema.FieldCheck) -> str:
    from ..naming import is_pattern

    if not is_pattern(text):
        bad = check(text)
        if bad:
            raise argparse.ArgumentTypeError(f"invalid {what} {text!r}: it {bad}")
        return text
    if not any(check(name) is None for name in _pattern_examples(text)):
        raise argparse.ArgumentTypeError(
            f"invalid {what} pattern {text!r}: no {what} could match it ({_GRAMMAR[what]})"
        )
    return text


_GRAMMAR = {
    "target": "a target is letters, digits and _.+- in parts separated by single colons, at "
    "most 64 characters: cuda:90, hip:gfx942",
    "kernel name": "a kernel name is 1 to 1024 printable characters",
}


#: what a pattern's wildcards are tried with: letters and digits first
_EXAMPLE_CHARS = string.ascii_letters + string.digits + "_.+-:"


def _pattern_examples(pattern: str) -> list[str]:
    """Names the :mod:`fnmatch` ``pattern`` matches, one with each ``*`` empty and one with
    each ``*`` a letter (``?`` and ``[...]`` take the first of :data:`_EXAMPLE_CHARS` they
    match): enough to tell whether a name of a field's grammar could match it."""
    examples = []
    for star in ("", "a"):
        out: list[str] = []
        i, n = 0, len(pattern)
        while i < n:
            c = pattern[i]
            i += 1
            if c == "*":
                out.append(star)
            elif c == "?":
                out.append("a")
            elif c == "[" and (end := _class_end(pattern, i)) > 0:
                members = [
                    x for x in _EXAMPLE_CHARS if fnmatch.fnmatchcase(x, pattern[i - 1 : end])
                ]
                out.append(members[0] if members else "\0")  # no such character: unprintable
                i = end
            else:
                out.append(c)
        examples.append("".join(out))
    return examples


def _class_end(pattern: str, start: int) -> int:
    """The index after the ``]`` that closes a ``[`` class opened before ``start``, or -1
    when there is none (fnmatch then reads the ``[`` as itself)."""
    j = start
    if j < len(pattern) and pattern[j] == "!":
        j += 1
    if j < len(pattern) and pattern[j] == "]":
        j += 1
    j = pattern.find("]", j)
    return -1 if j < 0 else j + 1


def add_filters(p: argparse.ArgumentParser, note: str = "") -> None:
    """--kernel and --target, the entry filters of ``ls``, ``prune`` and ``export``."""
    p.add_argument(
        "--kernel",
        action="append",
        type=kernel_arg,
        metavar="NAME",
        help=f"only entries of this kernel name or pattern, e.g. 'matmul_*' (repeatable){note}",
    )
    p.add_argument(
        "--target",
        action="append",
        type=target_arg,
        metavar="T",
        help=f"only entries of this target or pattern, e.g. cuda:90 or 'cuda:*' (repeatable){note}",
    )


class Context:
    """What a command works on, each resolved once, when the command first asks: the root and
    the settings. ``main`` makes one per command (``args.context``). A command that works on
    the root through a store opens it once (:meth:`existing_store`) and asks the store.
    ``uses``: the variables the command works by (:func:`add_command`; None: every one)."""

    def __init__(self, given_root: str | None, uses: Sequence[str] | None = None) -> None:
        self.given_root = given_root
        self.uses = uses
        #: the root's configuration file, once :attr:`settings` read it
        self.root_file: RootFile | None = None

    @cached_property
    def root(self) -> str:
        """The absolute cache root: ``--root``, else ``$KERNELCACHE_DIR``, else the user cache
        directory.

        Raises:
            ConfigError: no ``--root`` and ``$KERNELCACHE_DIR`` cannot be used.
            UsageError: ``--root`` names the home of a user that does not exist.
        """
        try:
            return os.path.abspath(resolve_root(self.given_root))
        except ConfigError:
            raise
        except ValueError as e:
            raise UsageError(str(e)) from None

    @cached_property
    def trust(self) -> str:
        """The trust policy (``$KERNELCACHE_TRUST``; the strictest, said, where it cannot be
        used and the command does not use it).

        Raises:
            ConfigError: ``$KERNELCACHE_TRUST`` cannot be used, and the command uses it.
        """
        return self.settings.trust

    @cached_property
    def environment(self) -> Settings:
        """The settings of the environment alone, parsed once (what :meth:`check` needs: no
        file of the root is read before the command has looked at its arguments).

        Raises:
            ConfigError: a variable the command uses is set to a value that cannot be used
                (the others are said, and cost only themselves).
        """
        return settings(strict=self.uses)

    @cached_property
    def settings(self) -> Settings:
        """Every setting, parsed once: the environment over the root's configuration file.

        Raises:
            ConfigError: as :attr:`environment`, of the environment or the root's file.
        """
        env = self.environment
        try:  # (through the store, as a command opens its root)
            root, found = Store.configured(self.given_root, env)
        except (ConfigError, ValueError):  # no root: the environment alone (said where needed)
            return env
        vars(self)["root"] = root  # (what the cached property holds: resolved once)
        self.root_file = found
        for problem in found.problems:
            logger.warning("kernelcache: %s", problem)
        return settings(file=found.as_settings(), strict=self.uses)

    def origin(self, name: str) -> str:
        """Where the variable ``name``'s value comes from: ``environment``, the root's
        configuration file (its path) or ``default`` (:func:`kernelcache.config.origins`)."""
        self.settings  # noqa: B018  (the root's file, read once)
        given = self.root_file.as_settings() if self.root_file is not None else None
        return next(origin for var, _, origin in origins(file=given) if var.name == name)

    def check(self, also: Sequence[Variable] = ()) -> None:
        """Parse the settings (a variable the command uses that cannot be used is an error;
        the others are said) and ``also``, a package's variables the command reads.

        Raises:
            ConfigError: the first one of them set to a value that cannot be used.
        """
        self.environment  # noqa: B018  (parsed, and what cannot be used said, once)
        for var in also:
            parse_variable(var)

    def existing_root(self, *, missing_ok: bool = False) -> str:
        """:attr:`root`, for a command that reads a root (or removes from it): the root must be
        an existing directory this user may list and read. A mistyped ``--root`` is an error,
        never an empty cache, and nothing is created. ``missing_ok``: a root that does not
        exist yet is no error (``stats`` before the first job shows zeros).

        Raises:
            UsageError: the root does not exist or is not a directory (the message names it).
            CommandFailed: this user may not list or read it.
        """
        root = self.root
        _check_existing(root, lambda: readable(root), missing_ok)
        return root

    def existing_store(self, *, readonly: bool = False, lock_timeout: float | None = 0.0) -> Store:
        """:meth:`store`, for a command that works on an existing root through a store: the
        root is opened once, resolved by the store (its ``root`` is :attr:`root` from then
        on), and checked as :meth:`existing_root` checks it, the store asked.

        Raises:
            UsageError: as :meth:`existing_root`; ``--root`` names the home of a user that
                does not exist.
            ConfigError: a variable is set to a value that cannot be used.
        """
        try:
            store = Store.named(
                self.given_root, self.settings, readonly=readonly, lock_timeout=lock_timeout
            )
        except ConfigError:
            raise
        except ValueError as e:
            raise UsageError(str(e)) from None
        vars(self)["root"] = store.root  # (what the cached property holds: resolved once)
        _check_existing(store.root, store.readable)
        return store

    def require_writable(self, store: Store | None = None) -> None:
        """Refuse, before changing anything, to work on a root this user cannot write
        (``store``: the one :meth:`existing_store` opened, which is asked)."""
        root = self.root if store is None else store.root
        if os.path.isdir(root) and not (writable(root) if store is None else store.writable()):
            raise UsageError(
                f"{root} is not writable by this user (or is on a read-only filesystem); "
                "nothing was changed"
            )

    def refuse_readonly(
        self, path: str, command: str, *, beside: Callable[[str], os.PathLike[str]] | None = None
    ) -> None:
        """Refuse, before anything is removed, to remove from ``path`` where it is a root named
        read-only (``$KERNELCACHE_READONLY_DIRS``), or, with ``beside``, what ``beside(root)``
        names for one of them (``jax-cache``: JAX's directory beside a root).

        Raises:
            UsageError: naming the read-only root; nothing was changed.
        """
        real = os.path.realpath(path)
        for root in self.settings.readonly_roots:
            named = os.path.realpath(root)
            if real == named:
                raise UsageError(
                    f"{path} is a read-only root (KERNELCACHE_READONLY_DIRS): {command} never "
                    "removes from one; nothing was changed (give the writable root with --root)"
                )
            if beside is not None and real == os.path.realpath(beside(named)):
                raise UsageError(
                    f"{path} belongs to the read-only root {named} (KERNELCACHE_READONLY_DIRS): "
                    f"{command} never removes from one; nothing was changed"
                )

    def store(self, *, readonly: bool = False, lock_timeout: float | None = 0.0) -> Store:
        """A store of the root as configured (lock mode, staleness, trust); per-key locks are
        tried once unless told otherwise (None: the configured lock timeout)."""
        return Store.from_settings(
            self.root, self.settings, readonly=readonly, lock_timeout=lock_timeout, resolved=True
        )


def _check_existing(root: str, may_read: Callable[[], bool], missing_ok: bool = False) -> None:
    """Raise as :meth:`Context.existing_root` says unless ``root`` is an existing directory
    (``missing_ok``: or none at all) and ``may_read()``."""
    try:
        st = os.stat(root)
    except PermissionError as e:
        raise UsageError(_unreadable(root, e.strerror)) from None
    except OSError:
        if missing_ok and not os.path.lexists(root):
            return
        what = "is not a directory" if os.path.lexists(root) else "does not exist"
        raise UsageError(
            f"the cache root {root} {what} (check --root or KERNELCACHE_DIR)"
        ) from None
    if not stat.S_ISDIR(st.st_mode):
        raise UsageError(
            f"the cache root {root} is not a directory (check --root or KERNELCACHE_DIR)"
        )
    if not may_read():
        raise UsageError(_unreadable(root, "Permission denied"))


def _unreadable(root: str, why: str | None) -> str:
    return (
        f"cannot read the cache root {root}: {why or 'Permission denied'} ({UNREADABLE_HINT}, "
        "or check --root or KERNELCACHE_DIR)"
    )


def root_of(args: argparse.Namespace) -> str:
    """The absolute cache root a command works on (:attr:`Context.root`, resolved once).

    Raises:
        ConfigError: no ``--root`` and ``$KERNELCACHE_DIR`` cannot be used.
    """
    context: Context = args.context
    return context.root
