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
filesystems) or not had within :data:`LOCK_WAIT` (anyone who may read the file may hold it),
lines are still whole, and duplicates are removed when the manifest is read; nor does a writer
read more than :data:`MAX_CATCH_UP` bytes of what others appended.

A kernel that another process cannot import (:mod:`bridge.call.importable`) is still recorded,
marked ``"importable": false`` with the reason, and reported once per process with a warning
that says what to do. Values are recorded as :mod:`bridge.call.plain` writes them.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import stat
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kernelcache.plugin import flock_by, load_json, warn_once

if TYPE_CHECKING:
    from ..call.binding import Bound
    from ..call.tracing import CallSpec
    from ..settings import BridgeSettings
    from ..vendors.targets import Target

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


def build(
    call: CallSpec, target: Target, key: str, bound: Bound, grid: tuple[int, int, int]
) -> dict[str, Any]:
    """The lowering's own fields of the record of one lowered variant (see :func:`complete`
    for the rest)."""
    from ..call.plain import plain
    from ..call.tracing import leaf_arrays

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

    from ..call.importable import located
    from ..vendors.targets import parse_target
    from ..versions import triton_version

    out = dict(record)
    out.setdefault("version", RECORD_VERSION)
    where = located(str(record["kernel"]))
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


#: the most bytes one append reads of what others appended (a manifest is shared: a sparse
#: terabyte of it must cost nothing)
MAX_CATCH_UP = 64 << 20
#: how long an append waits for the manifest's lock (anyone who may read it may hold it)
LOCK_WAIT = 2.0

_files: dict[str, _Seen] = {}
_file_lock = threading.Lock()


def _ident(rec: Any) -> tuple[str, str, str] | None:
    """What makes a record new: its kernel key, target and import path."""
    if isinstance(rec, dict) and isinstance(rec.get("key"), str):
        return rec["key"], str(rec.get("target")), str(rec.get("kernel"))
    return None


def _catch_up(fd: int, seen: _Seen, st: os.stat_result) -> None:
    """Read what was appended since ``seen.offset`` (all of it if the file was replaced); more
    than :data:`MAX_CATCH_UP` bytes is not read but passed over (a record this process then
    writes again is a duplicate, which readers drop)."""
    if seen.ident != (st.st_dev, st.st_ino) or st.st_size < seen.offset:
        seen.ident, seen.offset, seen.records = (st.st_dev, st.st_ino), 0, set()
    if st.st_size == seen.offset:
        return
    if st.st_size - seen.offset > MAX_CATCH_UP:
        seen.offset = st.st_size
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
        # (had within LOCK_WAIT, or not: anyone who may read the file may hold its lock, and
        # the line is then written without it: lines stay whole, readers drop duplicates)
        flock_by(fd, time.monotonic() + LOCK_WAIT, poll=0.01)
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
