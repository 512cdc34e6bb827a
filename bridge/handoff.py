"""Handing HSACO code objects to jaxlib by file path (ROCm, jaxlib without module_image).

jaxlib's ROCm loader reads the file named in ``TritonKernel.ptx`` and then deletes it, before
taking its module-cache lock (jaxlib >= 0.9.1). The path is also part of the opaque, which JAX's
persistent compilation cache keys on. So the path must be identical in every process, the file
must exist again whenever a process loads the kernel, and neither other processes nor other
devices of the same process may consume a file someone else is about to read.

How the bridge meets all three:

1. **One path for every process, a private file behind it.** Each process creates a private
   hand-off directory (under ``<cache root>/.handoff/``) and keeps it open as file descriptor
   :data:`HANDOFF_FD`. The path handed to jaxlib is ``/proc/self/fd/<HANDOFF_FD>/<key>.hsaco``:
   the same string in every process on every host, which the kernel resolves to *this*
   process's directory. No process can read or delete another's file; no host-wide lock is
   needed. Forked children get their own directory (``os.register_at_fork``); the descriptor is
   close-on-exec, so exec'd programs start clean.
2. **Re-materialised at every lowering.** Lowering runs in every process, even when JAX's
   persistent cache then supplies the executable, and it (re)writes the file atomically from the
   verified kernel-cache entry before the executable can run.
3. **One load per process.** Calls handed over by path are lowered as jaxlib *autotuned* calls
   (a single kernel appears twice), because jaxlib performs the first load of an autotuned call
   inside its global kernel-call lock: the devices of one process cannot race the
   read-then-delete. Later loads hit jaxlib's in-process module cache and never touch the file.

If descriptor :data:`HANDOFF_FD` is taken by something else in the process, the directory's own
absolute path is used instead: still correct, but that process's opaques differ from other
processes' (JAX's persistent cache cannot hit for them); a warning says so.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import logging
import os
import shutil
import stat
import threading
import uuid
from pathlib import Path

from kernelcache.layout import register_directory
from kernelcache.process import HOST

logger = logging.getLogger(__name__)

#: the directory of a cache root that holds the per-process hand-off directories
HANDOFF_DIR = ".handoff"
register_directory(HANDOFF_DIR)  # a scan of the root knows it from a foreign file

#: the descriptor number every process keeps its hand-off directory open as
HANDOFF_FD = 1023
_OWNER = "owner.lock"

_lock = threading.RLock()
_state: dict[str, object] = {}


def _reap(base: Path) -> None:
    """Remove hand-off directories of this host whose owning process is gone."""
    prefix = HOST + "-"
    try:
        entries = list(os.scandir(base))
    except OSError:
        return
    for entry in entries:
        if not entry.name.startswith(prefix) or not entry.is_dir(follow_symlinks=False):
            continue
        try:
            fd = os.open(os.path.join(entry.path, _OWNER), os.O_RDWR | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)  # the owner is alive
            continue
        shutil.rmtree(entry.path, ignore_errors=True)
        os.close(fd)


def _canonical_fd(dir_fd: int) -> bool:
    """Make :data:`HANDOFF_FD` refer to ``dir_fd``'s directory without clobbering anything."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft <= HANDOFF_FD < hard or (hard == resource.RLIM_INFINITY and soft <= HANDOFF_FD):
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (HANDOFF_FD + 1, hard))
    try:
        got = fcntl.fcntl(dir_fd, fcntl.F_DUPFD_CLOEXEC, HANDOFF_FD)
    except OSError:
        return False
    if got != HANDOFF_FD:
        os.close(got)
        return False
    return True


