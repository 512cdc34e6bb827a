"""What crosses the pipe between this process and the compiler process (:mod:`.compiler_process`).

A message is its length (8 bytes, little-endian) and its bytes. A request is ``(fn, args)``
pickled (:func:`dumps`): the arguments as their class and fields, plain data as itself, every
other object by reference to the object the compiler process was forked with, so that pickling
never changes what a kernel key describes. A reply's exception travels with its causes
(:func:`portable`); one that does not pickle whole travels as a ``RuntimeError`` naming its type,
and it is linked up again here (:func:`rebuilt`).
"""

from __future__ import annotations

import io
import itertools
import os
import pickle
import struct
from collections.abc import Callable
from typing import IO, Any

from ..exceptions import CompilerTraceback

_LENGTH = struct.Struct("<Q")
#: the exceptions of a cause chain carried back at most
_CHAIN = 16


def portable(error: BaseException) -> list[tuple[BaseException, list[str]]]:
    """``error`` and its causes, each with its notes, as they can be pickled: one that does
    not come back whole from pickling travels as a RuntimeError with its type and message."""
    chain: list[tuple[BaseException, list[str]]] = []
    seen: BaseException | None = error
    while seen is not None and len(chain) < _CHAIN:
        try:
            whole = type(pickle.loads(pickle.dumps(seen))) is type(seen)
        except Exception:  # any exception that does not pickle travels as its text
            whole = False
        kind = type(seen)
        copy = seen if whole else RuntimeError(f"{kind.__module__}.{kind.__qualname__}: {seen}")
        chain.append((copy, list(getattr(seen, "__notes__", ()))))
        seen = seen.__cause__
    return chain


def rebuilt(chain: list[tuple[BaseException, list[str]]], text: str) -> BaseException:
    """The exception the compiler process raised, its causes linked again, its traceback the
    innermost cause."""
    errors = [e for e, _ in chain]
    for error, notes in chain:
        if notes:  # as they were there (pickling may drop them)
            error.__notes__ = notes  # type: ignore[attr-defined]
    for outer, inner in itertools.pairwise(errors):
        outer.__cause__ = inner
    errors[-1].__cause__ = CompilerTraceback(f"in the compiler process:\n{text}")
    return errors[0]


#: types pickled as themselves (no class of theirs is touched by pickling)
_PLAIN = frozenset(
    {int, float, complex, bool, str, bytes, type(None), tuple, list, dict, set, frozenset}
)


def dumps(fn: Callable[..., Any], args: tuple[Any, ...]) -> tuple[bytes | None, list[Any]]:
    """A request: ``fn`` and ``args`` pickled (None if they do not pickle), and the objects
    it references. The arguments travel as their class and fields; plain data (numbers,
    strings, containers) as itself; every other object, ``fn`` included, by reference to the
    object the compiler process was forked with. Pickling by value would change what a kernel
    key describes: it caches ``__slotnames__`` on the class of each object it pickles."""
    refs: list[Any] = []
    out = io.BytesIO()
    try:
        Pickler(out, refs, args).dump((fn, args))
    except Exception:  # anything that does not pickle goes in memory, in a new process
        return None, refs
    return out.getvalue(), refs


def _instance(cls: Any, fields: dict[str, Any]) -> Any:
    """An object of class ``cls`` with ``fields`` (frozen dataclasses included)."""
    obj = cls.__new__(cls)
    obj.__dict__.update(fields)
    return obj


class Pickler(pickle.Pickler):
    def __init__(self, file: IO[bytes], refs: list[Any], copied: tuple[Any, ...]) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.refs = refs
        self.copied = copied

    def _copied(self, obj: Any) -> bool:
        return any(obj is c for c in self.copied) and hasattr(obj, "__dict__")

    def persistent_id(self, obj: Any) -> int | None:
        if type(obj) in _PLAIN or self._copied(obj):
            return None
        self.refs.append(obj)
        return id(obj)

    def reducer_override(self, obj: Any) -> Any:
        if self._copied(obj):
            return _instance, (type(obj), dict(vars(obj)))
        return NotImplemented


class Unpickler(pickle.Unpickler):
    def __init__(self, data: bytes, pinned: dict[int, Any]) -> None:
        super().__init__(io.BytesIO(data))
        self.pinned = pinned

    def persistent_load(self, pid: Any) -> Any:
        return self.pinned[pid]


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def write_message(fd: int, data: bytes) -> None:
    write_all(fd, _LENGTH.pack(len(data)) + data)


def _read_exactly(fd: int, size: int) -> bytes | None:
    parts, left = [], size
    while left:
        part = os.read(fd, min(left, 1 << 20))
        if not part:
            return None
        parts.append(part)
        left -= len(part)
    return b"".join(parts)


def read_message(fd: int) -> bytes | None:
    """One message from ``fd``; None if the pipe closed first."""
    head = _read_exactly(fd, _LENGTH.size)
    return None if head is None else _read_exactly(fd, _LENGTH.unpack(head)[0])
