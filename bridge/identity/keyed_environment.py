"""What a read set keeps of an environment variable read while a kernel compiled: absent, or a
digest of its value keyed by a secret (:func:`environment_want`), never the value, nor anything
a guess of it can be tested against by whoever reads the entry.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import os
from typing import Any

from .static_reads import MISSING as ABSENT


def environment_want(name: str, value: str | None) -> Any:
    """What a read of the environment variable ``name`` set to ``value`` finds: absent, or a
    digest of its value keyed by this user's secret (:func:`environment_secret`), so that no
    entry holds a value, nor anything a guess of it can be tested against."""
    if value is None:
        return ABSENT
    mac = hmac.new(environment_secret(), f"{name}\0{value}".encode(), hashlib.sha256)
    return "k:" + mac.hexdigest()[:32]


@functools.lru_cache(maxsize=1)
def environment_secret() -> bytes:
    """The key of :func:`environment_want`: the job's signing key where it has one (every
    process of the fleet shares it), else this user's own (made once, kept in the user's
    configuration directory, readable by the user alone), else this process's."""
    try:
        from kernelcache.plugin import job_settings

        secret = job_settings().signing_secret()
    except Exception:  # (an unusable signing key is said where it is used: here, none)
        secret = None
    if secret is not None:
        return hmac.new(secret, b"kernelcache environment", hashlib.sha256).digest()
    return _user_key() or os.urandom(32)


def _user_key() -> bytes | None:
    import platformdirs

    from kernelcache.plugin import open_regular

    path = os.path.join(platformdirs.user_config_dir("kernelcache", appauthor=False), "env.key")
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        except FileExistsError:
            pass
        else:
            with os.fdopen(fd, "wb") as f:
                f.write(os.urandom(32).hex().encode())
        with open_regular(path) as f:
            st = os.fstat(f.fileno())
            if st.st_uid != os.geteuid() or st.st_mode & 0o077:
                return None
            key = bytes.fromhex(f.read(64).decode())
        return key if len(key) == 32 else None
    except (OSError, ValueError):
        return None
