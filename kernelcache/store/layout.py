"""The layout of a cache root, and the one way each of its parts is named, found and opened.

::

    <root>/<key>.<ext>     an artifact, exactly what a loader consumes
    <root>/<key>.json      its metadata, written last: the entry's commit marker
    <root>/.tmp/           staging, published into the root with os.replace
    <root>/.locks/         per-key lock files (see locks.py)
    <root>/.quarantine/    corrupt entries moved aside, with the reason
    <root>/.stats/         per-process statistics logs, their summary, the scan index
    <root>/.checked/       what each user checked of an entry beyond a read (below)
    <root>/.kernelcache.conf  the root's own settings (read here; .settings_file writes it)

Other packages register the directories they keep in a root (:func:`register_directory`), so
that a scan knows them from foreign files.

Invariants: nothing under a root is opened through a symlink: entry files and the
housekeeping directories are opened with ``O_NOFOLLOW``, and the files in those directories
relative to their descriptors. What is written is a new file (:func:`create_exclusive`), put
in place with ``os.replace``; only lock files and the append-only statistics logs are opened
again. A directory gets mode 0o777 and a file 0o666, minus the umask, so that a group-shared
root (umask 002, a set-group-ID directory) stays writable for its group. In a root set up for
sharing (set-group-ID or sticky), the directories every user writes files of their own into
(:func:`shared_directories`) are created sticky, so that a user may remove or replace only
their own files there.

A package may check more of an entry than a read does (the bridge inflates every opaque of a
program entry before serving any) and record it (:func:`record_check`), so that the same user's
next process need not check the same bytes again (:func:`check_recorded`): one empty file per
check, key and digest in ``.checked/``, named ``<uid>.<check>.<key>.<digest>`` (the digest's
algorithm and hex digits joined by ``-``). A record is believed only if it is a regular file
owned by this user with one link (another user of a shared root can create files of any name
there, never one owned by this user; a hard link to a file of this user that the other may
write has two), so it vouches only for what this user checked; the digest in its name
ties it to the bytes checked (an entry replaced, or its bytes altered with its digests made
again, has another digest and no record). Records are never read for content and never needed:
a missing or unwritable one (or a file another user planted under this user's record's name)
costs the next process the check, nothing else.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import stat
import threading
import uuid
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..config import VARIABLES, Settings, Variable, parse_variable, variable
from ..errors import DeclarationError, InvalidValue
from ..fsio import READ_FLAGS
from ..keys import KEY_PATTERN
from ..problem import Problem
from ..process import printable, warn_once
from ..schema.document import MAX_META_BYTES, parse_metadata
from .trust import TrustPolicy

if TYPE_CHECKING:
    from ..config import FileValues

TMP_DIR = ".tmp"
LOCK_DIR = ".locks"
QUARANTINE_DIR = ".quarantine"
STATS_DIR = ".stats"
CHECKED_DIR = ".checked"
#: the remote tiers' circuit breakers, shared by the processes of a root (remote/breakers.py)
BREAKER_DIR = ".breakers"

#: the root's own configuration file (kernelcache/store/settings_file.py)
SETTINGS_FILE = ".kernelcache.conf"

#: the names a root holds besides its entries: its directories, and its configuration file
_known_dirs = frozenset(
    {TMP_DIR, LOCK_DIR, QUARANTINE_DIR, STATS_DIR, CHECKED_DIR, BREAKER_DIR, SETTINGS_FILE}
)
#: directories where every user of a root keeps files of their own (lock files, statistics
#: logs, the scan index, check records, breakers): created sticky in a shared root
_shared_dirs = frozenset({LOCK_DIR, STATS_DIR, CHECKED_DIR, BREAKER_DIR})
_registering = threading.Lock()

#: how a file is created under a root: a new file only, never through a symlink
CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
#: errors opening a metadata file after which a reader sees no entry rather than a damaged one:
#: a path component is not a directory, or this user may not read the file
NOT_VISIBLE = frozenset({errno.ENOTDIR, errno.EACCES, errno.EPERM})


# -- directories --------------------------------------------------------------------------
def register_directory(name: str, *, shared: bool = False) -> None:
    """Declare ``name`` a directory that may sit in a root beside the entries; ``shared``: one
    where every user keeps files of their own (it should be sticky, and doctor says so).

    Raises:
        ValueError: ``name`` is not a hidden name of one path component (``.name``), which
            can never be taken for an entry file.
    """
    if not name.startswith(".") or name in (".", "..") or "/" in name or "\0" in name:
        raise DeclarationError(f"a root's directory is named '.name', not {name!r}")
    global _known_dirs, _shared_dirs
    with _registering:
        _known_dirs = _known_dirs | {name}
        if shared:
            _shared_dirs = _shared_dirs | {name}


def known_directories() -> frozenset[str]:
    """Every directory a root may hold besides its entries (and its configuration file):
    kernelcache's and those other packages registered in this process."""
    return _known_dirs


