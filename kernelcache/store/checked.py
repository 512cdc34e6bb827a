"""What a user has checked of an entry beyond what a read checks, remembered across processes.

A read verifies an entry's digests; a package may check more of its content (the bridge
inflates every opaque of a program entry before serving any). So that the same user's next
process need not check the same bytes again, the check is recorded: one empty file per check,
key and digest in ``<root>/.checked/`` (a directory every user keeps files of their own in:
sticky in a shared root), named ``<uid>.<check>.<key>.<digest>`` (the digest's algorithm and
hex digits joined by ``-``).

Invariants: a record is believed only if it is a regular file owned by this user (another user
of a shared root can create files of any name there, never one owned by this user), so it
vouches only for what this user checked. The digest in its name ties it to the bytes checked:
an entry replaced, or its bytes altered with its digests made again, has another digest and no
record. Records are never read for content and never needed: a missing or unwritable one (or a
file another user planted under this user's record's name) costs the next process the check,
nothing else. A record of an entry that was since removed names
bytes no entry holds.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat

from ..keys import KEY_PATTERN
from .layout import CHECKED_DIR, create_exclusive, open_subdir

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
    """Whether this user recorded ``check`` of the bytes of digest ``digest`` under ``key``."""
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
    return stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid()


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
