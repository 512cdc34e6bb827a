"""The ``kernelcache`` command: inspect, verify, prune, export and import a cache root.

``kernelcache [--root DIR] COMMAND [options] [--json]``. Human output is for terminals; with
``--json`` each command prints one JSON document whose fields are documented (docs/commands.md) and stable within ``"schema": 1``. Exit codes: one table for every command,
:data:`.output.EXIT_CODES` (0 done, 1 done in part, 2 nothing done: usage or environment, 130
interrupted).

The command imports neither jax nor triton, so it runs on an operator's machine that has neither.

One protocol for every command: a module exports ``register(subparsers)``, which adds its
parsers with :func:`add_command` and sets ``func(args, out) -> exit code`` on them. This
module's names are the whole surface a package adding commands uses (the bridge adds its own):
the protocol, the exit codes, :class:`Output` and the helpers its commands share (argument
types, the JSON envelope, human formatting, a progress :func:`bar`, a root's :func:`scan`, the
question before deleting every entry, :func:`confirm_everything`), and what a package adds to the other commands: a section of ``doctor``
(:func:`register_report`, :class:`Check`), its toolchain for ``import --dry-run``
(:func:`register_toolchain`) and what its entries hold for ``show`` (:func:`register_content`;
its metadata fields: :func:`register_field_view`). ``args``
carries the command's :class:`~.common.Context` (the root and the settings, resolved once;
:func:`root_of`), ``out`` is the :class:`Output`. The built-in modules are listed in
:mod:`.app`; other packages add theirs through the entry-point group ``kernelcache.commands``
(the bridge adds ``warm`` this way).

Modules: :mod:`.app` (the parser, ``main`` and the plugin loader), :mod:`.habits` (ccache's
options in a command's place), :mod:`.output` (exit codes,
errors, the JSON envelope and human formatting), :mod:`.common` (global options, argument types,
the context), and one module per group of commands: :mod:`.statistics` (``stats``; its
table and Prometheus text: :mod:`.stats_text`),
:mod:`.listing` (``ls``), :mod:`.showing` (``show``; :func:`register_content`, through which a
package says what its entries hold), :mod:`.verification` (``verify``), :mod:`.maintenance` (``prune``, ``clear``),
:mod:`.bundles` (``export``, ``import``), :mod:`.diagnosis` (``doctor``), :mod:`.shell`
(``dir``, ``completion``) and :mod:`.manual` (``help``).
"""

from __future__ import annotations

from ..doctor import Check, register_report
from ..errors import CommandFailed, UsageError
from ..maintenance import scan
from ..progress import bar
from ..toolchains import register_toolchain
from .app import main, run
from .common import (
    add_command,
    age_arg,
    confirm_everything,
    parse_age,
    parse_size,
    root_of,
    size_arg,
)
from .output import (
    EXIT_CODES,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_PROBLEMS,
    EXIT_USAGE,
    SCHEMA,
    Output,
    envelope,
    fail,
    human_age,
    interrupted_keeping,
    plural,
    printable,
)
from .showing import Content, register_content, register_field_view

__all__ = [
    "EXIT_CODES",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_PROBLEMS",
    "EXIT_USAGE",
    "SCHEMA",
    "Check",
    "CommandFailed",
    "Content",
    "Output",
    "UsageError",
    "add_command",
    "age_arg",
    "bar",
    "confirm_everything",
    "envelope",
    "fail",
    "human_age",
    "interrupted_keeping",
    "main",
    "parse_age",
    "parse_size",
    "plural",
    "printable",
    "register_content",
    "register_field_view",
    "register_report",
    "register_toolchain",
    "root_of",
    "run",
    "scan",
    "size_arg",
]
