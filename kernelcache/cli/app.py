"""The ``kernelcache`` command's entry point: the parser, built from every command module, and
:func:`main`.

A command module exports ``register(subparsers)``, which adds its commands with
:func:`~.common.add_command`. The built-in ones are :data:`COMMAND_MODULES`; installed packages
add theirs through the entry-point group :data:`COMMANDS_GROUP` in the same way. See the
package docstring for the conventions every command follows.
"""

from __future__ import annotations

import argparse
import difflib
import logging
import os
import re
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import NoReturn

from .._version import __version__
from ..config import COMMANDS_GROUP
from ..errors import CommandFailed, ConfigError, MissingDependency, UsageError
from ..stats.counters import quiet as quiet_statistics
from . import (
    bundles,
    configuring,
    diagnosis,
    habits,
    listing,
    maintenance,
    manual,
    shell,
    showing,
    statistics,
    verification,
)
from .common import Context, Subparsers, common_options
from .output import (
    EXIT_CODES,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_PROBLEMS,
    EXIT_USAGE,
    SCHEMA,
    Output,
    dumps,
    fail,
)

logger = logging.getLogger(__name__)

#: the built-in commands, in the order ``--help`` lists them
COMMAND_MODULES: tuple[ModuleType, ...] = (
    statistics,
    listing,
    showing,
    verification,
    maintenance,
    bundles,
    diagnosis,
    configuring,
    shell,
    manual,
)


def _load_plugins(subparsers: Subparsers) -> None:
    """Let installed packages add their subcommands (entry-point group ``kernelcache.commands``).

    A plugin that cannot be loaded is skipped with a warning: it must not take the operator's
    own commands down with it.
    """
    from importlib.metadata import entry_points

    for ep in sorted(entry_points(group=COMMANDS_GROUP), key=lambda e: e.name):
        try:
            ep.load()(subparsers)
        except Exception as e:  # a broken plugin is reported, never fatal to the command
            logger.warning(
                "kernelcache: skipping the command plugin %s (%s): %s", ep.name, ep.value, e
            )


class _Formatter(logging.Formatter):
    """``kernelcache: LEVEL: message``, once: the library's own messages already start with
    ``kernelcache:`` (for jobs that show them unformatted), and are not prefixed twice."""

    PREFIX = "kernelcache: "

    def __init__(self) -> None:
        super().__init__(self.PREFIX + "%(levelname)s: %(message)s")

    def formatMessage(self, record: logging.LogRecord) -> str:
        if record.message.startswith(self.PREFIX):
            record.message = record.message[len(self.PREFIX) :]
        return super().formatMessage(record)


class ArgumentsRefused(UsageError):
    """Raised by :meth:`Parser.error` instead of exiting, so that :func:`main` says the error
    as every command does (with ``--json``, as the JSON envelope too)."""

    def __init__(self, parser: argparse.ArgumentParser, message: str) -> None:
        super().__init__(message)
        self.parser = parser
        self.message = message


class Parser(argparse.ArgumentParser):
    """argparse's parser, with the nearest command or option named after a misspelt one."""

    def error(self, message: str) -> NoReturn:
        wrong = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if wrong:
            choices = re.findall(r"'([^']*)'", wrong.group(2))
            near = difflib.get_close_matches(wrong.group(1), choices, n=1)
            if wrong.group(1) in habits.COMMANDS:  # another tool's word: what it means
                given, ours = wrong.group(1), habits.COMMANDS[wrong.group(1)]
                message += f"; did you mean {ours!r}? (`pip cache {given}` is `kernelcache {ours}`)"
            elif near:
                message += f"; did you mean {near[0]!r}?"
        if message.endswith("required: COMMAND"):
            message += " (e.g. `kernelcache stats`; `kernelcache -h` lists every command)"
        unknown = re.match(r"unrecognized arguments: (.*)", message)
        if unknown:
            options = [o for a in self._actions for o in a.option_strings]
            for given in unknown.group(1).split():
                near = difflib.get_close_matches(given.split("=")[0], options, n=1)
                if given.startswith("-") and near:
                    message += f"; did you mean {near[0]}?"
                    break
        raise ArgumentsRefused(self, message)


def _subparser(parser: argparse.ArgumentParser, command: str) -> argparse.ArgumentParser:
    """The parser of ``command`` (a subcommand of ``parser``)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and command in action.choices:
            found: argparse.ArgumentParser = action.choices[command]
            return found
    return parser


def _joined_negatives(argv: Sequence[str]) -> list[str]:
    """``argv`` with ``--option -5G`` written ``--option=-5G``: argparse takes a value that
    starts with a dash and is not a plain number for an option, and would say "expected one
    argument" instead of what is wrong with the value."""
    out: list[str] = []
    for i, token in enumerate(argv):
        if token == "--":  # what follows is not ours (``kernelcache run -- COMMAND ...``)
            return out + list(argv[i:])
        if out and re.match(r"-\d", token) and out[-1].startswith("--") and "=" not in out[-1]:
            out[-1] = f"{out[-1]}={token}"
        else:
            out.append(token)
    return out


