"""The record seam: every specialization the bridge lowers, as a plain JSON-able dict.

Each lowered variant is offered to the registered listeners and, when ``$KERNELCACHE_RECORD``
names a file, appended to that manifest as one JSON line. A record holds what is needed to
compile the same kernel again for another target without the program that lowered it: the
kernel's import path (``module:qualname``), the abstract call (array dtypes and shapes, scalars,
constexprs), the options the call set, the autotune config, the recording target and, for
reference, the specialization Triton derived for it. See docs/warm.md for every field.

Across processes: any number of processes may append to one manifest at once. Each line is
written with a single ``write`` on an ``O_APPEND`` descriptor while holding an exclusive
``flock`` on the file, so lines never interleave or tear; under the lock the writer reads what
other processes appended since it last looked and skips a record the file already has (same
kernel key, target and import path). Where ``flock`` is unavailable (some network
filesystems) lines are still whole, and duplicates are removed when the manifest is read.

A kernel that another process cannot import (defined inside a function, in the ``__main__`` of a
script run as a file, or in a module that is not importable from ``sys.path``) is still
recorded, marked ``"importable": false`` with the reason, and reported once per process with a
warning that says what to do.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import importlib.machinery
import json
import logging
import os
import stat
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kernelcache.jsonio import load_json
from kernelcache.process import warn_once

if TYPE_CHECKING:
    from ..call.binding import Bound
    from ..call.tracing import CallSpec
    from ..settings import BridgeSettings
    from ..targets import Target

logger = logging.getLogger(__name__)

#: format version of a record (one manifest line); readers refuse newer versions
RECORD_VERSION = 1
Listener = Callable[[dict[str, Any]], None]

#: parameter names (case-insensitive, underscores ignored) that carry the target's warp size
WARP_SIZE_NAMES = frozenset({"warpsize", "threadsperwarp", "wavesize", "wavefrontsize"})

_listeners: list[Listener] = []
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
    """``value`` as JSON data: arrays as ``{"array": dtype, "shape": [...]}``, tensor
    descriptors as ``{"tensordesc": {...}}``, dtypes and JIT functions by name, tuples as lists,
    anything else by ``repr``."""
    from ..call.binding import ArgArray

    if isinstance(value, ArgArray):
        return {"array": value.jax_dtype.name, "shape": list(value.shape)}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (tuple, list)):
        return [plain(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    base = getattr(value, "base", None)
    if isinstance(base, ArgArray) and hasattr(value, "block_shape"):  # a tensor descriptor
        desc = {
            "base": plain(base),
            "shape": [int(d) for d in value.shape],
            "strides": [int(d) for d in value.strides],
            "block_shape": [int(d) for d in value.block_shape],
            "padding": str(value.padding),
            "round_f32_to_tf32": bool(getattr(value, "round_f32_to_tf32", False)),
        }
        if hasattr(value, "layout"):  # Gluon's, recorded by repr
            desc["layout"] = plain(value.layout)
        return {"tensordesc": desc}
    fn = getattr(value, "fn", None)
    if fn is not None and hasattr(value, "cache_key"):
        return {"jit": f"{fn.__module__}:{fn.__qualname__}"}
    inner = getattr(value, "value", None)
    if type(value).__name__ == "constexpr":
        return plain(inner)
    if type(value).__name__ == "dtype" and hasattr(value, "name"):
        return {"dtype": str(value.name)}
    return {"repr": repr(value)}


def source_digest(fn: Any) -> str:
    """sha256 of a kernel function's source text as Triton parses it (decorators excluded)."""
    return hashlib.sha256(str(fn.src).encode()).hexdigest()


def warp_size_params(arguments: Mapping[str, Any], warp_size: int) -> dict[str, str]:
    """Constexpr arguments that carry the recording target's warp size, by name.

    A parameter named ``WARP_SIZE``, ``THREADS_PER_WARP``, ``WAVE_SIZE`` or
    ``WAVEFRONT_SIZE`` (any case, underscores ignored) whose recorded value equals the
    recording target's warp size follows the target: warming for another target passes that
    target's warp size instead (Gluon layouts must match it).
    """
    return {
        name: "warp_size"
        for name, value in arguments.items()
        if name.replace("_", "").lower() in WARP_SIZE_NAMES
        and type(value) is int
        and value == warp_size
    }


