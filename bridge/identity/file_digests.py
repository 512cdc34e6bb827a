"""Digests of files by content, memoized per process by the file's identity (:func:`file_digest`:
path, size and modification time), and the digest installed code is trusted by
(:func:`installed_digest`).

Invariant: installed code is never trusted beyond what was digested. Its description holds the
digest of the file that defines its module, that module's own file, read from the filesystem;
a module with no such file (imported from a zip archive, a namespace package, a module made at
run time, one that is not loaded) has no digest, and code that reaches it is undescribable (the
kernel is open: keyed by the IR its frontend produces).
"""

from __future__ import annotations

import functools
import hashlib
import os
import sys
import zipimport
from typing import Any

from ..exceptions import Undescribable


@functools.lru_cache(maxsize=1024)
def file_digest(path: str, size: int, mtime_ns: int) -> str:
    """sha256 of a file's content, memoized per process by its identity (path, size and
    modification time)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def installed_digest(module: str) -> str:
    """The digest of the file that defines the installed module ``module``: its own file (a
    package's file holds none of its submodules' code, and a portion of a namespace package
    is a module of its own), read from the filesystem.

    Raises:
        Undescribable: there is no such file to read (see :func:`_no_digest`): the module's
            code would be trusted beyond what was digested (the message names the module and
            why).
    """
    found = sys.modules.get(module)
    path = getattr(found, "__file__", None)
    if isinstance(path, str):
        try:
            st = os.stat(path)
            return file_digest(path, st.st_size, st.st_mtime_ns)
        except OSError:
            pass
    raise Undescribable(
        f"it reaches code of the installed module {module}, which {_no_digest(found, path)}: "
        "installed code is trusted only by the digest of its file"
    )


def _no_digest(found: Any, path: Any) -> str:
    """Why the module ``found`` (None where it is not loaded), of ``__file__`` ``path``, has no
    file to digest."""
    if found is None:
        return "is not loaded (its code cannot be found by its name)"
    if not isinstance(path, str):
        return "has no file of its own (a namespace package, or a module made at run time)"
    loader = getattr(getattr(found, "__spec__", None), "loader", None)
    if isinstance(loader, zipimport.zipimporter):
        return "was imported from a zip archive, whose members are no files to digest"
    return "has a file that cannot be read"
