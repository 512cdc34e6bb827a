"""Progress of long operations of the command line, on standard error.

Where standard error is a terminal (and the output is not ``--json``), a bar is drawn by the
optional ``tqdm`` package (``pip install 'kernelcache[progress]'``); without it, a one-time hint
names the extra and plain lines are written instead. Anywhere else (a pipe, a CI log, or with
``--json``), plain lines are written: ``kernelcache: warming: 12/40 (30%) after 20s``, at
most one per ``$KERNELCACHE_PROGRESS_INTERVAL`` seconds (0: one per step), and a last one at the
end of an operation that lasted that long. Callers never check: the reporter is called with the number of items done.

Invariant: nothing here starts a thread. The commands fork worker processes (``warm``), which
is only safe in a single-threaded process; tqdm's monitor thread is turned off.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, Any

from .config import settings
from .errors import ConfigError

#: the hint shown once on a terminal without tqdm
HINT = "kernelcache: install 'kernelcache[progress]' (tqdm) for a progress bar"
_hinted = False


class _Bar:
    """A tqdm bar."""

    def __init__(self, bar: Any) -> None:
        self._bar = bar

    def __call__(self, n: int = 1) -> None:
        self._bar.update(n)

    def set_total(self, total: int) -> None:
        self._bar.total = total
        self._bar.refresh()

    @property
    def done(self) -> int:
        return int(self._bar.n)

    @property
    def total(self) -> int | None:
        return None if self._bar.total is None else int(self._bar.total)


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


def hint_once(stream: IO[str]) -> None:
    """Name the extra that draws bars, once per process."""
    global _hinted
    if not _hinted:
        _hinted = True
        stream.write(HINT + "\n")


#: the operation under way in this process: its description, reporter and unit (for a message
#: when the command is interrupted)
_current: tuple[str, _Bar | _Lines, str] | None = None
#: the last operation that an exception (Ctrl-C) stopped
_stopped: tuple[str, _Bar | _Lines, str] | None = None


def interrupted() -> str:
    """What to say when the command is interrupted: how far the operation under way got, and
    that a re-run finishes the work (what was done is kept)."""
    found = _current or _stopped
    if found is None:
        return "kernelcache: interrupted; what was done is kept: run the command again to finish"
    desc, reporter, unit = found
    total = f" of {reporter.total:,}" if reporter.total else ""
    return (
        f"kernelcache: interrupted while {desc}, after {reporter.done:,}{total} {unit}; what was "
        "done is kept: run the command again to finish"
    )


@contextmanager
def bar(
    desc: str, total: int | None, *, json_mode: bool = False, unit: str = "entries"
) -> Iterator[_Bar | _Lines]:
    """Progress on stderr for ``desc`` (``total`` items, None: not known yet; the reporter's
    ``set_total`` gives it later). The yielded reporter is called with the number of items done.
    """
    stream = sys.stderr
    if on_terminal(stream) and not json_mode:
        try:
            from tqdm import tqdm
        except ImportError:
            hint_once(stream)
        else:

            class Bar(tqdm):  # (tqdm is untyped)
                monitor_interval = 0  # no monitor thread: see the module's invariant

            with Bar(
                total=total,
                desc=desc,
                unit=f" {unit}",
                leave=False,
                file=stream,
                dynamic_ncols=True,
                mininterval=0.2,
            ) as t:
                with _under_way(desc, _Bar(t), unit) as reporter:
                    yield reporter
            return
    lines = _Lines(desc, total, interval(), stream)
    try:
        with _under_way(desc, lines, unit):
            yield lines
    finally:
        lines.finish()


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
