"""The ``kernelcache`` command: inspect, verify, prune, export and import a cache root.

``kernelcache [--root DIR] COMMAND [options] [--json]``. Human output is for terminals; with
``--json`` each command prints one JSON document whose fields are documented (README.md, "The
command line") and stable within ``"schema": 1``. Exit codes: 0 success, 1 problems found or an
operation failed, 2 usage error (bad arguments, bad environment variable, missing optional
package).

The command imports neither jax nor triton, so it runs on an operator's machine that has neither.
Other packages add subcommands through the entry-point group ``kernelcache.commands``: each
entry point names a ``register(subparsers)`` function, which adds its parsers with
:func:`add_command` and sets ``func(args, out) -> exit code`` on them (the bridge adds ``warm``
this way).

Modules: :mod:`.app` (the parser, ``main`` and the plugin loader), :mod:`.output` (exit codes,
errors, the JSON envelope and human formatting), :mod:`.common` (size and age arguments, the
root), and one module per group of commands: :mod:`.stats`, :mod:`.entries` (``ls``, ``show``),
:mod:`.maintenance` (``verify``, ``prune``, ``doctor``) and :mod:`.bundles` (``export``,
``import``).
"""

from __future__ import annotations

from .app import add_command, main, run
from .common import parse_age, parse_size, root_of
from .output import EXIT_OK, EXIT_PROBLEMS, EXIT_USAGE, SCHEMA, CommandFailed, Output, UsageError

__all__ = [
    "EXIT_OK",
    "EXIT_PROBLEMS",
    "EXIT_USAGE",
    "SCHEMA",
    "CommandFailed",
    "Output",
    "UsageError",
    "add_command",
    "main",
    "parse_age",
    "parse_size",
    "root_of",
    "run",
]
