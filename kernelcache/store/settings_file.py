"""A root's own configuration file, ``<root>/.kernelcache.conf``: the settings its jobs and
commands read under the environment (ccache's ``ccache.conf``; ``kernelcache -M``, ``-o`` write
it, ``-p`` shows where each setting comes from).

The file is lines of ``key = value`` (``#`` starts a comment), a key being a setting's name
without ``KERNELCACHE_``, in lower case (``max_size = 50G``): only the settings declared
:attr:`~kernelcache.config.Variable.in_file` (those of the root: its size cap, how its entries
are written, its locks, its statistics logs), never the root itself, a secret, a remote tier or
the trust policy, which are the job's.

Invariants: the file is untrusted input. It is read only as a regular file (never through a
symlink, never a FIFO), at most :data:`MAX_BYTES`, and used only where the trust policy
accepts its owner and mode, as an entry's files are; anything it holds that cannot be used is
said (:attr:`RootFile.problems`) and left out, never an exception: a job warns once, and a
value of a known key that cannot be used is said by :func:`~kernelcache.config.settings` where
it is used. It is written whole (staged, then ``os.replace``), values checked first.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field

from ..config import VARIABLES, FileValues, Variable, parse_variable
from ..errors import ConfigError, UsageError
from ..fsio import READ_FLAGS
from ..process import printable, warn_once
from .layout import SETTINGS_FILE, TMP_DIR, open_subdir, replace_file
from .trust import TrustPolicy

logger = logging.getLogger(__name__)

#: the file's name in a root (hidden: it is no entry)
NAME = SETTINGS_FILE
#: the most a file may hold; a larger one is not read
MAX_BYTES = 64 << 10
HEADER = (
    "# kernelcache: the settings of this root, under the environment's KERNELCACHE_* variables\n"
    "# (kernelcache -o KEY=VALUE sets one, kernelcache -p shows every setting and its origin)\n"
)


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


def path_of(root: str | os.PathLike[str]) -> str:
    """The configuration file of ``root``."""
    return os.path.join(os.fspath(root), NAME)


def read(root: str | os.PathLike[str], trust: str) -> RootFile:
    """The configuration file of ``root``, as the trust policy ``trust`` lets it be used.
    Never raises."""
    path = path_of(root)
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
        raw = os.read(fd, MAX_BYTES + 1)
    except OSError as e:
        return RootFile(path, True, problems=(f"{path} cannot be read: {e.strerror}: not used",))
    finally:
        os.close(fd)
    if len(raw) > MAX_BYTES:
        return RootFile(
            path, True, problems=(f"{path} is larger than {MAX_BYTES:,} bytes: not used",)
        )
    values, problems = parse(raw.decode("utf-8", errors="replace"), path)
    return RootFile(path, True, values, problems)


def parse(text: str, path: str) -> tuple[dict[str, str], tuple[str, ...]]:
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
            problems.append(f"{where}: {unknown(key)}: left out")
        else:
            values[key.lower()] = value
    return values, tuple(problems)


def unknown(key: str) -> str:
    """What is said of ``key``, which a root's file cannot hold."""
    return f"{printable(key[:80])!r} is not a setting of a root's file (one of {', '.join(file_variables())})"


def file_values(root: str | os.PathLike[str], trust: str) -> FileValues:
    """The values of ``root``'s file for a job's settings; what cannot be used is said once."""
    found = read(root, trust)
    for problem in found.problems:
        warn_once(logger, ("settings-file", problem), "kernelcache: %s", problem)
    return found.as_settings()


def write(root: str | os.PathLike[str], updates: Mapping[str, str | None]) -> RootFile:
    """Set (a value) or remove (None) the settings ``updates`` names in ``root``'s file, made
    with the root if need be; the other lines are kept as they are. Returns the file as it is
    now.

    Raises:
        UsageError: a key a root's file cannot hold, or a value its setting refuses (the
            message says which and what is accepted); nothing was written.
        OSError: the file could not be written (the old one is intact).
    """
    known = file_variables()
    path = path_of(root)
    for key, value in updates.items():
        if key not in known:
            raise UsageError(f"{unknown(key)}; nothing was written")
        if value is not None:
            try:
                parse_variable(known[key], {}, {known[key].name: (path, value)})
            except ConfigError as e:
                raise UsageError(f"{e}; nothing was written") from None
    lines = _current_lines(path)
    done = set()
    out = []
    for line in lines:
        key = line.partition("=")[0].strip().lower()
        if "=" in line and not line.lstrip().startswith("#") and key in updates:
            if updates[key] is not None and key not in done:
                out.append(f"{key} = {updates[key]}\n")
            done.add(key)
        else:
            out.append(line)
    out += [f"{k} = {v}\n" for k, v in updates.items() if v is not None and k not in done]
    os.makedirs(root, exist_ok=True)
    _replace(os.fspath(root), "".join(out).encode())
    values, problems = parse("".join(out), path)
    return RootFile(path, True, values, problems)


def _replace(root: str, data: bytes) -> None:
    """Write ``data`` as ``root``'s file, whole: staged under ``.tmp/``, then ``os.replace``d
    (readers see the old file or the new one)."""
    rfd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        tfd = open_subdir(root, TMP_DIR, create=True)
        try:
            replace_file(rfd, NAME, data, staging=tfd)
        finally:
            os.close(tfd)
    finally:
        os.close(rfd)


def _current_lines(path: str) -> list[str]:
    """The lines of the file at ``path`` to keep, each ending in a newline (a new file: the
    header)."""
    try:
        fd = os.open(path, READ_FLAGS)
    except FileNotFoundError:
        return HEADER.splitlines(keepends=True)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UsageError(f"{path} is not a regular file: remove it first; nothing was written")
        raw = os.read(fd, MAX_BYTES + 1)
    finally:
        os.close(fd)
    if len(raw) > MAX_BYTES:
        raise UsageError(f"{path} is larger than {MAX_BYTES:,} bytes: fix it by hand first")
    return [
        line if line.endswith("\n") else line + "\n"
        for line in raw.decode(errors="replace").splitlines()
    ]
