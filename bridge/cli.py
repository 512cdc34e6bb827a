"""``kernelcache warm``: the bridge's subcommand of the ``kernelcache`` command.

Registered through the entry-point group ``kernelcache.commands``. Importing this module imports
neither jax nor triton: they are imported when the command runs, and their absence is a usage
error that names the package to install.
"""

from __future__ import annotations

import argparse

from kernelcache.cli import UsageError, add_command, root_of
from kernelcache.cli.output import Output

#: top-level modules whose absence means the bridge's extra is not installed
_BRIDGE_DEPENDENCIES = {"bridge", "jax", "jaxlib", "triton", "google", "protobuf"}


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``warm`` to the ``kernelcache`` command."""
    p = add_command(
        subparsers,
        "warm",
        "compile a recorded manifest for other targets (needs kernelcache[bridge])",
    )
    p.add_argument("manifest", metavar="MANIFEST")
    p.add_argument(
        "--target",
        action="append",
        required=True,
        metavar="T",
        help="e.g. cuda:90 or hip:gfx942 (repeatable)",
    )
    p.add_argument(
        "-j",
        "--jobs",
        type=int,
        metavar="N",
        help="compile in N processes (default: one per available CPU)",
    )
    p.add_argument(
        "--allow-changed",
        action="store_true",
        help="compile the current source of kernels changed since recording instead of failing",
    )
    p.set_defaults(func=cmd_warm)


def cmd_warm(args: argparse.Namespace, out: Output) -> int:
    try:
        from . import warm
    except ImportError as e:
        missing = (e.name or "").split(".")[0]
        if missing and missing not in _BRIDGE_DEPENDENCIES:
            raise
        raise UsageError(
            f"kernelcache warm needs the bridge and its dependencies (cannot import "
            f"{e.name or 'bridge.warm'}): pip install 'kernelcache[bridge]'"
        ) from None
    return warm.run(
        args.manifest,
        list(args.target),
        root=root_of(args),
        json=out.json,
        jobs=args.jobs,
        allow_changed=args.allow_changed,
    )
