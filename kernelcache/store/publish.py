"""Writing an entry's files: opening the root, staging under ``.tmp/`` and the errors a write
reports.

Files are staged under ``<root>/.tmp/`` with names that can never match an entry, then
published with ``os.replace`` (the artifact first, the metadata last) by
:func:`kernelcache.store.writing.publish`. A staged file keeps only the write bits the trust
policy accepts, whatever the umask. A failed write raises
:class:`~kernelcache.errors.CacheError` naming the root and what to do.
"""

from __future__ import annotations

import errno
import os
import uuid

from ..errors import CacheError
from ..process import HOST
from .layout import write_new
from .trust import TrustPolicy

_HINTS = {
    errno.ENOSPC: "free space on that filesystem or prune the cache (kernelcache prune)",
    errno.EDQUOT: "raise the quota or prune the cache (kernelcache prune)",
    errno.EFBIG: "the file size limit (ulimit -f) is too small for this artifact",
    errno.EROFS: "the filesystem is read-only; use a writable KERNELCACHE_DIR and pass this one "
    "as a read-only root (KERNELCACHE_READONLY_DIRS)",
    errno.EACCES: "make it writable for this user (or group), or use another KERNELCACHE_DIR",
    errno.EPERM: "make it writable for this user (or group), or use another KERNELCACHE_DIR",
    errno.ELOOP: "a symlink was planted in the cache; remove it (kernelcache verify --repair)",
    errno.ENOTDIR: "point KERNELCACHE_DIR at a directory",
    errno.EEXIST: "point KERNELCACHE_DIR at a directory",
}


def write_error(root: str, what: str, e: OSError | None = None, key: str = "") -> CacheError:
    """The error to raise for a failed write under ``root``: what failed and, for the usual
    causes, what to do."""
    hint = _HINTS.get(e.errno) if e is not None and e.errno is not None else None
    where = f" entry {key}" if key else ""
    message = f"cannot write{where} under {root}: {what}"
    if hint:
        message += f" ({hint})"
    return CacheError(e.errno if e is not None and e.errno else errno.EIO, message)


def stage(tmp_fd: int, policy: TrustPolicy, data: bytes) -> str:
    """Write ``data`` to a new file in ``.tmp/``; return its name. It keeps only the write
    bits the trust policy accepts: what this process publishes is never writable by users
    outside the trusted set, whatever the umask."""
    name = f"{HOST}-{os.getpid()}-{uuid.uuid4().hex}.tmp"
    write_new(tmp_fd, name, data, policy.limit_write_bits)
    return name


def open_root(root: str) -> int:
    """Open the directory ``root`` (created if missing) to write entries into it.

    Raises:
        CacheError: it cannot be (not a directory; no permission: the message says what to do).
    """
    try:
        os.makedirs(root, exist_ok=True)
        return os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileExistsError as e:
        raise write_error(root, "the cache root exists and is not a directory", e) from e
    except OSError as e:
        raise write_error(root, f"cannot open the cache root: {e.strerror}", e) from e
