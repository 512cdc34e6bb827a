"""Progress bars for long operations of the command line.

A bar is shown only when standard error is a terminal, the output is not ``--json``, and the
optional ``tqdm`` package is installed (``pip install 'kernelcache[progress]'``). Otherwise
every function here is a no-op, so callers never check.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, Any


class _Silent:
    """Stands in for a bar where none is shown."""

    def __call__(self, n: int = 1) -> None:
        pass

    def set_total(self, total: int) -> None:
        pass


class _Bar:
    def __init__(self, bar: Any) -> None:
        self._bar = bar

    def __call__(self, n: int = 1) -> None:
        self._bar.update(n)

    def set_total(self, total: int) -> None:
        self._bar.total = total
        self._bar.refresh()


def wanted(json_mode: bool, stream: IO[str] | None = None) -> bool:
    """Whether a bar should be drawn: a terminal on ``stream`` (stderr) and no ``--json``."""
    stream = sys.stderr if stream is None else stream
    if json_mode:
        return False
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


@contextmanager
def bar(desc: str, total: int | None, *, enabled: bool) -> Iterator[_Bar | _Silent]:
    """A progress bar on stderr; the yielded object is called with the number of items done.

    Yields a silent stand-in when ``enabled`` is false or tqdm is not installed.
    """
    if not enabled:
        yield _Silent()
        return
    try:
        from tqdm import tqdm
    except ImportError:
        yield _Silent()
        return
    with tqdm(
        total=total,
        desc=desc,
        unit=" entries",
        leave=False,
        file=sys.stderr,
        dynamic_ncols=True,
        mininterval=0.2,
    ) as t:
        yield _Bar(t)
