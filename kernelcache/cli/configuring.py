"""``kernelcache config``: every setting with where it comes from (the environment, the root's
own configuration file, or the default), and ``--set``/``--unset`` of the settings a root's file
holds (ccache's ``-p``, ``-o key=value`` and ``-M SIZE`` run it: :mod:`.habits`).

Invariants: a value is checked by its setting's own parser before anything is written, and a
file is written whole (:mod:`kernelcache.store.settings_file`); the environment always wins
over the file, and what is set where the environment overrides it is said.
"""

from __future__ import annotations

import argparse
from typing import Any

from ..config import ConfigError, FileValues, Variable, origins, parse_variable
from ..store import settings_file
from ..store.layout import file_variables, read_settings, settings_path
from .common import ROOT, Context, Subparsers, add_command
from .output import EXIT_OK, Output, UsageError, envelope, printable


def register(subparsers: Subparsers) -> None:
    p = add_command(
        subparsers,
        "config",
        "every setting and where it comes from (environment, the root's file, default); "
        "--set KEY=VALUE writes the root's own configuration file",
        uses=ROOT,
    )
    p.add_argument(
        "--set",
        action="append",
        type=_assignment,
        metavar="KEY=VALUE",
        help="set a setting of the root's file, e.g. max_size=50G (repeatable; as ccache -o)",
    )
    p.add_argument(
        "--unset",
        action="append",
        metavar="KEY",
        help="remove a setting from the root's file: its default applies (repeatable)",
    )
    p.set_defaults(func=cmd_config)


def where_set(variable: str, origin: str) -> str:
    """Where a setting's value comes from, as the commands say it (``origin`` as
    :func:`kernelcache.config.origins` gives it): the variable, for the environment; ``key in
    FILE``, for a root's configuration file; ``default``."""
    if origin in ("environment", "default"):
        return variable if origin == "environment" else "default"
    return f"{variable.removeprefix('KERNELCACHE_').lower()} in {origin}"


def _assignment(text: str) -> tuple[str, str]:
    """``KEY=VALUE`` (a variable's name is taken too: ``KERNELCACHE_MAX_SIZE=50G``), as an
    argparse ``type``."""
    key, equals, value = text.partition("=")
    if not equals or not key.strip():
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE, e.g. max_size=50G")
    return _key(key), value.strip()


def _key(text: str) -> str:
    """A setting's key as a root's file writes it: ``max_size`` (from ``MAX_SIZE`` or
    ``KERNELCACHE_MAX_SIZE`` too)."""
    return text.strip().lower().removeprefix("kernelcache_").replace("-", "_")


def cmd_config(args: argparse.Namespace, out: Output) -> int:
    context: Context = args.context
    root = context.root
    updates: dict[str, str | None] = {k: v or None for k, v in args.set or ()}
    updates.update({_key(k): None for k in args.unset or ()})
    overridden: list[str] = []
    if updates:
        context.require_writable()
        try:
            found = settings_file.write(root, updates)
        except OSError as e:
            raise UsageError(f"cannot write {settings_path(root)}: {e.strerror}") from None
        known = file_variables()
        overridden = [known[k].name for k in updates if _from_environment(known[k])]
    else:
        found = read_settings(root, context.settings.trust)
    given = found.as_settings()
    rows = [_row(var, value, origin, given) for var, value, origin in origins(file=given)]
    for row in rows:  # the root: the one this command works on, and what named it
        if row["variable"] == "KERNELCACHE_DIR":
            row["value"] = root
            row["origin"] = "--root" if context.given_root is not None else row["origin"]

    def human() -> str:
        lines = []
        for key, value in updates.items():
            said = f"{key} = {value}" if value is not None else f"{key} removed"
            lines.append(f"{said} in {printable(found.path)}")
        for name in overridden:
            lines.append(f"(the environment's {name} overrides it in this shell and its jobs)")
        if updates:
            return "\n".join(lines)
        for row in rows:
            shown = row["value"] if row["value"] is not None else row["default"]
            note = f"  (cannot be used: {row['error']})" if row["error"] else ""
            lines.append(f"({printable(row['origin'])}) {row['key']} = {printable(shown)}{note}")
        lines += [f"problem: {printable(p)}" for p in found.problems]
        return "\n".join(lines)

    out.emit(
        {
            **envelope("config", root),
            "file": found.path,
            "exists": found.exists,
            "set": {k: v for k, v in updates.items() if v is not None},
            "unset": [k for k, v in updates.items() if v is None],
            "overridden": overridden,
            "settings": rows,
            "problems": list(found.problems),
        },
        human,
    )
    return EXIT_OK


def _from_environment(var: Variable) -> bool:
    """Whether the environment gives ``var`` a value (so a root's file does not decide it)."""
    return any(v is var and origin == "environment" for v, _, origin in origins())


def _row(var: Variable, value: str | None, origin: str, file: FileValues) -> dict[str, Any]:
    """One setting as ``config`` shows it (``error``: why its value cannot be used)."""
    error = None
    if value is not None and not var.secret:
        try:
            parse_variable(var, file=file)
        except ConfigError as e:
            error = str(e)
    return {
        "key": var.key,
        "variable": var.name,
        "value": value,
        "default": var.shown_default,
        "origin": origin,
        "in_file": var.in_file,
        "error": error,
    }
