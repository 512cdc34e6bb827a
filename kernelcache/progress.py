"""Progress of long operations of the command line, on standard error.

Where standard error is a terminal (and the output is not ``--json``), a bar is redrawn in
place (a carriage return, no escape sequence), at most every :data:`REDRAW` seconds, and erased
when the operation ends:
``warming: [#######.............] 12/40 entries (30%) 20s``; it needs no optional package.
Anywhere else (a pipe, a CI log, or with ``--json``), plain lines are written, never a carriage
return or an escape sequence: ``kernelcache: warming: 12/40 (30%) after 20s``, at most one per
``$KERNELCACHE_PROGRESS_INTERVAL`` seconds (0: one per step), and a last one at the end of an
operation that lasted that long. Callers never check: the reporter is called with the number
of items done.

Invariant: nothing here starts a thread. The commands fork worker processes (``warm``), which
is only safe in a single-threaded process. A reporter may be called from any thread.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO

from .config import settings
from .errors import ConfigError

#: seconds between two drawings of a bar
REDRAW = 0.2
#: the width of a terminal that does not say its own
DEFAULT_COLUMNS = 80
#: a bar narrower than this is left out (the counts are still drawn)
MIN_BAR = 10


class _Bar:
    """A bar on a terminal, redrawn in place (from its first step on), erased by :meth:`finish`."""

    def __init__(self, desc: str, total: int | None, unit: str, stream: IO[str]) -> None:
        self.desc, self.total, self.unit, self.stream = desc, total, unit, stream
        self.done = 0
        self.started = time.monotonic()
        self.drawn_at: float | None = None
        self.shown = 0  # the length of the line drawn last
        self._lock = threading.Lock()

    def __call__(self, n: int = 1) -> None:
        with self._lock:
            self.done += n
            now = time.monotonic()
            if self.drawn_at is None or now - self.drawn_at >= REDRAW:
                self._draw(now)

    def set_total(self, total: int) -> None:
        self.total = total

    def finish(self) -> None:
        """Erase the bar (the command's own output follows on a clean line)."""
        if self.drawn_at is not None:
            self.stream.write("\r" + " " * self.shown + "\r")
            self.stream.flush()

    def line(self, now: float, columns: int) -> str:
        """The bar as drawn ``now`` on a terminal of ``columns`` columns."""
        elapsed = f"{now - self.started:.0f}s"
        if not self.total:
            return f"{self.desc}: {self.done:,} {self.unit} {elapsed}"[: columns - 1]
        done = min(self.done, self.total)
        counts = f"{done:,}/{self.total:,} {self.unit} ({100 * done // self.total}%) {elapsed}"
        width = columns - 1 - len(self.desc) - len(counts) - 5  # ": [", "] " and the cursor
        if width < MIN_BAR:
            return f"{self.desc}: {counts}"[: columns - 1]
        filled = width * done // self.total
        return f"{self.desc}: [{'#' * filled}{'.' * (width - filled)}] {counts}"

    def _draw(self, now: float) -> None:
        self.drawn_at = now
        text = self.line(now, _columns(self.stream))
        self.stream.write("\r" + text + " " * (self.shown - len(text)))  # (spaces: what was longer)
        self.stream.flush()
        self.shown = len(text)


def _columns(stream: IO[str]) -> int:
    """The width of the terminal ``stream`` writes to."""
    try:
        return os.get_terminal_size(stream.fileno()).columns or DEFAULT_COLUMNS
    except (AttributeError, ValueError, OSError):
        return DEFAULT_COLUMNS


class _Lines:
    """Plain progress lines, at most one per ``interval`` seconds (called from any thread)."""

    def __init__(self, desc: str, total: int | None, interval: float, stream: IO[str]) -> None:
        self.desc, self.total, self.interval, self.stream = desc, total, interval, stream
        self.done = 0
        self.started = self.last = time.monotonic()
        self.written = False
        self._lock = threading.Lock()

    def __call__(self, n: int = 1) -> None:
        with self._lock:
            self.done += n
            now = time.monotonic()
            if now - self.last >= self.interval:
                self.last = now
                self._write(now)

    def set_total(self, total: int) -> None:
        self.total = total

    def finish(self) -> None:
        """The last line: written when any was, or when the operation lasted the interval."""
        now = time.monotonic()
        if self.written or now - self.started >= self.interval:
            self._write(now)

    def _write(self, now: float) -> None:
        if self.total:
            count = f"{self.done}/{self.total} ({100 * self.done // self.total}%)"
        else:
            count = f"{self.done}"
        self.stream.write(f"kernelcache: {self.desc}: {count} after {now - self.started:.0f}s\n")
        self.stream.flush()
        self.written = True


def on_terminal(stream: IO[str]) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def interval() -> float:
    """Seconds between two plain progress lines (``$KERNELCACHE_PROGRESS_INTERVAL``; 0: a line
    per step).
    A bad value is the command's usage error elsewhere; here it means the default."""
    try:
        return settings().progress_interval
    except ConfigError:
        return 10.0


#: the operation under way in this process: its description, reporter and unit (for a message
#: when the command is interrupted)
_current: tuple[str, _Bar | _Lines, str] | None = None
#: the last operation that an exception (Ctrl-C) stopped
_stopped: tuple[str, _Bar | _Lines, str] | None = None
#: whether an operation that may change something (one not declared read-only) began
_changing: list[bool] = []


def begin_command() -> None:
    """Forget the operations of a command run before in this process (``main`` may be called
    more than once): what :func:`interrupted` says is of the command under way."""
    global _current, _stopped
    _current = _stopped = None
    _changing.clear()


def interrupted() -> str:
    """What to say when the command is interrupted: how far the operation under way got, and
    that a re-run finishes the work: nothing was changed, when only read-only operations began
    (``bar(changes=False)``); else what was done is kept."""
    found = _current or _stopped
    if found is None:
        return "kernelcache: interrupted; what was done is kept: run the command again to finish"
    desc, reporter, unit = found
    total = f" of {reporter.total:,}" if reporter.total else ""
    kept = "what was done is kept" if _changing else "nothing was changed"
    return (
        f"kernelcache: interrupted while {desc}, after {reporter.done:,}{total} {unit}; {kept}: "
        "run the command again to finish"
    )


@contextmanager
def bar(
    desc: str,
    total: int | None,
    *,
    json_mode: bool = False,
    unit: str = "entries",
    changes: bool = True,
) -> Iterator[_Bar | _Lines]:
    """Progress on stderr for ``desc`` (``total`` items, None: not known yet; the reporter's
    ``set_total`` gives it later). The yielded reporter is called with the number of items done.
    ``changes``: False for an operation that only reads (``verify`` without ``--repair``), so
    that an interruption says nothing was changed.
    """
    if changes and not _changing:
        _changing.append(True)
    stream = sys.stderr
    reporter: _Bar | _Lines
    if on_terminal(stream) and not json_mode:
        reporter = _Bar(desc, total, unit, stream)
    else:
        reporter = _Lines(desc, total, interval(), stream)
    try:
        with _under_way(desc, reporter, unit):
            yield reporter
    finally:
        reporter.finish()


@contextmanager
def _under_way(desc: str, reporter: _Bar | _Lines, unit: str) -> Iterator[_Bar | _Lines]:
    """``reporter``, known as the operation under way (:func:`interrupted`) meanwhile."""
    global _current, _stopped
    before, _current, _stopped = _current, (desc, reporter, unit), None
    try:
        yield reporter
    except BaseException:  # (re-raised) the operation it reports on stopped here
        _stopped = (desc, reporter, unit)
        raise
    finally:
        _current = before
