"""The record seam: every specialization the bridge lowers, as a plain JSON-able dict.

Each lowered variant is offered to the registered listeners and, when ``$KERNELCACHE_RECORD``
names a file, appended to it as one JSON line (once per kernel key and target per process).
A record holds what is needed to compile the same kernel again for another target without the
program that lowered it: the kernel's import path, the abstract call (array dtypes and shapes,
scalars, constexprs), the options the call set, the autotune config, and, for reference, the
specialization Triton derived for the recorded target.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable, Mapping
from typing import Any

logger = logging.getLogger(__name__)

RECORD_VERSION = 1
Listener = Callable[[dict[str, Any]], None]

_listeners: list[Listener] = []
_written: set[tuple[str, str, str]] = set()
_lock = threading.Lock()


def add_listener(listener: Listener) -> Callable[[], None]:
    """Call ``listener(record)`` for every specialization lowered from now on; returns a
    function that removes it."""
    with _lock:
        _listeners.append(listener)

    def remove() -> None:
        with _lock:
            if listener in _listeners:
                _listeners.remove(listener)

    return remove


def plain(value: Any) -> Any:
    """``value`` as JSON data: arrays as ``{"array": dtype, "shape": [...]}``, dtypes and
    JIT functions by name, tuples as lists, anything else by ``repr``."""
    from .binding import ArgArray

    if isinstance(value, ArgArray):
        return {"array": value.jax_dtype.name, "shape": list(value.shape)}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (tuple, list)):
        return [plain(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    fn = getattr(value, "fn", None)
    if fn is not None and hasattr(value, "cache_key"):
        return {"jit": f"{fn.__module__}:{fn.__qualname__}"}
    inner = getattr(value, "value", None)
    if type(value).__name__ == "constexpr":
        return plain(inner)
    if type(value).__name__ == "dtype" and hasattr(value, "name"):
        return {"dtype": str(value.name)}
    return {"repr": repr(value)}


def emit(record: dict[str, Any], cfg: Any = None) -> None:
    """Hand ``record`` to the listeners and to the ``$KERNELCACHE_RECORD`` manifest."""
    from kernelcache.config import settings

    with _lock:
        listeners = list(_listeners)
    for listener in listeners:
        listener(record)
    path = (cfg or settings()).record
    if path is None:
        return
    ident = (str(path), record["key"], record["target"])
    with _lock:
        if ident in _written:
            return
        _written.add(ident)
    line = (json.dumps(record, sort_keys=True, separators=(",", ":")) + "\n").encode()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o666)
        try:
            os.write(fd, line)  # one write with O_APPEND: lines from processes never interleave
        finally:
            os.close(fd)
    except OSError as e:
        logger.warning("kernelcache: cannot append to the record file %s: %s", path, e)
