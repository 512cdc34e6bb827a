"""The one place that reads kernelcache's environment variables.

Every setting is read through :func:`settings`, which parses the environment each time it is
called (cheap), so tests and launchers can change variables between calls. Nothing else in
``kernelcache`` or ``bridge`` reads ``os.environ`` for its own configuration.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

#: name -> (meaning, default shown in the README)
VARIABLES: dict[str, tuple[str, str]] = {
    "KERNELCACHE_DIR": ("writable cache root", "platformdirs user cache dir for 'kernelcache'"),
    "KERNELCACHE_READONLY_DIRS": (
        "read-only roots searched after the writable root, separated by ':'",
        "(none)",
    ),
    "KERNELCACHE_REMOTE": ("remote tier URL, e.g. redis://host:6379/0", "(none)"),
    "KERNELCACHE_TARGET": ("compile target for the bridge, e.g. cuda:90 or hip:gfx942", "detected"),
    "KERNELCACHE_EMBED": ("how the bridge embeds kernels: auto, inline, ptx, path", "auto"),
    "KERNELCACHE_RECORD": ("append every lowered specialization to this manifest file", "(off)"),
    "KERNELCACHE_LOCK_TIMEOUT": ("seconds to wait for a per-key lock before going private", "120"),
    "KERNELCACHE_LOCK_MODE": ("auto, flock or soft (O_EXCL lock files for NFS)", "auto"),
    "KERNELCACHE_LOCK_STALE": ("seconds after which another host's soft lock is stale", "300"),
    "KERNELCACHE_DISABLE": ("1: bypass the cache entirely (compile in memory)", "0"),
    "KERNELCACHE_STATS_LOG": ("0: do not append per-process stats logs under the root", "1"),
    "KERNELCACHE_TRUST": (
        "whose artifacts are served: group (owner, root, root dir's owner and group), owner, any",
        "group",
    ),
}

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


class ConfigError(ValueError):
    """An environment variable holds a value kernelcache cannot use."""


def _flag(env: dict[str, str], name: str, default: bool) -> bool:
    raw = env.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ConfigError(f"{name}={raw!r} is not a boolean; use 1 or 0")


def _seconds(env: dict[str, str], name: str, default: float) -> float:
    raw = env.get(name)
    if raw is None or not raw.strip():
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a number of seconds") from None
    if not value >= 0:
        raise ConfigError(f"{name}={raw!r} must be a non-negative number of seconds")
    return value


def _choice(env: dict[str, str], name: str, default: str, allowed: tuple[str, ...]) -> str:
    raw = env.get(name)
    if raw is None or not raw.strip():
        return default
    value = raw.strip().lower()
    if value not in allowed:
        raise ConfigError(f"{name}={raw!r} is not one of {', '.join(allowed)}")
    return value


def _path(env: dict[str, str], name: str) -> Path | None:
    raw = env.get(name)
    if raw is None or not raw.strip():
        return None
    return Path(raw).expanduser()


@dataclass(frozen=True)
class Settings:
    """A snapshot of the environment, parsed and validated."""

    dir: Path | None = None
    readonly_dirs: tuple[Path, ...] = ()
    remote: str | None = None
    target: str | None = None
    embed: str = "auto"
    record: Path | None = None
    lock_timeout: float = 120.0
    lock_mode: str = "auto"
    lock_stale: float = 300.0
    disable: bool = False
    stats_log: bool = True
    trust: str = "group"


def settings(environ: dict[str, str] | None = None) -> Settings:
    """Parse kernelcache's variables from ``environ`` (default: ``os.environ``).

    Raises:
        ConfigError: a variable is set to a value that cannot be used; the message names it.
    """
    env = dict(os.environ if environ is None else environ)
    readonly = tuple(
        Path(p).expanduser()
        for p in env.get("KERNELCACHE_READONLY_DIRS", "").split(os.pathsep)
        if p
    )
    remote = env.get("KERNELCACHE_REMOTE", "").strip() or None
    target = env.get("KERNELCACHE_TARGET", "").strip() or None
    return Settings(
        dir=_path(env, "KERNELCACHE_DIR"),
        readonly_dirs=readonly,
        remote=remote,
        target=target,
        embed=_choice(env, "KERNELCACHE_EMBED", "auto", ("auto", "inline", "ptx", "path")),
        record=_path(env, "KERNELCACHE_RECORD"),
        lock_timeout=_seconds(env, "KERNELCACHE_LOCK_TIMEOUT", 120.0),
        lock_mode=_choice(env, "KERNELCACHE_LOCK_MODE", "auto", ("auto", "flock", "soft")),
        lock_stale=_seconds(env, "KERNELCACHE_LOCK_STALE", 300.0),
        disable=_flag(env, "KERNELCACHE_DISABLE", False),
        stats_log=_flag(env, "KERNELCACHE_STATS_LOG", True),
        trust=_choice(env, "KERNELCACHE_TRUST", "group", ("group", "owner", "any")),
    )


def environment_in_effect(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The kernelcache variables that are set, for diagnostics (values as given)."""
    env = os.environ if environ is None else environ
    return {name: env[name] for name in VARIABLES if name in env}