def build_parser() -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = Parser(
        prog="kernelcache",
        description="Inspect, verify, prune, export and import a kernelcache root.",
        parents=[common_options()],
        epilog="Exit codes: "
        + "; ".join(f"{code} {what.split(':')[0]}" for code, what in EXIT_CODES.items())
        + ". The manual: `kernelcache help [TOPIC]`.",
    )
    parser.add_argument("--version", action="version", version=f"kernelcache {__version__}")
    parser.add_argument(  # ccache's name of the root, before the command
        "-d", "--dir", dest="root", metavar="DIR", default=argparse.SUPPRESS, help="as --root"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in COMMAND_MODULES:
        module.register(sub)
    _load_plugins(sub)
    return parser


def _warn_unknown_variables() -> None:
    """Say, on stderr, each ``KERNELCACHE_*`` variable set that nothing declares (a misspelt
    one would silently leave its setting at the default)."""
    from ..config import unknown_message, unknown_variables

    for name, near in unknown_variables():
        logging.getLogger("kernelcache").warning("%s", unknown_message(name, near))


def _warn_root_variable(context: Context) -> None:
    """Say, on stderr, a ``$KERNELCACHE_DIR`` naming the root (no ``--root``) that is relative
    or holds a ``$VAR`` or ``~`` no shell expanded: it is used as given, as a job uses it."""
    from ..store.layout import path_problem

    named = context.environment.root if context.given_root is None else None
    problem = path_problem(named) if named is not None else None
    if problem is not None:
        logging.getLogger("kernelcache").warning("KERNELCACHE_DIR: %s", problem)


def _ours(argv: Sequence[str]) -> list[str]:
    """The arguments before ``--`` (what follows is another program's)."""
    tokens = list(argv)
    return tokens[: tokens.index("--")] if "--" in tokens else tokens


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns the exit code (130 after Ctrl-C, at any
    moment: the command's own interruption is said by :func:`_run`, one before it began
    here)."""
    try:
        return _main(argv)
    except KeyboardInterrupt:
        sys.stderr.write("kernelcache: interrupted before the command began; nothing was done\n")
        return EXIT_INTERRUPTED


def _main(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    if "_ARGCOMPLETE" in os.environ:  # a completion script asks what may follow (exits)
        shell.complete(parser)
    given = list(sys.argv[1:] if argv is None else argv)
    try:
        given = habits.translate(given)
        args, extra = parser.parse_known_args(_joined_negatives(given))
        if extra:  # said by the command's own parser, with its usage
            _subparser(parser, args.command).error(f"unrecognized arguments: {' '.join(extra)}")
    except ArgumentsRefused as e:  # said as argparse says it; with --json, as JSON too
        e.parser.print_usage(sys.stderr)
        sys.stderr.write(f"{e.parser.prog}: error: {e.message}\n")
        if "--json" in _ours(given):
            prog = e.parser.prog.split()
            command = prog[1] if len(prog) > 1 else None
            doc = {"schema": SCHEMA, "command": command, "error": e.message}
            sys.stdout.write(dumps(doc) + "\n")
        return EXIT_USAGE
    except UsageError as e:
        return fail(str(e), EXIT_USAGE, None, "--json" in _ours(given))
    args.json = getattr(args, "json", False)
    args.root = getattr(args, "root", None)
    args.verbose = getattr(args, "verbose", 0)
    args.context = Context(args.root, getattr(args, "uses", None))
    handler = logging.StreamHandler()
    handler.setFormatter(_Formatter())
    logging.basicConfig(level=logging.WARNING - 10 * min(args.verbose, 2), handlers=[handler])
    code = _run(args, Output(args.json))
    if code != EXIT_OK:  # what it reported names the root: a log it cannot take is not said again
        quiet_statistics()
    return code


def _run(args: argparse.Namespace, out: Output) -> int:
    """Run the command ``args`` names; its exit code (an error said as :func:`fail` says it)."""
    from ..progress import begin_command

    begin_command()
    try:
        if args.command != "doctor":  # (doctor lists them among its checks)
            _warn_unknown_variables()
            # the variables the command uses (kernelcache's, a package's it reads): one that
            # cannot be used is an error; any other is said and costs only itself
            args.context.check(getattr(args, "variables_read", ()))
            _warn_root_variable(args.context)
        return int(args.func(args, out))
    except UsageError as e:
        return fail(str(e), EXIT_USAGE, args.command, args.json)
    except ConfigError as e:
        return fail(f"{e} (fix the environment variable)", EXIT_USAGE, args.command, args.json)
    except MissingDependency as e:  # an optional package (the message says how to install it)
        return fail(str(e), EXIT_USAGE, args.command, args.json)
    except CommandFailed as e:
        return fail(str(e), EXIT_PROBLEMS, args.command, args.json)
    except BrokenPipeError:
        # The reader went away (`kernelcache ls | head`): stop quietly.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK
    except KeyboardInterrupt as e:
        from ..progress import interrupted

        said = interrupted()
        kept = getattr(e, "kept", None)  # (interrupted_keeping: exactly what was kept)
        if isinstance(kept, str):
            said = f"{said.partition('; ')[0]}; {kept}: run the command again to finish"
        if args.json:  # the envelope of an error, marked interrupted
            error = said.removeprefix("kernelcache: ")
            doc = {"schema": SCHEMA, "command": args.command, "error": error, "interrupted": True}
            sys.stdout.write(dumps(doc) + "\n")
        sys.stderr.write(said + "\n")
        return EXIT_INTERRUPTED
    except Exception as e:  # pragma: no cover - the message beats a traceback for operators
        if args.verbose > 1:
            raise
        return fail(
            f"{e.__class__.__name__}: {e} (rerun with -vv for a traceback)",
            EXIT_PROBLEMS,
            args.command,
            args.json,
        )


def run() -> NoReturn:
    sys.exit(main())
