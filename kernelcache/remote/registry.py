"""Remote tiers by URL scheme. ``redis://``, ``rediss://``, ``unix://`` and ``redis+cluster://``
(the Redis tier) and ``s3://`` and ``gs://`` (the object-store tier) are built in; installed
packages add schemes through the entry-point group
``kernelcache.remotes``: an entry point named by the scheme, pointing at a
:class:`~kernelcache.remote.tier.TierClass` (docs/remote.md, "Other backends").

Invariants: opening a tier never connects; an unknown scheme is a
:class:`~kernelcache.errors.ConfigError` that names the known ones; a plugin that fails to load
or to make its tier never fails the job (one warning, and no remote tier).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from ..errors import BadPlugin, ConfigError
from ..process import warn_once
from .tier import RemoteTier
from .url import SCHEMES as REDIS_SCHEMES
from .url import parse_url, redact, scrub, secrets_of

#: the object stores' schemes (kernelcache.remote.objstore, imported when used)
OBJECT_SCHEMES = ("s3", "gs")
#: the built-in schemes
SCHEMES = (*REDIS_SCHEMES, *OBJECT_SCHEMES)

if TYPE_CHECKING:
    from importlib.metadata import EntryPoint  # imported when a plugin is looked for

#: the entry-point group of remote tiers that other packages add, named by URL scheme
GROUP = "kernelcache.remotes"

logger = logging.getLogger("kernelcache.remote")


def schemes() -> list[str]:
    """The URL schemes a remote tier can have here: the built-in ones, then the plugins'."""
    from importlib.metadata import entry_points

    plugins = {ep.name for ep in entry_points(group=GROUP)}.difference(SCHEMES)
    return [*SCHEMES, *sorted(plugins)]


def _scheme(url: str) -> str:
    try:
        return urlsplit(url.strip()).scheme
    except ValueError as e:
        raise ConfigError(f"remote URL {redact(url)!r} is malformed: {e}") from None


def _plugin(url: str, scheme: str) -> EntryPoint:
    """The installed entry point of ``scheme``.

    Raises:
        ConfigError: no package registers ``scheme``.
    """
    from importlib.metadata import entry_points

    for ep in entry_points(group=GROUP, name=scheme):
        return ep
    raise ConfigError(
        f"remote URL {redact(url)!r}: unsupported scheme {scheme!r}; known schemes: "
        f"{', '.join(schemes())} (a package adds one through the entry-point group {GROUP})"
    )


def _open_plugin(
    plugin: EntryPoint, url: str, stats_root: str | None, signing_key: bytes | None
) -> RemoteTier:
    """Load ``plugin`` and make its tier of ``url``. Raises ConfigError for the URL, anything
    else for a broken plugin."""
    tier = plugin.load()(url, stats_root=stats_root, signing_key=signing_key)
    if not isinstance(tier, RemoteTier):
        raise BadPlugin(f"it made a {type(tier).__name__}, which lacks get, put or acquire")
    return tier


def _broken(plugin: EntryPoint, url: str, e: Exception) -> str:
    reason = scrub(f"{type(e).__name__}: {e}", secrets_of(url))
    return f"the remote tier plugin {plugin.name} = {plugin.value} ({GROUP}) failed: {reason}"


def client_of(url: str) -> str | None:
    """The optional package the built-in tier of ``url`` talks through ("redis" or "obstore",
    see :mod:`kernelcache.optional`); None for a plugin's scheme or a malformed URL."""
    try:
        scheme = _scheme(url)
    except ConfigError:
        return None
    if scheme in REDIS_SCHEMES:
        return "redis"
    return "obstore" if scheme in OBJECT_SCHEMES else None


def split_urls(spec: str) -> list[str]:
    """The URLs of a list of remote tiers (``$KERNELCACHE_REMOTE``): separated by whitespace,
    which no URL contains unencoded (a cluster's nodes are separated by commas)."""
    return spec.split()


def open_remote(
    spec: str | Sequence[str | RemoteTier],
    *,
    stats_root: str | None = None,
    signing_key: bytes | None = None,
    overwrite: bool = False,
) -> RemoteTier | None:
    """The remote tier of a URL, or of several (a whitespace-separated list, or a sequence of
    URLs and tiers) as one :class:`~kernelcache.remote.layered.LayeredTier` tried in order;
    None for none. Does not connect.

    A tier whose plugin is broken is left out (one warning each).

    Raises:
        ConfigError: as :func:`open_one`, for any URL of the list.
    """
    items = split_urls(spec) if isinstance(spec, str) else list(spec)
    tiers = [
        open_one(item, stats_root=stats_root, signing_key=signing_key, overwrite=overwrite)
        if isinstance(item, str)
        else item
        for item in items
    ]
    found = [t for t in tiers if t is not None]
    if len(items) <= 1:
        return found[0] if found else None
    from .layered import LayeredTier

    return LayeredTier(found, stats_root=stats_root) if found else None


