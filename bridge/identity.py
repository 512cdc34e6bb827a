"""The compiler's identity, memoized across processes (see docs/bridge.md for its cost).

The identity digests what Triton's own ``triton_key()`` hashes (Triton's version and the contents
of every file it reads) with xxh3-128. It is memoized in the kernel cache (:mod:`bridge.memo`)
under the *file identity* of the installed Triton: the relative path, size and modification time
of each of those files, so reinstalling or editing Triton recomputes it. A backend whose
``hash()`` runs ptxas is memoized the same way, keyed by the ptxas files Triton would pick.
"""

from __future__ import annotations

import functools
import hashlib
import json
import operator
import os
import sysconfig
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from .memo import memoized
from .targets import Target

if TYPE_CHECKING:
    from kernelcache import Cache

_VERSION = 1


def _package_files(directory: str) -> Iterator[str]:
    """Python files of ``directory`` and of its sub-packages (directories with __init__.py)."""
    try:
        entries = sorted(os.scandir(directory), key=_entry_name)
    except OSError:
        return
    for entry in entries:
        if entry.is_dir(follow_symlinks=False):
            if os.path.exists(entry.path + os.sep + "__init__.py"):
                yield from _package_files(entry.path)
        elif entry.name.endswith(".py"):
            yield entry.path


_entry_name = operator.attrgetter("name")


def _stat_row(path: str, base: str) -> list[Any]:
    # (every path is under base: _triton_files joins them to it)
    name = path[len(base) + 1 :] if path.startswith(base + os.sep) else os.path.relpath(path, base)
    try:
        st = os.stat(path)
    except OSError:
        return [name, None, None]
    return [name, st.st_size, st.st_mtime_ns]


@functools.lru_cache(maxsize=1)
def _triton_files() -> tuple[str, tuple[str, ...]]:
    """Triton's directory and every file ``triton_key()`` reads (plus the ``__init__.py`` of
    the packages it walks)."""
    import triton

    base = os.path.dirname(os.path.abspath(triton.__file__))
    ext = sysconfig.get_config_var("EXT_SUFFIX").split(".")[-1]
    files = [
        os.path.join(base, "runtime", "cache.py"),
        os.path.join(base, "_C", f"libtriton.{ext}"),
    ]
    for sub in ("compiler", "backends", "language"):
        files.extend(_package_files(os.path.join(base, sub)))
    return base, tuple(files)


@functools.lru_cache(maxsize=1)
def triton_fingerprint() -> str:
    """A digest of the identity (path, size, mtime) of every file ``triton_key()`` reads
    (computed once per process)."""
    import triton

    base, files = _triton_files()
    skip = len(base) + 1
    rows: list[list[Any]] = []
    for path in files:  # (every path is under base: _triton_files joins them to it)
        try:
            st = os.stat(path)
        except OSError:
            rows.append([path[skip:], None, None])
            continue
        rows.append([path[skip:], st.st_size, st.st_mtime_ns])
    doc = json.dumps([_VERSION, triton.__version__, rows], separators=(",", ":"))
    return hashlib.sha256(doc.encode()).hexdigest()


def triton_digest() -> str:
    """xxh3-128 of Triton's version and of the contents of every file ``triton_key()`` reads
    (each with its relative path and size): what ``triton_key()`` hashes, with a faster hash."""
    import triton
    import xxhash

    base, files = _triton_files()
    h = xxhash.xxh3_128()
    h.update(f"{_VERSION}\0{triton.__version__}\0".encode())
    for path in files:
        h.update(f"{os.path.relpath(path, base)}\0".encode())
        try:
            with open(path, "rb") as f:
                h.update(f"{os.fstat(f.fileno()).st_size}\0".encode())
                for chunk in iter(lambda: f.read(1 << 22), b""):
                    h.update(chunk)
        except OSError as e:
            h.update(f"unreadable {e.errno}\0".encode())
    return h.hexdigest()


@functools.cache
def ptxas_fingerprint(target: Target) -> str:
    """A digest of what decides the identity of a backend whose ``hash()`` runs ptxas, for
    ``target``: the ptxas files Triton would pick."""
    from triton import knobs

    name = "ptxas_blackwell" if int(target.arch) >= 100 else "ptxas"
    tool = vars(type(knobs.nvidia))[name]  # the descriptor: environment key and default path
    configured = knobs.nvidia.__dict__.get(name) or knobs.getenv(tool.key)
    rows: list[Any] = [[configured]]
    for path in (configured, tool.default_path):
        if path:
            rows.append([*_stat_row(path, "/"), os.path.abspath(path)])
    doc = json.dumps([_VERSION, str(target), rows], separators=(",", ":"))
    return hashlib.sha256(doc.encode()).hexdigest()


_memo: dict[tuple[str, str], str] = {}


def triton_identity(cache: Cache | None) -> str:
    """The compiler's identity (:func:`triton_digest`), without computing it when the cache
    knows it."""
    fp = triton_fingerprint()
    found = _memo.get(("triton", fp))
    if found is None:
        found = _memo[("triton", fp)] = memoized(cache, "triton_files", fp, triton_digest)
    return found


def backend_identity(cache: Cache | None, target: Target, backend: Any) -> str:
    """``backend.hash()`` for ``target``; where it runs ptxas, memoized by the ptxas files'
    identity."""
    if not target.vendor.hash_runs_ptxas:
        return str(backend.hash())
    fp = ptxas_fingerprint(target)
    found = _memo.get(("ptxas", fp))
    if found is None:
        found = _memo[("ptxas", fp)] = memoized(
            cache, f"backend:{target}", fp, lambda: str(backend.hash())
        )
    return found