def shared_directories() -> frozenset[str]:
    """The known directories where every user of a root keeps files of their own."""
    return _shared_dirs


def shared_root(root: str) -> bool:
    """Whether ``root`` is set up for sharing: set-group-ID (docs/sharing.md's recipe) or sticky."""
    try:
        return bool(os.stat(root).st_mode & (stat.S_ISGID | stat.S_ISVTX))
    except OSError:
        return False


def open_subdir(root: str, name: str, *, create: bool) -> int:
    """Open ``<root>/<name>`` as a directory without following a symlink at ``name``.

    Creates it (mode 0o777 minus the umask; sticky for a :func:`shared_directories` one in a
    :func:`shared_root`) when ``create`` is true and it is missing.

    Raises:
        OSError: from the system (ENOENT, EACCES, EROFS, ELOOP/ENOTDIR for a planted symlink).
    """
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    path = os.path.join(root, name)
    try:
        return os.open(path, flags)
    except FileNotFoundError:
        if not create:
            raise
    sticky = name in _shared_dirs and shared_root(root)
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o1777 if sticky else 0o777)
    return os.open(path, flags)


# -- the root's configuration file (written by .settings_file) ------------------------------
#: the most a file may hold; a larger one is not read
MAX_SETTINGS_BYTES = 64 << 10


def file_variables() -> dict[str, Variable]:
    """The variables a root's file may set, by their key there (``max_size``)."""
    return {var.key: var for var in VARIABLES if var.in_file}


@dataclass(frozen=True)
class RootFile:
    """What a root's file holds: its path, its lines' values by key (in file order), and what
    in it cannot be used."""

    path: str
    exists: bool = False
    values: dict[str, str] = field(default_factory=dict)
    problems: tuple[str, ...] = ()

    def as_settings(self) -> FileValues:
        """The values as :func:`kernelcache.config.settings` takes them."""
        known = file_variables()
        return {known[k].name: (self.path, v) for k, v in self.values.items()}


def settings_path(root: str | os.PathLike[str]) -> str:
    """The configuration file of ``root``."""
    return os.path.join(os.fspath(root), SETTINGS_FILE)


def read_settings(root: str | os.PathLike[str], trust: str) -> RootFile:
    """The configuration file of ``root``, as the trust policy ``trust`` lets it be used.
    Never raises."""
    path = settings_path(root)
    try:
        fd = os.open(path, READ_FLAGS)
    except OSError as e:
        if e.errno in (errno.ENOENT, errno.ENOTDIR):  # none (or no root yet)
            return RootFile(path)
        return RootFile(path, True, problems=(f"{path} cannot be read: {e.strerror}: not used",))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return RootFile(path, True, problems=(f"{path} is not a regular file: not used",))
        if not TrustPolicy(os.fspath(root), trust).accepts(st):
            why = f"its owner (uid {st.st_uid}) or mode is not one KERNELCACHE_TRUST={trust} trusts"
            return RootFile(path, True, problems=(f"{path}: {why}: not used",))
        raw = os.read(fd, MAX_SETTINGS_BYTES + 1)
    except OSError as e:
        return RootFile(path, True, problems=(f"{path} cannot be read: {e.strerror}: not used",))
    finally:
        os.close(fd)
    if len(raw) > MAX_SETTINGS_BYTES:
        return RootFile(
            path, True, problems=(f"{path} is larger than {MAX_SETTINGS_BYTES:,} bytes: not used",)
        )
    values, problems = parse_settings(raw.decode("utf-8", errors="replace"), path)
    return RootFile(path, True, values, problems)


def parse_settings(text: str, path: str) -> tuple[dict[str, str], tuple[str, ...]]:
    """The values of a file's ``text`` by key (the last of a key repeated wins), and what in
    it cannot be used (each line named)."""
    known = file_variables()
    values: dict[str, str] = {}
    problems = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, equals, value = (part.strip() for part in line.partition("="))
        where = f"{path}:{number}"
        if not equals:
            problems.append(f"{where}: {printable(line[:80])!r} is not KEY = VALUE: left out")
        elif key.lower() not in known:
            problems.append(f"{where}: {unknown_setting(key)}: left out")
        else:
            values[key.lower()] = value
    return values, tuple(problems)


def unknown_setting(key: str) -> str:
    """What is said of ``key``, which a root's file cannot hold."""
    return f"{printable(key[:80])!r} is not a setting of a root's file (one of {', '.join(file_variables())})"


