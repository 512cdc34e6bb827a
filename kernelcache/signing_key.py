"""The signing key that signs and authenticates remote values and bundles: how long it must
be, and reading it from its file (``KERNELCACHE_SIGNING_KEY_FILE``).

Invariants: a key shorter than :data:`MIN_KEY_BYTES` is never used; a key file is read only
if it is a regular file that not every user can read, and at most :data:`MAX_KEY_FILE_BYTES`
of it; no message ever shows the key, only where it came from.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from .errors import ConfigError, NotRegularFile
from .fsio import open_regular

#: the shortest signing key accepted
MIN_KEY_BYTES = 16
#: the largest key file read
MAX_KEY_FILE_BYTES = 4096
_KEY_HINT = "e.g. the output of `openssl rand -hex 32`"


def check_signing_key(key: bytes, where: str) -> bytes:
    """``key`` if it is long enough to sign with.

    Raises:
        ConfigError: shorter than :data:`MIN_KEY_BYTES` (the message names ``where``, never
            the key).
    """
    if len(key) < MIN_KEY_BYTES:
        raise ConfigError(
            f"{where}: a signing key must be at least {MIN_KEY_BYTES} bytes ({_KEY_HINT})"
        )
    return key


def read_key_file(path: Path) -> bytes:
    """The signing key in ``path`` (surrounding whitespace removed).

    Raises:
        ConfigError: the file cannot be read, is not a regular file, is readable by every
            user, is too large, or holds a key shorter than :data:`MIN_KEY_BYTES`.
    """
    where = f"KERNELCACHE_SIGNING_KEY_FILE={str(path)!r}"
    try:
        with open_regular(os.fspath(path)) as f:
            st = os.fstat(f.fileno())
            if st.st_mode & stat.S_IROTH:
                raise ConfigError(f"{where}: the key is readable by every user; chmod o-r it")
            if st.st_size > MAX_KEY_FILE_BYTES:
                raise ConfigError(f"{where}: larger than {MAX_KEY_FILE_BYTES} bytes")
            raw = f.read(MAX_KEY_FILE_BYTES + 1)
    except NotRegularFile:
        raise ConfigError(f"{where}: not a regular file") from None
    except OSError as e:
        raise ConfigError(f"{where}: cannot read it: {e.strerror}") from None
    return check_signing_key(raw.strip(), where)
