"""The one contract of an entry: what every door checks before data enters a root, and what a
read checks before an entry is served.

An entry of extension ``ext`` is whole when its document holds the launch metadata ``ext``
requires, covered by its digest (:func:`~kernelcache.schema.launch.launch_problem`), and its
artifact is whole for ``ext`` (:func:`kernelcache.formats.problem`: a cubin is a whole ELF64
file for NVIDIA CUDA, an HSACO one for AMD GPUs, PTX defines the kernel its metadata names and
a body for every function it calls). :func:`entry_problem` is that contract; it applies whether
or not a package built on kernelcache (the bridge) is imported.

Who calls it:

* :meth:`kernelcache.store.Store.publish`, through :func:`require_whole`: ``Cache.put``,
  ``Cache.replace``, every build of ``get_or_create``, a remote hit published locally, and every
  entry a bundle import publishes. A problem is an :class:`~kernelcache.errors.IncompleteEntry`
  (a ``ValueError``) and nothing is written. ``Cache.put`` on a disabled cache checks the same.
* :meth:`~kernelcache.store.Store.inspect` with ``whole`` (``kernelcache verify``, its
  ``--repair``, ``kernelcache export``): a problem is a corrupt entry.
* :func:`kernelcache.remote.check_entry`, for every value any remote tier returns, and the check
  pass of a bundle import (every member, before anything is written, dry runs too): a problem
  refuses the value or the bundle.
* :meth:`~kernelcache.store.Store.read`, each time it reads an entry's metadata from disk (the
  first read of a key in a process, a fresh read under a lock), with ``full=False``: without the
  checks whose cost grows with the artifact (the PTX text scan); the ELF checks cost time in
  proportion to the header tables. A problem is a corrupt entry (quarantined, counted, rebuilt by
  the caller): never served, never raised. A later read that finds the same bytes (its digest
  checked against the remembered document) does not repeat it.

Invariants: :func:`entry_problem` never raises; what it accepts with ``full`` it accepts without.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import IncompleteEntry
from ..formats import problem
from .launch import launch_problem

#: what starts the reason of an artifact that is not whole
NOT_WHOLE = "not a whole .{ext} artifact: "


def entry_problem(
    ext: str, data: bytes, doc: Mapping[str, Any], *, full: bool = True
) -> str | None:
    """Why ``data`` with its document ``doc`` (checked against the schema) is not a whole entry
    of extension ``ext``; None when it is. ``full=False``: what a read checks (see the module
    docstring). Never raises."""
    bad = launch_problem(ext, doc)
    if bad is not None:
        return bad
    name = doc.get("name")
    reason = problem(ext, data, name if isinstance(name, str) else None, full=full)
    return None if reason is None else NOT_WHOLE.format(ext=ext) + reason


def require_whole(key: str, ext: str, data: bytes, doc: Mapping[str, Any]) -> None:
    """Check an entry about to be written (:func:`entry_problem`, in full).

    Raises:
        ValueError: (:class:`~kernelcache.errors.IncompleteEntry`) it is not whole; the message
            says why and what to do.
    """
    reason = entry_problem(ext, data, doc)
    if reason is None:
        return
    if reason.startswith(NOT_WHOLE.format(ext=ext)):
        advice = (
            "store only the complete output of a compiler for the extension's machine (a .cubin "
            "is an ELF file for NVIDIA CUDA, a .hsaco one for AMD GPUs; a .ptx defines the "
            "kernel its metadata names and every function it calls)"
        )
    else:
        advice = f"give put every launch field of a .{ext} entry"
    raise IncompleteEntry(
        f"kernelcache: cannot store {key}.{ext}: {reason}; {advice} (nothing was written)"
    )