def settings_of_root(root: str | os.PathLike[str], trust: str) -> FileValues:
    """The values of ``root``'s file for a job's settings; what cannot be used is said once."""
    found = read_settings(root, trust)
    for problem in found.problems:
        warn_once(
            logging.getLogger("kernelcache"), ("settings-file", problem), "kernelcache: %s", problem
        )
    return found.as_settings()


# -- files --------------------------------------------------------------------------------
def create_exclusive(name: str, dir_fd: int) -> int:
    """A new file ``name`` in the directory ``dir_fd``, opened for writing (mode 0o666 minus
    the umask): an existing file or a symlink planted there is an error, never opened.

    Raises:
        OSError: FileExistsError, ELOOP, or whatever else the system says.
    """
    return os.open(name, CREATE_FLAGS, 0o666, dir_fd=dir_fd)


def write_new(
    dfd: int, name: str, data: bytes, prepare: Callable[[int], object] | None = None
) -> None:
    """Write ``data`` to a new file ``name`` in the directory ``dfd`` (:func:`create_exclusive`),
    calling ``prepare`` with its descriptor first; nothing is left behind on failure.

    Raises:
        OSError: it could not be written.
    """
    fd = create_exclusive(name, dfd)
    try:
        try:
            if prepare is not None:
                prepare(fd)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(name, dir_fd=dfd)
        raise


def replace_file(dfd: int, name: str, data: bytes, staging: int | None = None) -> None:
    """Write ``data`` to ``name`` in the directory ``dfd`` atomically: readers see the old file
    or the new one, whole. Staged under a hidden unique name (never followed if planted as a
    link) in ``dfd``, or in the directory ``staging`` of the same filesystem (a root's
    ``.tmp/``, where a scan never takes it for a foreign file), then ``os.replace``d; nothing is
    left behind on failure.

    Raises:
        OSError: it could not be written (the old file, if any, is intact).
    """
    tmp, sfd = f".{name}.{os.getpid()}-{uuid.uuid4().hex}.tmp", dfd if staging is None else staging
    write_new(sfd, tmp, data)
    try:
        os.replace(tmp, name, src_dir_fd=sfd, dst_dir_fd=dfd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=sfd)
        raise


def read_metadata(
    path: str,
    key: str,
    *,
    dir_fd: int | None = None,
    trust: TrustPolicy | None = None,
    not_visible: Collection[int] = (),
    parse: Callable[[bytes, str], dict[str, Any] | Problem] = parse_metadata,
) -> tuple[dict[str, Any], os.stat_result] | Problem | None:
    """Read and check the metadata file ``path`` of ``key`` (relative to ``dir_fd`` if given).

    Returns the document (checked by ``parse``: by default against the schema and its entry
    digest) and the file's status; None if there is no such file (or its open failed with an
    errno in ``not_visible``); else the Problem: a symlink, not a regular file, refused by
    ``trust``, too large, unreadable or not a valid document.
    """
    try:
        fd = os.open(path, READ_FLAGS, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.EMLINK):
            return Problem(key, "metadata is a symlink")
        if e.errno in not_visible:
            return None
        return Problem(key, f"metadata unreadable: {e.strerror}", corrupt=False)
    try:
        st = os.fstat(fd)
        refused = unservable(key, st, "metadata", trust)
        if refused is not None:
            return refused
        if st.st_size > MAX_META_BYTES:
            return Problem(key, "metadata is too large")
        raw = os.read(fd, st.st_size + 1)
    except OSError as e:
        return Problem(key, f"metadata unreadable: {e.strerror}")
    finally:
        os.close(fd)
    doc = parse(raw, key)
    if isinstance(doc, Problem):
        return doc
    return doc, st


def unservable(
    key: str, st: os.stat_result, what: str, trust: TrustPolicy | None
) -> Problem | None:
    """Why the file ``what`` (``"metadata"``, ``"artifact"``) of ``key``, of status ``st``,
    may not be served: replaced or removed since it was opened (a corrupt read: the read is
    done again, under the key's lock), not a regular file, or refused by ``trust`` (None: no
    policy); None if it may."""
    if st.st_nlink == 0:
        return Problem(key, f"{what} was replaced while being read")
    if not stat.S_ISREG(st.st_mode):
        return Problem(key, f"{what} is not a regular file")
    if trust is not None and not trust.may_serve(st):
        refusal = trust.refusal(st, what)
        if refusal is not None:
            return Problem(key, refusal, corrupt=False, untrusted=True)
    return None


# -- the root -----------------------------------------------------------------------------
def default_root(cfg: Settings | None = None) -> Path:
    """``$KERNELCACHE_DIR`` (from ``cfg`` when given), else platformdirs' user cache directory
    for "kernelcache".

    Raises:
        ConfigError: ``$KERNELCACHE_DIR`` cannot be used (no other variable is read).
    """
    configured = cfg.root if cfg is not None else parse_variable(variable("KERNELCACHE_DIR"))
    if configured is not None:
        return Path(configured)
    import platformdirs

    return Path(platformdirs.user_cache_dir("kernelcache", appauthor=False))