# -- can another process import the kernel? -----------------------------------------------
@dataclass(frozen=True)
class Located:
    """Where a recorded kernel can be imported from, as far as this process can tell."""

    path: str  # module:qualname under which another process imports it
    importable: bool
    problem: str | None = None
    source: str | None = None  # source_digest of the kernel function, when it was found


def _spec_on_path(name: str) -> Any:
    """The spec that a fresh import of top-level module ``name`` would find, or None."""
    with contextlib.suppress(ImportError, ValueError, AttributeError):
        spec = importlib.machinery.PathFinder.find_spec(name)
        if spec is not None:
            return spec
    for finder in sys.meta_path:
        if finder is importlib.machinery.PathFinder:
            continue
        find = getattr(finder, "find_spec", None)
        if find is None:
            continue
        try:
            spec = find(name, None)
        except (ImportError, ValueError, AttributeError, TypeError):
            continue
        if spec is not None:
            return spec
    return None


def _same_file(a: str | None, b: str | None) -> bool:
    if not a or not b:
        return False
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def _module_problem(module_name: str, module: Any) -> str | None:
    """Why a fresh process could not import ``module_name`` the way this one did, or None."""
    top_name = module_name.split(".")[0]
    top = sys.modules.get(top_name)
    spec = _spec_on_path(top_name)
    if spec is None:
        where = getattr(module, "__file__", None) or "(no file)"
        return (
            f"module {module_name} (loaded from {where}) cannot be imported from sys.path: "
            f"put its directory on PYTHONPATH where you warm, or install it as a package"
        )
    loaded = getattr(getattr(top, "__spec__", None), "origin", None) or getattr(
        top, "__file__", None
    )
    if spec.origin not in (None, "namespace") and loaded and not _same_file(spec.origin, loaded):
        return (
            f"module {top_name} was loaded from {loaded}, but importing it from sys.path finds "
            f"{spec.origin}: warm from an environment where the kernel's module is found first"
        )
    return None


def locate(path: str) -> Located:
    """Check that ``module:qualname`` names a kernel another process can import.

    Only this process's ``sys.modules`` and the import system's finders are consulted:
    nothing is imported or executed.
    """
    module_name, _, qualname = path.partition(":")
    if not qualname or "<locals>" in qualname or "<lambda>" in qualname:
        return Located(
            path,
            False,
            f"{path} is defined inside a function: another process cannot import it; "
            "define the kernel at module level",
        )
    module = sys.modules.get(module_name)
    if module_name == "__main__":
        spec = getattr(module, "__spec__", None)
        name = getattr(spec, "name", None)
        if not name or name == "__main__":
            script = getattr(module, "__file__", None) or "an interactive session"
            return Located(
                path,
                False,
                f"{path} is defined in {script}, which runs as __main__: another process "
                "cannot import it without running it; move the kernel into a module that "
                "the script imports",
                _source_of(module, qualname),
            )
        module_name = name  # `python -m pkg.mod`: importable as pkg.mod
        path = f"{name}:{qualname}"
    elif module is None:
        return Located(path, False, f"module {module_name} of {path} is not loaded")
    found = _source_of(module, qualname)
    if found is None:
        return Located(
            path,
            False,
            f"{path} cannot be found by name in module {module_name}: define the kernel at "
            "module level under the name it is defined with",
        )
    problem = _module_problem(module_name, module)
    return Located(path, problem is None, problem, found)


def _source_of(module: Any, qualname: str) -> str | None:
    obj = module
    try:
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except AttributeError:
        return None
    while hasattr(obj, "fn") and not hasattr(obj, "src"):  # autotune / heuristics layers
        obj = obj.fn
    return source_digest(obj) if hasattr(obj, "src") else None


_located: dict[str, Located] = {}