def _base(root: str) -> Path:
    """``<root>/.handoff``, or a per-user directory under the system temp directory when the
    cache root cannot take it (a read-only or missing root must not fail the job).

    A symlink planted at either place is never followed, and the temp directory is used only
    if this user owns it and nobody else can write it (else a fresh private one is made)."""
    base = Path(root) / HANDOFF_DIR
    try:
        base.mkdir(parents=True, exist_ok=True)
        if stat.S_ISDIR(os.lstat(base).st_mode) and os.access(base, os.W_OK | os.X_OK):
            return base
    except OSError as e:
        logger.debug("cannot use %s for HSACO hand-off: %s", base, e)
    import tempfile

    base = Path(tempfile.gettempdir()) / f"kernelcache-handoff-{os.getuid()}"
    with contextlib.suppress(FileExistsError):
        base.mkdir(mode=0o700)
    st = os.lstat(base)
    if stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o022:
        return base
    return Path(tempfile.mkdtemp(prefix="kernelcache-handoff-"))


def _setup(root: str, *, after_fork: bool = False) -> dict[str, object]:
    base = _base(root)
    _reap(base)
    private = base / f"{HOST}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    private.mkdir(mode=0o700)
    owner = os.open(private / _OWNER, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    fcntl.flock(owner, fcntl.LOCK_EX)
    dir_fd = os.open(private, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    if after_fork:
        # the inherited HANDOFF_FD is ours (the parent's directory): point it at the child's
        os.dup2(dir_fd, HANDOFF_FD, inheritable=False)
        canonical = True
    else:
        canonical = os.path.isdir(f"/proc/self/fd/{dir_fd}") and _canonical_fd(dir_fd)
    if not canonical:
        logger.warning(
            "kernelcache: file descriptor %d is in use, so HSACO hand-off paths are private to "
            "process %d; JAX's persistent cache cannot share these executables across processes",
            HANDOFF_FD,
            os.getpid(),
        )
    return {
        "root": root,
        "dir": str(private),
        "dir_fd": dir_fd,
        "owner": owner,
        "canonical": canonical,
        "pid": os.getpid(),
    }


def _cleanup() -> None:
    with _lock:
        state = dict(_state)
        _state.clear()
    if state.get("pid") != os.getpid():
        return
    shutil.rmtree(str(state["dir"]), ignore_errors=True)
    for key in ("dir_fd", "owner"):
        with contextlib.suppress(OSError):
            os.close(int(state[key]))  # type: ignore[call-overload]


def _after_fork_in_child() -> None:
    global _lock
    _lock = threading.RLock()
    old = dict(_state)
    _state.clear()
    if not old:
        return
    for key in ("dir_fd", "owner"):
        with contextlib.suppress(OSError):
            os.close(int(old[key]))  # type: ignore[call-overload]
    if old.get("canonical"):
        # executables lowered by the parent may run here first: give the child its own copies
        _state.update(_setup(str(old["root"]), after_fork=True))
        with contextlib.suppress(OSError):
            for entry in os.scandir(str(old["dir"])):
                if entry.name.endswith(".hsaco"):
                    with contextlib.suppress(OSError):
                        shutil.copyfile(entry.path, os.path.join(str(_state["dir"]), entry.name))


os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(_cleanup)


def directory(root: str) -> tuple[str, bool]:
    """This process's hand-off directory under ``root``, and whether the canonical
    ``/proc/self/fd`` path reaches it (created on first use)."""
    with _lock:
        if not _state or _state.get("root") != str(root):
            if _state:
                _cleanup()
            _state.update(_setup(str(root)))
        return str(_state["dir"]), bool(_state["canonical"])


def materialize(root: str, name: str, data: bytes) -> str:
    """Write ``data`` as ``name`` in this process's hand-off directory unless it is there, and
    return the path to hand to jaxlib (the same string in every process when canonical)."""
    private, canonical = directory(root)
    target = os.path.join(private, name)
    try:
        present = os.stat(target).st_size == len(data)
    except FileNotFoundError:
        present = False
    if not present:
        tmp = os.path.join(private, f".{name}.{uuid.uuid4().hex[:8]}.tmp")
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, target)
    return f"/proc/self/fd/{HANDOFF_FD}/{name}" if canonical else target