#: a shell variable left as text (``$HOME``, ``${USER}``)
_SHELL_VARIABLE = re.compile(r"\$\{?[A-Za-z_][A-Za-z0-9_]*\}?")


def path_problem(path: str | os.PathLike[str]) -> str | None:
    """Why a root named in the environment (``$KERNELCACHE_DIR``, ``$KERNELCACHE_READONLY_DIRS``)
    is not the directory meant, with the remedy; None for an absolute path. A relative path is
    read from each process's current directory; a ``$VAR`` or ``~`` left in it was expanded by
    no shell (the value was quoted, or set where no shell reads it). A leading ``~`` is
    expanded when the variable is read, as a shell would."""
    text = os.fspath(path)
    left = _SHELL_VARIABLE.search(text)
    shown = left.group() if left else next((p for p in Path(text).parts if p[0] == "~"), None)
    if shown is not None:
        meant = os.path.expandvars(text)  # (what this process's environment would give)
        return (
            f"{text!r} holds {shown!r}, which no shell expanded (the value was quoted, or set "
            "where no shell reads it): write the path out"
            + (f" ({meant}?)" if meant != text and os.path.isabs(meant) else "")
        )
    if not os.path.isabs(text):
        return (
            f"{text!r} is a relative path, read from the current directory "
            f"({os.getcwd()}): give an absolute path"
        )
    return None


def resolve_root(root: str | os.PathLike[str] | None, cfg: Settings | None = None) -> str:
    """The cache root to work on: ``root`` with a leading ``~`` expanded, else
    :func:`default_root`.

    Raises:
        ValueError: ``root`` starts with ``~user`` of no such user (or there is no home).
        ConfigError: ``root`` is None and ``$KERNELCACHE_DIR`` cannot be used.
    """
    if root is None:
        return os.fspath(default_root(cfg))
    try:
        return os.fspath(Path(root).expanduser())
    except RuntimeError:  # "~user/..." for a user that does not exist, or no home
        raise InvalidValue(
            f"cache root {os.fspath(root)!r}: cannot expand "
            f"{os.fspath(root).split('/')[0]!r}: no such home directory"
        ) from None


def writable(root: str) -> bool:
    """Whether this process may create files in the directory ``root`` (its permissions, and
    a read-only mount)."""
    return os.access(root, os.W_OK)


#: what to do about a root this user may not read
UNREADABLE_HINT = "run as a user who may read it, e.g. a member of its group"


def readable(root: str) -> bool:
    """Whether this process may list the directory ``root`` and read the files in it (its
    permissions, as the process's effective user and capabilities)."""
    effective = os.access in os.supports_effective_ids
    return os.access(root, os.R_OK | os.X_OK, effective_ids=effective)


# -- checks recorded per user --------------------------------------------------------------
_CHECK = re.compile(r"[a-z0-9-]{1,32}")
#: an entry's digest as its metadata writes it (``xxh3_128:<32 hex digits>``)
_DIGEST = re.compile(r"([a-z0-9_]{1,16}):([0-9a-f]{32,128})")


def _name(check: str, key: str, digest: object) -> str | None:
    """The record's file name, or None where a part is not what it should be."""
    if not _CHECK.fullmatch(check) or not KEY_PATTERN.fullmatch(key):
        return None
    found = _DIGEST.fullmatch(digest) if isinstance(digest, str) else None
    if found is None:
        return None
    return f"{os.geteuid()}.{check}.{key}.{found[1]}-{found[2]}"


def check_recorded(root: str, check: str, key: str, digest: object) -> bool:
    """Whether this user recorded ``check`` of the bytes of digest ``digest`` under ``key``:
    a regular file of this user under the record's name, of one link (another user who may
    write a file of this user could hard-link it there)."""
    name = _name(check, key, digest)
    if name is None:
        return False
    try:
        dfd = open_subdir(root, CHECKED_DIR, create=False)
    except OSError:
        return False
    try:
        st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except OSError:
        return False
    finally:
        os.close(dfd)
    return stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() and st.st_nlink == 1


def record_check(root: str, check: str, key: str, digest: object) -> None:
    """Record that this user made ``check`` of the bytes of digest ``digest`` under ``key``
    (never raises: a record that cannot be written costs the next process the check)."""
    name = _name(check, key, digest)
    if name is None:
        return
    try:
        dfd = open_subdir(root, CHECKED_DIR, create=True)
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):  # (FileExistsError: recorded, or another user's name)
            os.close(create_exclusive(name, dfd))
    finally:
        os.close(dfd)