def _locate_memo(path: str) -> Located:
    found = _located.get(path)
    if found is None:
        try:
            found = locate(path)
        except (OSError, ValueError, TypeError, AttributeError, ImportError) as e:
            found = Located(path, False, f"could not check whether {path} can be imported: {e}")
        _located[path] = found
    return found


# -- the record as written ----------------------------------------------------------------
def build(
    call: CallSpec, target: Target, key: str, bound: Bound, grid: tuple[int, int, int]
) -> dict[str, Any]:
    """The lowering's own fields of the record of one lowered variant (see :func:`complete`
    for the rest)."""
    from ..call.arguments import leaf_arrays

    return {
        "version": RECORD_VERSION,
        "kernel": call.parts.qualname,
        "language": call.parts.language,
        "target": str(target),
        "key": key,
        "arguments": plain(dict(call.named)),
        "kwargs": plain(dict(call.kwargs)),
        "options": plain(dict(call.options)),
        "config": bound.variant.description,
        "variant": {
            "kwargs": plain(dict(bound.variant.kwargs)),
            "options": plain(dict(bound.variant.options)),
            **({"args": plain(dict(bound.variant.args))} if bound.variant.args else {}),
        },
        "signature": plain(dict(bound.signature)),
        "constexprs": {",".join(map(str, k)): plain(v) for k, v in bound.constexprs.items()},
        "grid": list(grid),
        "outputs": [
            name
            for name in call.parts.arg_names
            if any(a.slot[0] == "out" for a in leaf_arrays(call.named.get(name)))
        ],
    }


def _opaque(value: Any) -> bool:
    """Whether a plain value holds something recorded only by its ``repr``."""
    if isinstance(value, list):
        return any(_opaque(v) for v in value)
    if isinstance(value, dict):
        return "repr" in value or any(_opaque(v) for v in value.values())
    return False


def complete(record: Mapping[str, Any], *, warn: bool = True) -> dict[str, Any]:
    """``record`` with what a manifest needs besides the lowering's own fields: the
    importable path and whether another process can import it (with the reason if not), the
    kernel's source digest, the arguments that follow the target's warp size, and the
    producer versions. With ``warn``, a record that cannot be warmed (a kernel another process
    cannot import, an argument recorded only by its ``repr``) is reported with one warning
    per kernel and process."""
    from kernelcache import __version__

    from ..targets import parse_target
    from ..versions import triton_version

    out = dict(record)
    out.setdefault("version", RECORD_VERSION)
    where = _locate_memo(str(record["kernel"]))
    out["kernel"] = where.path
    out["importable"] = where.importable
    problem = where.problem
    arguments = record.get("arguments") or {}
    opaque = sorted(name for name, value in arguments.items() if _opaque(value))
    if problem is None and opaque:
        problem = (
            f"argument(s) {', '.join(opaque)} of {where.path} can only be recorded by their "
            "repr, so warm cannot rebuild this call: pass arrays, scalars, tuples, dtypes or "
            "JIT functions"
        )
    if problem:
        out["problem"] = problem
    out["source"] = where.source
    warp_size = parse_target(str(record["target"])).warp_size
    out["target_params"] = warp_size_params(arguments, warp_size)
    out["producer"] = {"triton": triton_version(), "kernelcache": __version__}
    if warn and problem:
        warn_once(
            logger,
            ("unwarmable", where.path),
            "kernelcache: recorded %s, but it cannot be warmed: %s",
            where.path,
            problem,
        )
    return out


def wanted(cfg: BridgeSettings | None = None) -> bool:
    """Whether a lowered variant goes anywhere: a listener is registered or
    ``$KERNELCACHE_RECORD`` is set (else the lowering does not build its record)."""
    from ..settings import settings

    if _listeners:  # (a list's truth is read atomically: the lock guards its changes)
        return True
    return (cfg or settings()).record is not None


def emit(record: dict[str, Any], cfg: BridgeSettings | None = None) -> None:
    """Hand ``record`` to the listeners and to the ``$KERNELCACHE_RECORD`` manifest."""
    from ..settings import settings

    with _lock:
        listeners = list(_listeners)
    path = (cfg or settings()).record
    if path is None and not listeners:
        return
    full = complete(record, warn=path is not None)  # listeners alone warm nothing
    for listener in listeners:
        listener(full)
    if path is not None:
        append(path, full)


