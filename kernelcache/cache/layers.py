"""The layers of a cache: one writable root, read-only roots searched after it (e.g. baked into
a container image), and the remote tiers, opened once from the settings and the arguments.

A read-only root that cannot serve anything (a relative path, a missing directory) is warned
about once; a remote tier that cannot be used as configured (its URL, its signing key) is off,
warned once, when it comes from the environment. Opening the layers is where a job first reads
its settings: a variable that cannot be used, or a ``KERNELCACHE_*`` name nothing declares, is
said there, once per process.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence

from .. import stats, units
from ..config import Settings, job_settings, warn_unknown_in_a_job
from ..errors import ConfigError, InvalidValue
from ..maintenance.capacity import SizeCap
from ..process import warn_once
from ..remote import RemoteTier, open_remote
from ..store.layout import resolve_root
from ..store.root import Store

logger = logging.getLogger(__name__)


def readonly_problem(root: str | os.PathLike[str]) -> str | None:
    """Why the read-only root ``root`` cannot serve anything as given, with the remedy; None
    when it is an absolute path to a directory."""
    path = os.fspath(root)
    if not os.path.isabs(path):
        return (
            f"{path!r} is a relative path, read from the current directory "
            f"({os.getcwd()}): give an absolute path"
        )
    if not os.path.isdir(path):
        what = "is not a directory" if os.path.lexists(path) else "does not exist"
        return f"{path} {what}: nothing is read from it (fix the path, or remove it)"
    return None


class Layers:
    """The layers of a :class:`~kernelcache.cache.Cache` and its settings, as given to its
    constructor (see :class:`~kernelcache.cache.Cache` for the arguments)."""

    def __init__(
        self,
        root: str | os.PathLike[str] | None = None,
        readonly_roots: Sequence[str | os.PathLike[str]] | None = None,
        remote: str | RemoteTier | Sequence[str | RemoteTier] | None = None,
        *,
        lock_timeout: float | None = None,
        lock_mode: str | None = None,
        max_size: int | str | None = None,
    ) -> None:
        cfg = job_settings()  # a variable that cannot be used costs only itself, said once
        warn_unknown_in_a_job()  # (a misspelt one too)
        self.lock_timeout = cfg.lock_timeout if lock_timeout is None else float(lock_timeout)
        mode = cfg.lock_mode if lock_mode is None else lock_mode
        self.store = Store.from_settings(
            resolve_root(root, cfg),
            cfg,
            lock_mode=mode,
            lock_timeout=self.lock_timeout,
            resolved=True,
        )
        self.root = self.store.root
        ro = cfg.readonly_roots if readonly_roots is None else readonly_roots
        named = "KERNELCACHE_READONLY_DIRS" if readonly_roots is None else "readonly_roots"
        for r in ro:
            problem = readonly_problem(r)
            if problem is not None:
                warn_once(logger, ("readonly", os.fspath(r)), "kernelcache: %s: %s", named, problem)
        self.readonly = [Store.from_settings(r, cfg, readonly=True) for r in ro]
        from_env = remote is None
        if remote is None:
            remote = cfg.remote or ""
        self.remote: RemoteTier | None
        if isinstance(remote, (str, list, tuple)):  # before the protocol's check, which is slow
            self.remote = self._open_remote(remote, cfg, from_env)
        elif isinstance(remote, RemoteTier):
            self.remote = remote
        else:
            self.remote = self._open_remote(remote, cfg, from_env)
        self.disabled = cfg.disable
        #: (key, ext) pairs :meth:`get` has validated (its hot path checks each pair once)
        self.valid: set[tuple[str, str]] = set()
        if cfg.stats_log and not self.disabled:
            stats.enable_log(self.root)
        cap = cfg.max_size if max_size is None else max_size
        if isinstance(cap, str):
            cap = units.parse_size(cap)
        if isinstance(cap, bool) or not isinstance(cap, int) or cap < 0:
            raise InvalidValue(f"max_size must be a size such as '50G' or bytes >= 0, not {cap!r}")
        #: the size cap of the writable root (None: none)
        self.capacity = SizeCap(self.store, cap) if cap and not self.disabled else None

    def _open_remote(
        self, remote: str | Sequence[str | RemoteTier], cfg: Settings, from_env: bool = False
    ) -> RemoteTier | None:
        """The remote tier of ``remote``; None (off, warned once) when the signing key that
        must authenticate its values cannot be used (never unsigned values instead), or when
        ``$KERNELCACHE_REMOTE`` (``from_env``) holds a URL its tier cannot use: never a failed
        job for a setting of the tier. A URL given as an argument that cannot be used is an
        error (ConfigError)."""
        if not remote:
            return None
        try:
            key = cfg.signing_secret()
        except ConfigError as e:
            warn_once(
                logger,
                ("signing-key", str(e)),
                "kernelcache: %s; the remote tier is off until the key is fixed (local layers "
                "still work; `kernelcache doctor` checks it)",
                e,
            )
            return None
        try:
            return open_remote(
                remote, stats_root=self.root, signing_key=key, overwrite=cfg.remote_overwrite
            )
        except ConfigError as e:
            if not from_env:
                raise
            warn_once(
                logger,
                ("remote-url", str(e)),
                "kernelcache: KERNELCACHE_REMOTE: %s; the remote tier is off until it is fixed "
                "(local layers still work; `kernelcache doctor` checks it)",
                e,
            )
            return None

    def __repr__(self) -> str:
        ro = [s.root for s in self.readonly]
        return f"Cache(root={self.root!r}, readonly_roots={ro!r}, remote={self.remote!r})"

    @property
    def layers(self) -> list[Store]:
        """The local roots in search order: the writable root, then the read-only ones."""
        return [self.store, *self.readonly]
