"""What every ``kernelcache`` command shares: exit codes, errors, where results go, and how
they read (sizes, ages, tables, the JSON envelope).

Commands contributed by other packages (see :mod:`kernelcache.cli`) use these too, so that
every command speaks the same JSON envelope and exit codes.
"""

from __future__ import annotations

import contextlib
import json
import math
import sys
from collections.abc import Callable, Sequence
from typing import Any

from .. import progress as progressbar
from ..errors import CommandFailed as CommandFailed  # the errors commands raise, kept here too
from ..errors import NothingDone as NothingDone
from ..errors import UsageError as UsageError
from ..naming import NAME_SEPARATOR, kernel_names
from ..process import printable as printable  # (how the commands show what others wrote)
from ..units import human_size as human_size  # (how the commands show sizes)

#: the version of every command's ``--json`` document
SCHEMA = 1
EXIT_OK, EXIT_PROBLEMS, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
#: what each exit code of every command means, "short: in full" (the documentation's table and
#: the help's summary are made from it)
EXIT_CODES = {
    EXIT_OK: "done: everything asked for was done (nothing to do counts)",
    EXIT_PROBLEMS: "done in part: problems were found or some work failed (corrupt entries, "
    "a kernel that did not compile, a remote tier that did not answer); the output says which",
    EXIT_USAGE: "nothing was done: bad arguments or environment variables, an environment "
    "the command cannot work in (a root that cannot be read or written, an input that does "
    "not exist, a missing optional package), an input refused whole, or a question not "
    "confirmed",
    EXIT_INTERRUPTED: "interrupted: Ctrl-C; what was done is kept and a re-run finishes the work",
}


def interrupted_keeping(kept: str) -> KeyboardInterrupt:
    """Ctrl-C, to raise again from a command that knows exactly what was kept: ``kept`` is said
    after how far the operation under way got, in place of "what was done is kept" (a plain
    KeyboardInterrupt carrying it as ``kept``, so that no ``except Exception`` can catch it)."""
    stop = KeyboardInterrupt(kept)
    stop.kept = kept  # type: ignore[attr-defined]
    return stop


def dumps(doc: dict[str, Any]) -> str:
    """JSON text: indented on a terminal, compact (and fast) otherwise. Always strict JSON:
    NaN and infinities (which metadata read from disk may hold) become null."""
    layout: dict[str, Any] = {"indent": 2} if sys.stdout.isatty() else {"separators": (",", ":")}
    try:
        return json.dumps(doc, default=str, allow_nan=False, **layout)
    except ValueError:  # a non-finite number somewhere: the rare, slower path
        return json.dumps(finite(doc), default=str, allow_nan=False, **layout)


def finite(value: Any) -> Any:
    """``value`` with every NaN or infinite float (in any dict, list or tuple) made None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


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

    def progress(
        self, desc: str, total: int | None, *, changes: bool = True
    ) -> contextlib.AbstractContextManager[Any]:
        """Progress on standard error: a bar on a terminal without --json, else plain lines
        (see :mod:`kernelcache.progress`; ``changes``: False for an operation that only
        reads)."""
        return progressbar.bar(desc, total, json_mode=self.json, changes=changes)


def fail(message: str, code: int, command: str | None, json_mode: bool) -> int:
    """Report an error (as the JSON envelope too, with --json) and return ``code``."""
    message = message.removeprefix("kernelcache: ")  # (said once, by the prefix below)
    if json_mode:
        doc = {"schema": SCHEMA, "command": command, "error": message}
        with contextlib.suppress(OSError):
            sys.stdout.write(dumps(doc) + "\n")
    sys.stderr.write(f"kernelcache: error: {message}\n")
    return code


# -- human text and the JSON envelope -------------------------------------------------------
def plural(n: int, word: str) -> str:
    """``n`` and ``word``, plural unless ``n`` is 1: ``1 process``, ``2 processes``,
    ``1,024 entries``."""
    if n == 1:
        return f"1 {word}"
    if word.endswith(("s", "x", "ch", "sh")):
        return f"{n:,} {word}es"
    if word.endswith("y") and word[-2:-1] not in "aeiou":
        return f"{n:,} {word[:-1]}ies"
    return f"{n:,} {word}s"


def human_age(seconds: float | None) -> str:
    """How long ago: ``90s ago``, ``3h ago``, ``12d ago``; ``-`` for None."""
    if seconds is None or not math.isfinite(seconds):
        return "-"
    seconds = max(seconds, 0.0)
    for limit, unit, div in ((120, "s", 1), (7200, "m", 60), (172800, "h", 3600)):
        if seconds < limit:
            return f"{seconds / div:.0f}{unit} ago"
    return f"{seconds / 86400:.0f}d ago"


def human_duration(seconds: float) -> str:
    """A duration: ``4.2s``, ``3.5 min``, ``2.1 h``."""
    if seconds < 120:
        return f"{seconds:.1f}s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def format_table(rows: Sequence[Sequence[str]], right: Sequence[int] = ()) -> str:
    """Rows as aligned columns; the columns numbered in ``right`` are right-aligned. Cells
    are shown :func:`printable`."""
    rows = [[printable(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for row in rows:
        cells = [
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def format_label(value: str | None) -> str:
    """A kernel or target name as shown (:func:`printable`); ``(none)`` when absent."""
    return "(none)" if value is None else printable(value)


#: the kernel names ``ls`` shows of an entry that holds several
SHOWN_KERNELS = 3


def format_kernels(value: str | None) -> str:
    """An entry's kernel name as shown (:func:`format_label`); of an entry that holds several
    kernels, the first :data:`SHOWN_KERNELS` and how many more."""
    names = kernel_names(value)
    if len(names) <= SHOWN_KERNELS:
        return format_label(value)
    shown = NAME_SEPARATOR.join(names[:SHOWN_KERNELS])
    return f"{printable(shown)} (+{len(names) - SHOWN_KERNELS} more)"


def envelope(command: str, root: str | None) -> dict[str, Any]:
    """The fields every command's ``--json`` document starts with."""
    return {"schema": SCHEMA, "command": command, "root": root}