# -- appending to a manifest ----------------------------------------------------------------
@dataclass
class _Seen:
    """What this process knows a manifest holds: its identity, how far it was read, and the
    (key, target, kernel) of every record in it."""

    ident: tuple[int, int] = (0, 0)
    offset: int = 0
    records: set[tuple[str, str, str]] = field(default_factory=set)
    broken: bool = False  # could not be written: warned once, recording to it stops


_files: dict[str, _Seen] = {}
_file_lock = threading.Lock()


def _ident(rec: Any) -> tuple[str, str, str] | None:
    """What makes a record new: its kernel key, target and import path."""
    if isinstance(rec, dict) and isinstance(rec.get("key"), str):
        return rec["key"], str(rec.get("target")), str(rec.get("kernel"))
    return None


def _catch_up(fd: int, seen: _Seen, st: os.stat_result) -> None:
    """Read what was appended since ``seen.offset`` (all of it if the file was replaced)."""
    if seen.ident != (st.st_dev, st.st_ino) or st.st_size < seen.offset:
        seen.ident, seen.offset, seen.records = (st.st_dev, st.st_ino), 0, set()
    if st.st_size == seen.offset:
        return
    data = os.pread(fd, st.st_size - seen.offset, seen.offset)
    end = data.rfind(b"\n") + 1  # only complete lines; a torn tail is skipped, not parsed
    for line in data[:end].splitlines():
        with contextlib.suppress(ValueError):
            ident = _ident(load_json(line))
            if ident is not None:
                seen.records.add(ident)
    seen.offset += end


def append(path: str | os.PathLike[str], record: Mapping[str, Any]) -> bool:
    """Append ``record`` to the manifest at ``path`` unless it already holds it.

    Returns whether a line was written. Safe with any number of processes and threads
    appending at once (see the module docstring). Errors are logged once per file, never
    raised: recording never fails the job.
    """
    ident = _ident(record)
    line = (json.dumps(record, sort_keys=True, separators=(",", ":")) + "\n").encode()
    name = os.path.abspath(os.fspath(path))
    with _file_lock:
        seen = _files.setdefault(name, _Seen())
        if seen.broken:
            return False
        if ident is not None and ident in seen.records and _unchanged(name, seen):
            return False
        try:
            return _append_locked(name, seen, ident, line)
        except OSError as e:
            seen.broken = True
            logger.warning(
                "kernelcache: cannot append to the record file %s: %s; recording to it stops",
                name,
                e.strerror or e,
            )
            return False


def _unchanged(name: str, seen: _Seen) -> bool:
    """Whether the file is still the one ``seen`` describes (not replaced or truncated)."""
    try:
        st = os.stat(name)
    except OSError:
        return False
    return seen.ident == (st.st_dev, st.st_ino) and st.st_size >= seen.offset


def _append_locked(name: str, seen: _Seen, ident: tuple[str, str, str] | None, line: bytes) -> bool:
    Path(name).parent.mkdir(parents=True, exist_ok=True)
    flags = os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NONBLOCK
    fd = os.open(name, flags, 0o666)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:
            pass  # no flock here: lines stay whole (O_APPEND); readers drop duplicates
        st = os.fstat(fd)
        _catch_up(fd, seen, st)
        if ident is not None and ident in seen.records:
            return False
        if st.st_size and os.pread(fd, 1, st.st_size - 1) != b"\n":
            line = b"\n" + line  # a writer died mid-line: keep our record on a line of its own
        written = os.write(fd, line)  # one write with O_APPEND: never interleaved
        if written != len(line):
            raise OSError(errno.ENOSPC, f"short write ({written} of {len(line)} bytes)")
        if ident is not None:
            seen.records.add(ident)
        after = os.fstat(fd)
        if after.st_size == st.st_size + len(line):  # nobody else appended meanwhile
            seen.offset = after.st_size
        return True
    finally:
        os.close(fd)  # releases the lock
