"""The compiler's identity, memoized across processes.

Triton keys its own cache with ``triton_key()``: a sha256 of Triton's version, its Python
sources and libtriton (~400 MB), about 0.3 s per process. The bridge's identity is a digest of
the same ingredients (the version and the contents of every file ``triton_key()`` reads) with
xxh3-128, about a tenth of that: what a process pays on a cold cache. It is stored in the kernel
cache under a key derived from the *file identity* of the installed Triton: the relative path,
size and modification time of each of those files. Reinstalling or editing Triton changes that
fingerprint and the identity is recomputed; an unchanged installation costs a few hundred
``stat`` calls.

The CUDA backend's identity (``backend.hash()``) runs ``ptxas --version``; it is memoized the
same way, keyed by the ptxas files Triton would pick.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import sysconfig
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from .targets import Target

if TYPE_CHECKING:
    from kernelcache import Cache

logger = logging.getLogger(__name__)

#: artifact extension of memoized identities in the kernel cache
IDENTITY_EXT = "ident"
_VERSION = 1


def _package_files(directory: str) -> Iterator[str]:
    """Python files of ``directory`` and of its sub-packages (directories with __init__.py)."""
    try:
        entries = sorted(os.scandir(directory), key=lambda e: e.name)
    except OSError:
        return
    for entry in entries:
        if entry.is_dir(follow_symlinks=False):
            if os.path.exists(os.path.join(entry.path, "__init__.py")):
                yield from _package_files(entry.path)
        elif entry.name.endswith(".py"):
            yield entry.path


def _stat_row(path: str, base: str) -> list[Any]:
    try:
        st = os.stat(path)
    except OSError:
        return [os.path.relpath(path, base), None, None]
    return [os.path.relpath(path, base), st.st_size, st.st_mtime_ns]


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
    rows = [_stat_row(p, base) for p in files]
    doc = json.dumps([_VERSION, triton.__version__, rows], separators=(",", ":"))
    return hashlib.sha256(doc.encode()).hexdigest()


def triton_digest() -> str:
    """xxh3-128 of Triton's version and of the contents of every file ``triton_key()`` reads
    (each with its relative path and size): what ``triton_key()`` hashes, ~10x faster."""
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
    """A digest of what decides the CUDA backend's identity for ``target``: its ptxas files."""
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


def _memo_key(label: str, fingerprint: str) -> str:
    return hashlib.sha256(f"bridge-identity:{label}:{fingerprint}".encode()).hexdigest()


def lookup(cache: Cache | None, label: str, fingerprint: str) -> str | None:
    """The value memoized in ``cache`` (or None) under ``(label, fingerprint)``, if any."""
    if cache is None:
        return None
    art = cache.get(_memo_key(label, fingerprint), IDENTITY_EXT)
    if art is None:
        return None
    try:
        return art.data.decode()
    except UnicodeDecodeError:
        return None


def remember(cache: Cache | None, label: str, fingerprint: str, value: str) -> None:
    """Memoize ``value`` in ``cache`` under ``(label, fingerprint)``; failures are logged only."""
    from kernelcache import CacheError

    if cache is None:
        return
    try:
        cache.put(
            _memo_key(label, fingerprint),
            IDENTITY_EXT,
            value.encode(),
            {"kind": "identity", "name": label},
        )
    except (CacheError, ValueError) as e:
        logger.debug("cannot memoize the %s identity: %s", label, e)


def _memoized(cache: Cache | None, label: str, fingerprint: str, compute: Callable[[], str]) -> str:
    """``compute()``, stored in ``cache`` under a key derived from ``(label, fingerprint)``.

    Cache failures only cost the recomputation; they are logged, never raised.
    """
    known = lookup(cache, label, fingerprint)
    if known is not None:
        return known
    value = compute()
    remember(cache, label, fingerprint, value)
    return value


_memo: dict[tuple[str, str], str] = {}


def triton_identity(cache: Cache | None) -> str:
    """The compiler's identity (:func:`triton_digest`), without computing it when the cache
    knows it."""
    fp = triton_fingerprint()
    found = _memo.get(("triton", fp))
    if found is None:
        found = _memo[("triton", fp)] = _memoized(cache, "triton_files", fp, triton_digest)
    return found


def backend_identity(cache: Cache | None, target: Target, backend: Any) -> str:
    """``backend.hash()`` for ``target``; on CUDA memoized by the ptxas files' identity."""
    if target.backend != "cuda":
        return str(backend.hash())
    fp = ptxas_fingerprint(target)
    found = _memo.get(("ptxas", fp))
    if found is None:
        found = _memo[("ptxas", fp)] = _memoized(
            cache, f"backend:{target}", fp, lambda: str(backend.hash())
        )
    return found


@functools.lru_cache(maxsize=256)
def file_digest(path: str, size: int, mtime_ns: int) -> str:
    """sha256 of a file's content, memoized per process by its identity."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
