"""What every ``kernelcache`` command shares: exit codes, errors, and where results go.

Commands contributed by other packages (see :mod:`kernelcache.cli`) use these too, so that
every command speaks the same JSON envelope and exit codes.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Callable
from typing import Any

from .. import progress as progressbar

#: the version of every command's ``--json`` document
SCHEMA = 1
EXIT_OK, EXIT_PROBLEMS, EXIT_USAGE = 0, 1, 2


class UsageError(Exception):
    """Bad input from the command line or the environment: exit code 2."""


class CommandFailed(Exception):
    """The operation could not be done: exit code 1."""


def dumps(doc: dict[str, Any]) -> str:
    """JSON text: indented on a terminal, compact (and fast) otherwise."""
    if sys.stdout.isatty():
        return json.dumps(doc, indent=2, default=str)
    return json.dumps(doc, separators=(",", ":"), default=str)


class Output:
    """Where a command's result goes: one JSON document, or human text."""

    def __init__(self, json_mode: bool) -> None:
        self.json = json_mode

    def emit(
        self,
        doc: dict[str, Any] | Callable[[], dict[str, Any]],
        human: Callable[[], str | None],
    ) -> None:
        """Print the JSON document (built only when asked for) or the human text."""
        if self.json:
            body = doc() if callable(doc) else doc
            sys.stdout.write(dumps(body) + "\n")
        else:
            text = human()
            if text:
                sys.stdout.write(text.rstrip("\n") + "\n")

    def progress(self, desc: str, total: int | None) -> contextlib.AbstractContextManager[Any]:
        """A progress bar on standard error, drawn only on a terminal and never with --json."""
        return progressbar.bar(desc, total, enabled=progressbar.wanted(self.json))


def fail(message: str, code: int, command: str | None, json_mode: bool) -> int:
    """Report an error (as the JSON envelope too, with --json) and return ``code``."""
    if json_mode:
        doc = {"schema": SCHEMA, "command": command, "error": message}
        with contextlib.suppress(OSError):
            sys.stdout.write(json.dumps(doc, indent=2) + "\n")
    sys.stderr.write(f"kernelcache: error: {message}\n")
    return code
