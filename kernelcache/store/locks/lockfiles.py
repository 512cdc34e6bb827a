"""The lock directory of a root (``<root>/.locks/``) and its lock files: opening them, holding
them to a trust policy, telling whether an open one is still the one on disk, unlinking one.

Invariants: lock files are opened relative to the directory's descriptor with ``O_NOFOLLOW``
and ``O_NONBLOCK``, read-only, so a planted symlink is never followed, a FIFO never hangs an
open, and a lock file is never written. With a trust policy (a store's), a lock file keeps only
the read and write bits of the users the policy trusts (whoever can open it can hold it), and a
lock file of a user the policy does not trust is refused (:class:`LockUnavailable`): it is
never waited on.
"""

from __future__ import annotations

import contextlib
import errno
import os
from typing import TYPE_CHECKING

from ...errors import LockUnavailable
from ...fsio import READ_FLAGS  # a FIFO planted as a lock file must not hang the open
from ..layout import LOCK_DIR, open_subdir

if TYPE_CHECKING:
    from ..trust import TrustPolicy


def open_lock_dir(root: str) -> int:
    """A descriptor of the lock directory of ``root``, created (with ``root``, for a fresh
    root whose first lock this is) where it is missing.

    Raises:
        LockUnavailable: it cannot be opened or created (unwritable, or not a directory).
    """
    try:
        try:
            return open_subdir(root, LOCK_DIR, create=True)
        except FileNotFoundError:
            os.makedirs(root, exist_ok=True)
            return open_subdir(root, LOCK_DIR, create=True)
    except OSError as e:
        raise LockUnavailable(
            e.errno,
            f"cannot use lock directory {os.path.join(root, LOCK_DIR)}: "
            f"{e.strerror}; make it a writable directory (not a symlink)",
        ) from e


def open_lock_file(root: str, dfd: int, filename: str, trust: TrustPolicy | None) -> int:
    """A descriptor of the lock file ``filename`` in the lock directory ``dfd`` of ``root``,
    created where it is missing, and held to ``trust`` (:func:`vet_lock_file`).

    Raises:
        LockUnavailable: it cannot be opened (a planted symlink, no permission), or it belongs
            to a user ``trust`` does not trust.
    """
    try:
        fd = os.open(filename, READ_FLAGS | os.O_CREAT, 0o666, dir_fd=dfd)
    except PermissionError:
        # An existing lock file of another user in a sticky directory: open without O_CREAT.
        try:
            fd = os.open(filename, READ_FLAGS, dir_fd=dfd)
        except OSError as e:
            raise LockUnavailable(
                e.errno, f"cannot open lock file {filename} under {root}: {e.strerror}"
            ) from e
    except OSError as e:
        raise LockUnavailable(
            e.errno,
            f"cannot open lock file {filename} under {root}/{LOCK_DIR}: {e.strerror}"
            + ("; a symlink was planted there, remove it" if e.errno == errno.ELOOP else ""),
        ) from e
    try:
        vet_lock_file(root, fd, filename, trust)
    except BaseException:
        os.close(fd)
        raise
    return fd


def vet_lock_file(root: str, fd: int, filename: str, trust: TrustPolicy | None) -> None:
    """Apply the trust policy to the open lock file ``fd``: a file of this user keeps only
    the bits of trusted users (unless it has other links: a hard link planted under its name
    names a file of this user elsewhere, whose mode is not the lock's to change); a file of a
    user the policy does not trust is refused.

    Raises:
        LockUnavailable: the file belongs to an untrusted user (it may hold it for ever).
    """
    if trust is None:
        return
    st = os.fstat(fd)
    if st.st_uid == os.geteuid():
        if st.st_nlink != 1:
            return
        with contextlib.suppress(OSError):
            trust.limit_access(fd, st)
    elif not trust.trusts(st.st_uid):
        raise LockUnavailable(
            errno.EPERM,
            f"lock file {filename} under {root}/{LOCK_DIR} belongs to user "
            f"{st.st_uid}, whom KERNELCACHE_TRUST={trust.policy} does not trust; "
            "not waiting for it",
        )


def same_file(dfd: int, filename: str, fd: int) -> bool:
    """Whether the open file ``fd`` is still ``filename`` in ``dfd`` (not unlinked, by a prune,
    since it was opened)."""
    try:
        on_disk = os.stat(filename, dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (on_disk.st_dev, on_disk.st_ino) == (held.st_dev, held.st_ino)


def unlink_lock_file(root: str, filename: str, dir_fd: int = -1) -> None:
    """Unlink a lock file of ``root``, relative to ``dir_fd`` (the lock directory the lock was
    taken in) when given; one already gone, or another user's, is left alone."""
    dfd = dir_fd if dir_fd >= 0 else open_lock_dir(root)
    try:
        # (PermissionError: another user's file in the sticky lock directory: it stays)
        with contextlib.suppress(FileNotFoundError, PermissionError):
            os.unlink(filename, dir_fd=dfd)
    finally:
        if dfd != dir_fd:
            os.close(dfd)