def open_one(
    url: str,
    *,
    stats_root: str | None = None,
    signing_key: bytes | None = None,
    overwrite: bool = False,
) -> RemoteTier | None:
    """The remote tier of ``url``, by its scheme; see :class:`~kernelcache.remote.tier.TierClass`
    for the arguments. Does not connect. ``overwrite``: built-in tiers replace values they
    cannot verify when they write the same key (``KERNELCACHE_REMOTE_OVERWRITE``); a plugin's
    tier keeps its own policy.

    Returns None, after one warning per scheme and process, when the scheme's plugin cannot be
    loaded or fails to make its tier: the job goes on without a remote tier.

    Raises:
        ConfigError: the scheme is unknown, or the tier refuses the URL or an option (the
            message never shows a secret).
    """
    scheme = _scheme(url)
    if scheme in REDIS_SCHEMES:
        from .redis import RedisTier

        return RedisTier(url, stats_root=stats_root, signing_key=signing_key, overwrite=overwrite)
    if scheme in OBJECT_SCHEMES:
        from .objstore import ObjectStoreTier

        return ObjectStoreTier(
            url, stats_root=stats_root, signing_key=signing_key, overwrite=overwrite
        )
    plugin = _plugin(url, scheme)
    try:
        return _open_plugin(plugin, url, stats_root, signing_key)
    except ConfigError:
        raise
    except Exception as e:  # a broken plugin is reported, never fatal to the job
        warn_once(
            logger,
            (GROUP, scheme),
            "kernelcache: %s; continuing without a remote tier",
            _broken(plugin, url, e),
        )
        return None


def check_url(spec: str) -> None:
    """What ``kernelcache doctor`` checks of ``$KERNELCACHE_REMOTE``: each URL of the list has
    a known scheme whose tier accepts it. A Redis or object-store URL is parsed without its
    (optional) client; a plugin's tier is made (which does not connect). Nothing is logged.

    Raises:
        ConfigError: unknown scheme, a broken plugin, or a URL its tier refuses.
    """
    for url in split_urls(spec):
        _check_one(url)


def _check_one(url: str) -> None:
    scheme = _scheme(url)
    if scheme in REDIS_SCHEMES:
        parse_url(url)
        return
    if scheme in OBJECT_SCHEMES:
        from .objstore.location import parse_object_url

        parse_object_url(url)
        return
    plugin = _plugin(url, scheme)
    try:
        _open_plugin(plugin, url, None, None)
    except ConfigError:
        raise
    except Exception as e:
        raise ConfigError(_broken(plugin, url, e)) from None


def probe(url: str, *, stats_root: str | None = None) -> dict[str, Any]:
    """Ask the tier of one ``url`` whether it answers (``kernelcache stats --remote``):
    ``{"tier", "read_only", "up", "seconds", "error", "usage"}``, ``usage`` being what a tier
    that counts its entries says (``{"entries", "bytes", "complete", "server_keys"}``, bounded:
    see :meth:`~kernelcache.remote.redis.RedisTier.usage`), else None. Never raises: a URL
    that cannot be used is a tier that is not up."""
    from .layered import label_of

    started = time.monotonic()
    error: str | None = None
    tier: object = None
    usage: dict[str, Any] | None = None
    try:
        tier = open_one(url, stats_root=stats_root)
        check = getattr(tier, "probe", None)
        if tier is None:
            error = "its plugin is broken"
        elif callable(check):
            error = check()
            count = getattr(tier, "usage", None)
            if error is None and callable(count):
                usage = count()
        else:  # a plugin's tier: a miss is an answer
            tier.get("0" * 32, "probe")
    except Exception as e:
        error = scrub(f"{type(e).__name__}: {e}", secrets_of(url))
    return {
        "tier": label_of(tier) if tier is not None else redact(url).split("?", 1)[0],
        "read_only": bool(getattr(tier, "read_only", False)),
        "up": error is None,
        "seconds": round(time.monotonic() - started, 6),
        "error": error,
        "usage": usage,
    }
