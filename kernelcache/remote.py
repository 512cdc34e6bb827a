"""The remote tier shared by many machines.

Only the hook exists so far: :func:`open_remote` maps a URL to a :class:`~kernelcache.cache.RemoteTier`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from .config import ConfigError

if TYPE_CHECKING:
    from .cache import RemoteTier


def open_remote(url: str) -> RemoteTier:
    """Open the remote tier named by ``url``.

    Raises:
        ConfigError: the URL's scheme is not supported.
    """
    scheme = urlsplit(url).scheme
    raise ConfigError(f"remote tier {scheme or url!r} is not supported (no remote backend yet)")
