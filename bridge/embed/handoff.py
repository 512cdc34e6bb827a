"""Handing HSACO code objects to jaxlib by file path (ROCm, jaxlib without module_image).

jaxlib's ROCm loader reads the file named in ``TritonKernel.ptx`` and then deletes it, before
taking its module-cache lock (jaxlib >= 0.9.1). The path is also part of the opaque, which JAX's
persistent compilation cache keys on. So the path must be identical in every process, the file
must exist again whenever a process loads the kernel, and neither other processes nor other
devices of the same process may consume a file someone else is about to read.

How the bridge meets all three:

1. **One path for every process, a private file behind it.** Each process creates a private
   hand-off directory (under ``<cache root>/.handoff/``) and keeps it open as file descriptor
   :data:`HANDOFF_FD`. The path handed to jaxlib is ``/proc/self/fd/<HANDOFF_FD>/<sha256>.hsaco``
   (the digest of the machine code, whichever entry served it): the same string in every
   process on every host, which the kernel resolves to *this*
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

Others who may write the cache root must not be able to hand jaxlib their bytes. Files are
checked and written through the private directory's descriptor (``O_NOFOLLOW``, a new file
put in place with ``os.replace``), a file is taken as present only if it holds exactly the
kernel's bytes (never by its size), and before an absolute path is handed over it is checked
to lead to that same directory (a renamed directory and one planted at its name are told
apart). ``<root>/.handoff`` is created sticky, and used only if it belongs to this user or
root, or is sticky and belongs to the cache root's owner; else a private directory under the
system's temp directory is used.
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

from kernelcache.plugin import HOST, pid_alive, register_directory

logger = logging.getLogger(__name__)

#: the directory of a cache root that holds the per-process hand-off directories
HANDOFF_DIR = ".handoff"
register_directory(HANDOFF_DIR, shared=True)  # a scan knows it from a foreign file

#: the descriptor number every process keeps its hand-off directory open as
HANDOFF_FD = 1023
_OWNER = "owner.lock"

_lock = threading.RLock()
_state: dict[str, object] = {}


_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
#: the largest code object a forked child copies from its parent's directory
MAX_HSACO = 256 << 20


def _reap(base: Path) -> None:
    """Remove this user's hand-off directories of this host whose owning process is gone.

    A directory is taken as gone only if its owner lock can be taken; one still being set up
    (named with a leading dot until its lock is held) only if the process named in it is
    gone, so a process starting up beside this one never loses its directory."""
    prefix = HOST + "-"
    try:
        entries = list(os.scandir(base))
    except OSError:
        return
    for entry in entries:
        staging = entry.name.startswith("." + prefix)
        if not (staging or entry.name.startswith(prefix)):
            continue
        if not entry.is_dir(follow_symlinks=False):
            continue
        try:
            if entry.stat(follow_symlinks=False).st_uid != os.geteuid():
                continue  # another user's: theirs to reap
        except OSError:
            continue
        if staging:
            pid = entry.name[len(prefix) + 1 :].split("-", 1)[0]
            if pid.isdigit() and not pid_alive(int(pid)):
                shutil.rmtree(entry.path, ignore_errors=True)
            continue
        try:
            fd = os.open(os.path.join(entry.path, _OWNER), os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
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


def _base(root: str) -> tuple[Path, bool]:
    """``<root>/.handoff`` (created sticky), or a per-user directory under the system temp
    directory when the cache root cannot take it (a read-only or missing root must not fail
    the job) or when others could rename what this process keeps there; and whether that
    directory is this process's own (:func:`_temp_base`).

    A symlink planted at either place is never followed, and the temp directory is used only
    if this user owns it and nobody else can write it (else a fresh private one is made)."""
    base = Path(root) / HANDOFF_DIR
    try:
        Path(root).mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            os.mkdir(base, 0o1777)
        if _usable_base(root, base):
            return base, False
    except OSError as e:
        logger.debug("cannot use %s for HSACO hand-off: %s", base, e)
    return _temp_base()


def _temp_base() -> tuple[Path, bool]:
    """A directory of this user's alone under the system temp directory, and whether it is
    this process's own: ``kernelcache-handoff-<uid>``, shared by this user's processes, or,
    where that name is taken by something else, a fresh directory that this process removes
    when it ends."""
    import tempfile

    base = Path(tempfile.gettempdir()) / f"kernelcache-handoff-{os.getuid()}"
    with contextlib.suppress(FileExistsError):
        base.mkdir(mode=0o700)
    st = os.lstat(base)
    if stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o022:
        return base, False
    return Path(tempfile.mkdtemp(prefix="kernelcache-handoff-")), True


def _usable_base(root: str, base: Path) -> bool:
    """Whether ``base`` (``<root>/.handoff``) may hold this process's directory: a real
    directory this user may write, in which no one but this user, root and the cache root's
    owner may rename it (a sticky directory owned by one of them; one of this user's own is
    made sticky).

    Raises:
        OSError: it cannot be examined.
    """
    st = os.lstat(base)
    if not stat.S_ISDIR(st.st_mode) or not os.access(base, os.W_OK | os.X_OK):
        return False
    me = os.geteuid()
    if st.st_uid == me and st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        os.chmod(base, stat.S_IMODE(st.st_mode) | stat.S_ISVTX, follow_symlinks=False)
        return True
    if st.st_uid in (me, 0):
        return True
    return bool(st.st_mode & stat.S_ISVTX) and st.st_uid == os.stat(root).st_uid


def _setup(root: str, *, after_fork: bool = False, private_base: bool = False) -> dict[str, object]:
    base, own_base = _temp_base() if private_base else _base(root)
    _reap(base)
    name = f"{HOST}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    # set up under a name the reaper leaves alone while this process lives, and put in place
    # only once its owner lock is held (else a peer's reaper could take it for a dead one's)
    staging, private = base / f".{name}", base / name
    staging.mkdir(mode=0o700)
    dir_fd = os.open(staging, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    owner = os.open(_OWNER, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
    fcntl.flock(owner, fcntl.LOCK_EX)
    os.rename(staging, private)
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
        "own_base": str(base) if own_base else "",
    }


def _cleanup() -> None:
    with _lock:
        state = dict(_state)
        _state.clear()
    if state.get("pid") != os.getpid():
        return
    dir_fd = int(state["dir_fd"])  # type: ignore[call-overload]
    with contextlib.suppress(OSError):
        for name in os.listdir(dir_fd):  # through the descriptor: whatever its name leads to
            with contextlib.suppress(OSError):
                os.unlink(name, dir_fd=dir_fd)
        if _leads_to(str(state["dir"]), dir_fd):
            os.rmdir(str(state["dir"]))
    if state.get("own_base"):
        with contextlib.suppress(OSError):
            os.rmdir(str(state["own_base"]))  # made for this process; empty unless planted
    if state.get("canonical") and _leads_to(f"/proc/self/fd/{HANDOFF_FD}", dir_fd):
        os.close(HANDOFF_FD)  # free for the next set-up (another root), whose path it is
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
    parents = None
    if old.get("canonical"):  # (its descriptor is about to be HANDOFF_FD's no more)
        with contextlib.suppress(OSError):
            parents = os.dup(int(old["dir_fd"]))  # type: ignore[call-overload]
    for key in ("dir_fd", "owner"):
        with contextlib.suppress(OSError):
            os.close(int(old[key]))  # type: ignore[call-overload]
    if parents is None:
        return
    try:
        # executables lowered by the parent may run here first: give the child its own copies
        _state.update(_setup_or_temp(str(old["root"]), after_fork=True))
        _copy_kernels(parents, int(_state["dir_fd"]))  # type: ignore[call-overload]
    finally:
        os.close(parents)


def _copy_kernels(source: int, target: int) -> None:
    """Copy the code objects of the directory open as ``source`` (the parent's, read through
    its descriptor: the path may lead elsewhere by now) into the one open as ``target``:
    regular files of at most :data:`MAX_HSACO` bytes, never through a link."""
    with contextlib.suppress(OSError):
        for name in os.listdir(source):
            if not name.endswith(".hsaco"):
                continue
            with contextlib.suppress(OSError):
                fd = os.open(name, _READ, dir_fd=source)
                try:
                    st = os.fstat(fd)
                    if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_HSACO:
                        continue
                    data = os.pread(fd, st.st_size + 1, 0)
                finally:
                    os.close(fd)
                if len(data) <= MAX_HSACO:
                    _write(target, name, data)


os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(_cleanup)


def directory(root: str) -> tuple[str, bool]:
    """This process's hand-off directory under ``root``, and whether the canonical
    ``/proc/self/fd`` path reaches it (created on first use)."""
    state = _current(root)
    return str(state["dir"]), bool(state["canonical"])


def _current(root: str) -> dict[str, object]:
    """This process's hand-off state for ``root`` (set up on first use)."""
    with _lock:
        if not _state or _state.get("root") != str(root):
            if _state:
                _cleanup()
            _state.update(_setup_or_temp(str(root)))
        return dict(_state)


