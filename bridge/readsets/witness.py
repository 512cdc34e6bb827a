"""The frontend as witness: what Triton's code generator read while it generated one kernel,
recorded as a read set (:mod:`.read_sets`) kept with the compiled kernel.

A kernel's key describes its code before any compile: a model of what the frontend might read.
The witness is what it did read, as ccache's direct mode keeps the headers the preprocessor
opened: every global and closure variable a JIT function resolved, every attribute and item
taken from what it found, every call of the program's own code made at compile time, with its
arguments and result (:mod:`.frontend_hooks`), and the environment variables the compile read.
A cached kernel is used only while its reads find what they found
(:func:`.read_sets.stale`); the key is the fast way to the entry, and need not be complete.

What the witness cannot follow is named in the read set as ``partial``: the reads it recorded
are still checked, and the IR decides the rest. A call it cannot make again still has what its
code can read recorded (:func:`.reach.reachable`), so that code the key trusts by its file is
not trusted for the values it reads. The hooks do nothing outside a :func:`recording` block of
the same thread.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import threading
from collections.abc import Iterator
from typing import Any

from ..entries import metadata
from ..exceptions import OverBudget
from ..identity import namespaces as pv
from ..identity.keyed_environment import environment_want
from ..identity.static_reads import RUNS_CODE
from . import read_sets as rs
from .guard import Guard

#: the largest read set's text an entry keeps (its rows are cut to fit, and it says so)
MAX_TEXT = 48 << 10
_local = threading.local()


class Recorder:
    """The read set of one frontend run (see the module docstring)."""

    def __init__(self, kernel: Any, params: dict[str, Any]) -> None:
        self.kernel = kernel
        self.trace = rs.Trace()
        self.rows: list[list[Any]] = []
        self.found: list[Any] = []  # (what each row found)
        self.index: dict[str, int] = {}
        self.partial: list[str] = []
        self.environ: dict[str, str | None] = {}  # variables read during the compile
        #: the specialization the frontend ran for and the digest of its IR (see :meth:`ran`)
        self.frontend: tuple[Any, str] | None = None
        #: the guard watching the frontend run (:meth:`watching`), if one is
        self.guard: Guard | None = None
        for name, value in params.items():
            if pv.exact(value) is None:  # (a plain value is in the key as it is)
                self.add(-1, "p", name, value)

    def origin(self, value: Any) -> int | None:
        """The row that found ``value`` (``-1``: the kernel), None where no read did."""
        if value is self.kernel:
            return -1
        return self.trace.row_of(value)

    def add(self, parent: int, op: str, operand: Any, value: Any) -> int | None:
        """Record that the read ``op operand`` of the object of ``parent`` found ``value``;
        its row (None where it is not recorded: the read set is full, the read has no form a
        read set holds, or only code would find ``value``: then the read set is partial)."""
        name = json.dumps([parent, op, operand], separators=(",", ":"), default=repr)
        known = self.index.get(name)
        if known is not None:
            self.trace.note(value, known)
            return known
        if len(self.rows) >= metadata.MAX_ROWS - 1:  # (the rest is cut, and the read set says
            # so; the last row is kept for the IR's, which a partial read set ends with)
            self.missed(f"more than {metadata.MAX_ROWS - 1} reads")
            return None
        row = len(self.rows)
        if value is RUNS_CODE:
            self.missed(f"{op} {str(operand)[:40]}: found by code of the program's own")
            return None
        doc = [parent, op, operand, ""]
        why = metadata.row_problem(row, [*doc[:3], "absent"], row + 1)
        if why is not None:
            self.missed(f"a read of no form a read set holds: {op} {str(operand)[:40]}: {why}")
            return None
        try:
            with pv.budget(rs.MAX_PARTS):
                doc[3] = self.trace.want(value, row)
        except OverBudget:
            self.missed(f"{op} {str(operand)[:40]}: a value past what a check describes")
            return None
        self.index[name] = row
        self.rows.append(doc)
        self.found.append(value)
        return row

    def argument(self, value: Any) -> list[Any] | None:
        """``value`` as an argument of a recorded call: plain, or found by a read; None."""
        plain = pv.exact(value)
        if plain is not None:
            return ["v", plain]
        row = self.origin(value)
        if row is None and isinstance(value, pv.language().constexpr):
            row = self.origin(value.value)
            return None if row is None or row < 0 else ["rk", row]
        return None if row is None or row < 0 else ["r", row]

    @contextlib.contextmanager
    def guarded(self) -> Iterator[None]:
        """Note a read (the witness's own bookkeeping: :meth:`ours`); a failure of the witness
        itself is named in the read set (as what it could not follow), never the compile's."""
        with self.ours():
            try:
                yield
            except Exception as e:  # (the user's objects, described: whatever they raise)
                self.missed(f"the witness failed: {type(e).__name__}: {e}"[:200])

    def missed(self, why: str) -> None:
        """Note why the read set is partial (the first :data:`~.metadata.MAX_REASONS` reasons
        are kept; :meth:`text` fits them to the form check's bounds)."""
        if len(self.partial) < metadata.MAX_REASONS and why not in self.partial:
            self.partial.append(why)

    def ran(self, specialization: Any, ir: str) -> None:
        """Note that the frontend gave IR of digest ``ir`` for ``specialization`` (plain data,
        :func:`~bridge.identity.frontend.specialization`; None where it has none): where the read set is
        partial, it ends with that as a read (``"ir"``), which runs the frontend again."""
        self.frontend = (specialization, ir)

    def text(self) -> str:
        """The read set as its entry keeps it."""
        for name, value in sorted(self.environ.items()):
            if name not in _keyed_environment():
                self.add(-1, "e", name, environment_want(name, value))
        opaque = [f"no exact description of {o}" for o in self.trace.opaque[:4]]
        partial = metadata.bounded_reasons(self.partial + opaque)
        rows = self.rows
        while True:
            doc = {"format": rs.FORMAT, "rows": self._vouched(rows, partial), "partial": partial}
            text = json.dumps(doc, separators=(",", ":"))
            if len(text) <= MAX_TEXT:
                return text
            rows = rows[: len(rows) // 2]  # (a row names only rows before it)
            partial = metadata.bounded_reasons([f"cut to {len(rows)} reads", *partial])

    @contextlib.contextmanager
    def watching(self) -> Iterator[None]:
        """Watch the frontend run in this block (:mod:`.guard`): code of the program it runs
        outside a call recorded to be made again makes the read set partial."""
        with Guard(ran=self._ran_program) as guard:
            self.guard = guard
            try:
                yield
            finally:
                self.guard = None

    def _ran_program(self, name: str) -> None:
        self.missed(f"the frontend ran {name}, code of the program no read made")

    def ours(self) -> Any:
        """A block of the witness's own bookkeeping (the guard does not look at it)."""
        return self.guard.ours() if self.guard is not None else contextlib.nullcontext()

    def _vouched(self, rows: list[list[Any]], partial: list[str]) -> list[list[Any]]:
        """``rows`` and, where they are ``partial``, the IR the frontend gave, as a read."""
        if not partial or self.frontend is None:
            return rows
        made, ir = self.frontend
        return [*rows, [-1, "ir", made, rs.Trace().want(ir, len(rows))]]


@functools.lru_cache(maxsize=1)
def _keyed_environment() -> frozenset[str]:
    """The variables a read set does not keep: those every kernel key holds already, and
    those that only select devices or say where files go (:mod:`bridge.identity.compiler_identity`)."""
    from triton._C.libtriton import get_cache_invalidating_env_vars

    from ..identity.compiler_identity import DEVICE_SELECTION, NEUTRAL, environment_variables

    return frozenset(
        {*NEUTRAL, *DEVICE_SELECTION, *environment_variables(None)}
        | set(get_cache_invalidating_env_vars())
    )


def active() -> Recorder | None:
    return getattr(_local, "recorder", None)


@contextlib.contextmanager
def recording(kernel: Any, given: dict[str, Any]) -> Iterator[Recorder]:
    """Record what the frontend reads in this thread, generating ``kernel`` with the constexpr
    arguments ``given`` (by parameter name), until the block ends."""
    recorder = Recorder(kernel, given)
    before = active()
    _local.recorder = recorder
    try:
        yield recorder
    finally:
        _local.recorder = before


class _Environ(os._Environ):
    """``os.environ`` as the compile sees it: the same variables, each read noted."""

    def __init__(self, real: Any, recorder: Recorder) -> None:
        super().__init__(
            real._data, real.encodekey, real.decodekey, real.encodevalue, real.decodevalue
        )
        self.recorder = recorder

    def __getitem__(self, key: str) -> str:
        try:
            value = super().__getitem__(key)
        except KeyError:
            self.recorder.environ.setdefault(key, None)
            raise
        self.recorder.environ.setdefault(key, value)
        return value

    def copy(self) -> dict[str, str]:
        """The whole environment, for a process the compile starts: not a read of any one
        variable (that process's own reads are its tool's, whose file counts)."""
        return {self.decodekey(k): self.decodevalue(v) for k, v in self._data.items()}  # type: ignore[attr-defined]

    def items(self) -> Any:
        return self.copy().items()

    def values(self) -> Any:
        return self.copy().values()


@contextlib.contextmanager
def reading_environment(recorder: Recorder) -> Iterator[None]:
    """Note in ``recorder`` every variable read through ``os.environ`` (and ``os.getenv``) or
    Triton's knobs until the block ends: for a compiler process, whose every thread is the
    compile's (elsewhere, reads of other threads are noted too: more reads, never fewer)."""
    from triton import knobs

    real = os.environ
    readers = {n: getattr(knobs, n) for n in ("getenv", "getenv_bool") if hasattr(knobs, n)}

    def noting(read: Any) -> Any:
        def reader(key: str, *args: Any) -> Any:
            recorder.environ.setdefault(key, real.get(key))
            return read(key, *args)

        return reader

    os.environ = _Environ(real, recorder)  # noqa: B003 (the same variables, each read noted)
    for name, read in readers.items():  # (Triton's knobs read through its native library)
        setattr(knobs, name, noting(read))
    try:
        yield
    finally:
        os.environ = real  # noqa: B003
        for name, read in readers.items():
            setattr(knobs, name, read)
