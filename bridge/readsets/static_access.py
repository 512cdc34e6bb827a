"""Reading an object's items, and calling the built-ins kernel code is offered, without running
code of the program: what a check of a stored read set (:mod:`.read_sets`) may do with
whatever its reads find, and what the witness (:mod:`.frontend_hooks`) compares each read it
records with (attributes: :mod:`.namespaces`).

An item is read only of a tuple, list or dict whose keys are plain; ``getattr`` and
``hasattr`` read as :func:`~bridge.identity.static_reads.attribute` does, ``isinstance`` only of a class that
checks by its bases, the rest only on plain values, their result bounded. Where that cannot be,
the read finds :data:`~bridge.identity.static_reads.RUNS_CODE` and no code runs.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Sequence
from typing import Any

from ..entries.metadata import BUILTIN_NAMES, LOOKUPS
from ..identity.exact_values import triton_home
from ..identity.namespaces import exact, language, unwrap
from ..identity.static_reads import RUNS_CODE, attribute, one_of, own_class

#: the built-ins Triton's code generator offers kernel code, by name
BUILTINS: dict[str, Callable[..., Any]] = {n: vars(builtins)[n] for n in BUILTIN_NAMES}
#: the most items a built-in's result holds (``range``, ``list``) or a dict read holds
MAX_RESULT = 4096


def item(value: Any, key: Any) -> Any:
    """``value[key]`` for a tuple, list or dict whose keys are plain (nothing else is read:
    :data:`RUNS_CODE`)."""
    kind = type(value)
    if one_of(kind, (tuple, list, language().tuple)) and one_of(type(key), (int, bool)):
        return value.values[key] if kind is language().tuple else value[key]
    if kind is dict and exact(key) is not None and len(value) <= MAX_RESULT:
        if all(one_of(type(k), (int, str, bool, float, bytes, type(None))) for k in value):
            return value[key]
    return RUNS_CODE


def builtin(name: str, args: Sequence[Any]) -> Any:
    """The built-in ``name`` of :data:`BUILTINS` on ``args`` (unwrapped), made without running
    code of the program: ``getattr`` and ``hasattr`` read as :func:`~.attribute` does,
    ``isinstance`` only of a class that checks by its bases, and the rest only on plain values,
    their result bounded (:data:`MAX_RESULT` items). :data:`RUNS_CODE` where that cannot
    be."""
    args = [unwrap(a) for a in args]
    if name in LOOKUPS:
        if len(args) < 2 or type(args[1]) is not str:
            return RUNS_CODE  # (a name only: any other key would be hashed, and compared)
        try:
            found = attribute(args[0], args[1])
        except AttributeError:
            if name == "hasattr":
                return False
            if len(args) > 2:
                return args[2]
            raise
        return RUNS_CODE if found is RUNS_CODE else (True if name == "hasattr" else found)
    if name == "isinstance":
        kinds = args[1] if type(args[1]) is tuple else (args[1],)
        if not all(type(k) is type or _triton_class(k) for k in kinds):
            return RUNS_CODE  # (a metaclass's own ``__instancecheck__``: an ABC, an Enum...)
        if not own_class(args[0]):
            return RUNS_CODE  # (isinstance would ask the object for its class)
        return issubclass(type(args[0]), kinds)
    if any(exact(a) is None for a in args):
        return RUNS_CODE
    if name == "range":
        made = range(*args)
        return made if len(made) <= MAX_RESULT else RUNS_CODE
    return BUILTINS[name](*args)


def _triton_class(value: Any) -> bool:
    return issubclass(type(value), type) and triton_home(value) is not None
