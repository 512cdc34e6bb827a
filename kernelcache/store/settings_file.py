"""A root's own configuration file, ``<root>/.kernelcache.conf``, written: the settings its jobs
and commands read under the environment (ccache's ``ccache.conf``; ``kernelcache -M``, ``-o``
write it, ``-p`` shows where each setting comes from). It is read as the rest of a root's
layout is, by :mod:`.layout` (:func:`~.layout.read_settings`), on a warm hit's path.

The file is lines of ``key = value`` (``#`` starts a comment), a key being a setting's name
without ``KERNELCACHE_``, in lower case (``max_size = 50G``): only the settings declared
:attr:`~kernelcache.config.Variable.in_file` (those of the root: its size cap, how its entries
are written, its locks, its statistics logs), never the root itself, a secret, a remote tier or
the trust policy, which are the job's.

Invariants: the file is untrusted input. It is read only as a regular file (never through a
symlink, never a FIFO), at most :data:`MAX_SETTINGS_BYTES`, and used only where the trust policy
accepts its owner and mode, as an entry's files are; anything it holds that cannot be used is
said (:attr:`RootFile.problems`) and left out, never an exception: a job warns once, and a
value of a known key that cannot be used is said by :func:`~kernelcache.config.settings` where
it is used. It is written whole (staged, then ``os.replace``), values checked first.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping

from ..config import parse_variable
from ..errors import ConfigError, UsageError
from ..fsio import READ_FLAGS
from .layout import (
    MAX_SETTINGS_BYTES,
    SETTINGS_FILE,
    TMP_DIR,
    RootFile,
    file_variables,
    open_subdir,
    parse_settings,
    replace_file,
    settings_path,
    unknown_setting,
)

#: the file's name in a root (hidden: it is no entry)
NAME = SETTINGS_FILE
HEADER = (
    "# kernelcache: the settings of this root, under the environment's KERNELCACHE_* variables\n"
    "# (kernelcache -o KEY=VALUE sets one, kernelcache -p shows every setting and its origin)\n"
)


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
    path = settings_path(root)
    for key, value in updates.items():
        if key not in known:
            raise UsageError(f"{unknown_setting(key)}; nothing was written")
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
    values, problems = parse_settings("".join(out), path)
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
        raw = os.read(fd, MAX_SETTINGS_BYTES + 1)
    finally:
        os.close(fd)
    if len(raw) > MAX_SETTINGS_BYTES:
        raise UsageError(
            f"{path} is larger than {MAX_SETTINGS_BYTES:,} bytes: fix it by hand first"
        )
    return [
        line if line.endswith("\n") else line + "\n"
        for line in raw.decode(errors="replace").splitlines()
    ]
