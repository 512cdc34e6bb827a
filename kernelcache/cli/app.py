"""The ``kernelcache`` command's entry point: the parser with the global options and every
built-in command's arguments, :func:`main`, and the loader of the commands other packages add.

The built-in commands themselves live in :mod:`.stats`, :mod:`.entries`, :mod:`.maintenance`
and :mod:`.bundles`.

See the package docstring for the conventions every command follows.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from .._version import __version__
from ..errors import ConfigError
from .bundles import cmd_export, cmd_import
from .common import age_arg, count_arg, level_arg, size_arg
from .entries import SORTS, cmd_ls, cmd_show
from .maintenance import cmd_doctor, cmd_prune, cmd_verify
from .output import EXIT_OK, EXIT_PROBLEMS, EXIT_USAGE, CommandFailed, Output, UsageError, fail
from .stats import cmd_stats

logger = logging.getLogger(__name__)

#: the entry-point group through which other packages add subcommands
COMMANDS_GROUP = "kernelcache.commands"


def _common_options() -> argparse.ArgumentParser:
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
        help="print one JSON document (fields documented in the README)",
    )
    common.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=argparse.SUPPRESS,
        help="log more; -vv for debug messages and tracebacks",
    )
    return common


def add_command(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser], name: str, help_: str
) -> argparse.ArgumentParser:
    """Add a subcommand that takes the global options (--root, --json, -v) too.

    The caller adds its arguments and sets ``func(args, out) -> exit code`` with
    ``set_defaults``; ``args.root`` (resolve it with :func:`root_of`), ``args.json`` and
    ``args.verbose`` are always present.
    """
    return subparsers.add_parser(name, parents=[_common_options()], help=help_, description=help_)


def _load_plugins(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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


def build_parser() -> argparse.ArgumentParser:
    common = _common_options()
    parser = argparse.ArgumentParser(
        prog="kernelcache",
        description="Inspect, verify, prune, export and import a kernelcache root.",
        parents=[common],
        epilog="Exit codes: 0 ok, 1 problems found or an operation failed, 2 usage error.",
    )
    parser.add_argument("--version", action="version", version=f"kernelcache {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def command(name: str, help_: str) -> argparse.ArgumentParser:
        return add_command(sub, name, help_)

    def filters(p: argparse.ArgumentParser, note: str = "") -> None:
        p.add_argument(
            "--kernel",
            action="append",
            metavar="NAME",
            help=f"only entries of this kernel name (repeatable){note}",
        )
        p.add_argument(
            "--target",
            action="append",
            metavar="T",
            help=f"only entries of this target, e.g. cuda:90 (repeatable){note}",
        )

    p = command("stats", "entries and bytes by extension, target and kernel; hit rate and counters")
    p.add_argument(
        "--format",
        choices=("table", "json", "prometheus"),
        default="table",
        help="output format (--json means json)",
    )
    p.add_argument(
        "--top",
        type=count_arg,
        default=10,
        metavar="N",
        help="rows per breakdown in the table (0: all)",
    )
    p.add_argument(
        "-o",
        "--output",
        metavar="FILE",
        help="write to FILE atomically (e.g. a node exporter textfile)",
    )
    p.set_defaults(func=cmd_stats)

    p = command("ls", "list entries and their metadata")
    filters(p)
    p.add_argument(
        "--sort",
        choices=tuple(SORTS),
        default="name",
        help="name (kernel, target, key); size (largest first); age (oldest first); last-used (least recent first)",
    )
    p.add_argument("--reverse", action="store_true", help="reverse the order")
    p.add_argument("--limit", type=count_arg, metavar="N", help="show at most N entries")
    p.set_defaults(func=cmd_ls)

    p = command("show", "one entry: metadata, path, verified status")
    p.add_argument("key", metavar="KEY", help="a key or a unique prefix of at least 6 hex digits")
    p.set_defaults(func=cmd_show)

    p = command(
        "verify",
        "check every entry's size, digest and metadata; find orphans, stale staging files and locks",
    )
    p.add_argument(
        "--repair",
        action="store_true",
        help="quarantine corrupt entries; remove orphans, stale staging files and stale locks",
    )
    p.set_defaults(func=cmd_verify)

    p = command(
        "prune",
        "plan, then remove entries by size cap (least recently used first) or age; clean up",
    )
    p.add_argument(
        "--max-size",
        type=size_arg,
        metavar="SIZE",
        help="keep at most SIZE bytes of (matching) entries, e.g. 10G",
    )
    p.add_argument(
        "--older-than",
        type=age_arg,
        metavar="AGE",
        help="remove (matching) entries not used for AGE, e.g. 30d",
    )
    filters(
        p,
        "; without --max-size or --older-than, every matching entry is deleted (a summary is "
        "printed first)",
    )
    p.add_argument(
        "--quarantine-age",
        type=age_arg,
        default=7 * 86400.0,
        metavar="AGE",
        help="remove quarantined files older than AGE (default 7d)",
    )
    p.add_argument("--dry-run", action="store_true", help="print the plan, change nothing")
    p.add_argument("--list", action="store_true", help="list every planned action")
    p.set_defaults(func=cmd_prune)

    p = command("export", "write entries to a bundle (tar, or tar+zstd)")
    p.add_argument("file", metavar="FILE")
    filters(p)
    p.add_argument(
        "--compression",
        choices=("auto", "none", "zstd"),
        default="auto",
        help="auto: zstd when FILE ends in .zst/.zstd/.tzst",
    )
    p.add_argument("--level", type=level_arg, default=3, help="zstd level, 1 to 22 (default 3)")
    p.add_argument("--force", action="store_true", help="overwrite FILE")
    p.set_defaults(func=cmd_export)

    p = command("import", "verify a bundle completely, then add its entries")
    p.add_argument("file", metavar="FILE")
    p.add_argument(
        "--max-member-size",
        type=size_arg,
        default=256 << 20,
        metavar="SIZE",
        help="refuse artifacts larger than SIZE (default 256M)",
    )
    p.add_argument("--dry-run", action="store_true", help="verify only; write nothing")
    p.set_defaults(func=cmd_import)

    p = command(
        "doctor", "the root, its filesystem, free space, permissions, locks, versions, environment"
    )
    p.set_defaults(func=cmd_doctor)

    _load_plugins(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    args.json = getattr(args, "json", False)
    args.root = getattr(args, "root", None)
    args.verbose = getattr(args, "verbose", 0)
    logging.basicConfig(
        level=logging.WARNING - 10 * min(args.verbose, 2),
        format="kernelcache: %(levelname)s: %(message)s",
    )
    out = Output(args.json)
    try:
        return int(args.func(args, out))
    except UsageError as e:
        return fail(str(e), EXIT_USAGE, args.command, args.json)
    except ConfigError as e:
        return fail(f"{e} (fix the environment variable)", EXIT_USAGE, args.command, args.json)
    except CommandFailed as e:
        return fail(str(e), EXIT_PROBLEMS, args.command, args.json)
    except BrokenPipeError:
        # The reader went away (`kernelcache ls | head`): stop quietly.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK
    except KeyboardInterrupt:
        sys.stderr.write("kernelcache: interrupted\n")
        return 130
    except Exception as e:  # pragma: no cover - the message beats a traceback for operators
        if args.verbose > 1:
            raise
        from ..errors import MissingDependency  # the one optional-package error commands raise

        if isinstance(e, MissingDependency):
            return fail(str(e), EXIT_USAGE, args.command, args.json)
        return fail(
            f"{e.__class__.__name__}: {e} (rerun with -vv for a traceback)",
            EXIT_PROBLEMS,
            args.command,
            args.json,
        )


def run() -> NoReturn:
    sys.exit(main())