def _setup_or_temp(root: str, *, after_fork: bool = False) -> dict[str, object]:
    """:func:`_setup` under ``root``, or under the system's temp directory if that fails (a
    full or broken cache root must not fail the job)."""
    try:
        return _setup(root, after_fork=after_fork)
    except OSError as e:
        logger.warning(
            "kernelcache: cannot set up HSACO hand-off under %s (%s); using a private "
            "directory under the system's temp directory",
            root,
            e,
        )
        return _setup(root, after_fork=after_fork, private_base=True)


def _leads_to(path: str, dir_fd: int) -> bool:
    """Whether ``path`` resolves, now, to the directory open as ``dir_fd``."""
    try:
        st, held = os.stat(path), os.fstat(dir_fd)
    except OSError:
        return False
    return (st.st_dev, st.st_ino) == (held.st_dev, held.st_ino)


def _holds(dir_fd: int, name: str, data: bytes) -> bool:
    """Whether the file ``name`` in ``dir_fd`` is a regular file holding exactly ``data``."""
    try:
        fd = os.open(name, _READ, dir_fd=dir_fd)
    except OSError:
        return False
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        with os.fdopen(os.dup(fd), "rb") as f:
            return f.read(len(data) + 1) == data
    except OSError:
        return False
    finally:
        os.close(fd)


