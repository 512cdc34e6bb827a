"""The compiler's identity, memoized across processes (see docs/bridge.md for its cost).

The identity digests what Triton's own ``triton_key()`` hashes (Triton's version and the contents
of every file it reads) with xxh3-128. It is memoized in the kernel cache (:mod:`bridge.entries.memos`)
under the *file identity* of the installed Triton: the relative path, size and modification time
of each of those files, so reinstalling or editing Triton recomputes it. A backend whose
``hash()`` reads more (ptxas on CUDA) is memoized the same way, keyed by the fingerprint its
vendor gives (:meth:`~bridge.vendors.vendor.Vendor.backend_fingerprint`).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import sysconfig
from typing import TYPE_CHECKING, Any

from ..entries.memos import memoized
from ..vendors.targets import Target
from ..vendors.vendor import file_row

if TYPE_CHECKING:
    from kernelcache import Cache

_VERSION = 1


def _package_rows(directory: str, package: str, rows: list[list[Any]]) -> None:
    """Append the rows (:func:`~bridge.vendors.vendor.file_row`) of the Python files of ``package`` (at
    ``directory``) and of its sub-packages (directories with ``__init__.py``, as
    ``pkgutil.walk_packages`` finds them; not ``__pycache__``, which never is one), in name
    order."""
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return
    sep = os.sep
    for name in names:
        if name.endswith(".py"):
            rows.append(file_row(directory + sep + name, package + sep + name))
        elif name != "__pycache__" and name.isidentifier():
            path = directory + sep + name
            if os.path.exists(path + sep + "__init__.py"):
                _package_rows(path, package + sep + name, rows)


def _triton_rows() -> tuple[str, list[list[Any]]]:
    """Triton's directory, and the row (:func:`~bridge.vendors.vendor.file_row`) of every file ``triton_key()``
    reads (plus the ``__init__.py`` of the packages it walks); one pass over the files."""
    import triton

    base = os.path.dirname(os.path.abspath(triton.__file__))
    ext = sysconfig.get_config_var("EXT_SUFFIX").split(".")[-1]
    rows = [
        file_row(os.path.join(base, name), name)
        for name in (os.path.join("runtime", "cache.py"), os.path.join("_C", f"libtriton.{ext}"))
    ]
    for package in ("compiler", "backends", "language"):
        _package_rows(os.path.join(base, package), package, rows)
    return base, rows


def _triton_files() -> tuple[str, tuple[str, ...]]:
    """Triton's directory and every file ``triton_key()`` reads (see :func:`_triton_rows`)."""
    base, rows = _triton_rows()
    return base, tuple(os.path.join(base, row[0]) for row in rows)


def _library_rows(base: str) -> list[list[Any]]:
    """The rows of the libraries the backends link kernels with (``backends/*/lib``: libdevice,
    the ROCm device libraries): options name them, and a kernel key holds their content."""
    rows: list[list[Any]] = []
    backends = os.path.join(base, "backends")
    try:
        vendors = sorted(os.listdir(backends))
    except OSError:
        return rows
    for vendor in vendors:
        lib = os.path.join(backends, vendor, "lib")
        try:
            names = sorted(os.listdir(lib))
        except OSError:
            continue
        rows += [file_row(os.path.join(lib, n), os.path.join(vendor, "lib", n)) for n in names]
    return rows


@functools.lru_cache(maxsize=1)
def triton_fingerprint() -> str:
    """A digest of the identity (path, size, mtime) of every file ``triton_key()`` reads and of
    the backends' device libraries (computed once per process)."""
    import triton

    base, rows = _triton_rows()
    doc = [_VERSION, triton.__version__, rows, _library_rows(base)]
    return hashlib.sha256(json.dumps(doc, separators=(",", ":")).encode()).hexdigest()


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
    """``backend.hash()`` for ``target``; where the vendor names what it reads besides Triton's
    files (:meth:`~bridge.vendors.vendor.Vendor.backend_fingerprint`: ptxas on CUDA), memoized
    under that."""
    fp = target.vendor.backend_fingerprint(target.arch)
    if fp is None:
        return str(backend.hash())
    found = _memo.get(("backend", fp))
    if found is None:
        found = _memo[("backend", fp)] = memoized(
            cache, f"backend:{target}", fp, lambda: str(backend.hash())
        )
    return found