def _write(dir_fd: int, name: str, data: bytes) -> None:
    """Put a new file holding ``data`` at ``name`` in ``dir_fd``, atomically."""
    tmp = f".{name}.{uuid.uuid4().hex[:8]}.tmp"
    fd = os.open(tmp, _NEW_FILE, 0o600, dir_fd=dir_fd)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dir_fd)
        raise


def materialize(root: str, name: str, data: bytes) -> str:
    """Write ``data`` as ``name`` in this process's hand-off directory unless it holds exactly
    that, and return the path to hand to jaxlib (the same string in every process when
    canonical). Everything is done through the directory's descriptor; an absolute path is
    handed over only while it leads to that directory (else a fresh one is set up)."""
    for _ in range(2):
        state = _current(root)
        dir_fd = int(state["dir_fd"])  # type: ignore[call-overload]
        if not _holds(dir_fd, name, data):
            _write(dir_fd, name, data)
        if state["canonical"]:
            return f"/proc/self/fd/{HANDOFF_FD}/{name}"
        private = str(state["dir"])
        if _leads_to(private, dir_fd):
            return os.path.join(private, name)
        logger.warning(
            "kernelcache: the HSACO hand-off directory %s was moved or replaced by someone "
            "else; using a new private one",
            private,
        )
        with _lock:
            _cleanup()
            _state.update(_setup(str(root), private_base=True))
    raise OSError(f"cannot hand HSACO over safely under {root}")
