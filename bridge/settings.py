"""The bridge's environment variables, declared to kernelcache's configuration (so that
``kernelcache doctor`` and the documentation list them) and parsed here.

:func:`settings` re-parses only when one of their values changed, like kernelcache's own; it
raises for a value that cannot be used (the commands). :func:`job_settings` never does (a
lowering in a user's job): that variable alone is left at its default, said once.

The kernel cache a call uses follows from the same configuration (:func:`as_cache`): the
process's default one per configuration of kernelcache's variables, or the one the caller passed
(a ``kernelcache.Cache`` or a cache root directory).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

from kernelcache import Cache
from kernelcache.plugin import (
    choice,
    parse_variable,
    parser,
    path,
    register_variables,
    setting,
    variables_of,
)

from .vendors.vendor import parse_name, registered

if TYPE_CHECKING:
    from kernelcache.plugin import Settings

    #: what callers may pass as a cache: a Cache, a cache root directory, or None (the default)
    CacheArg: TypeAlias = Cache | str | os.PathLike[str] | None

#: how a compiled kernel rides in jaxlib's custom call (see :mod:`bridge.embed.modes`):
#: "auto", then every mode a registered vendor offers
EMBED_MODES = ("auto", *dict.fromkeys(m for vendor in registered() for m in vendor.embed_modes()))
#: which config of an autotuned call runs (see :mod:`bridge.tune.select`): the decision in the cache
#: (else jaxlib's autotuning at the first run), always jaxlib's, a decision or an error, or a
#: decision made by one process of the job when there is none
AUTOTUNE_MODES = ("decided", "runtime", "require", "job")
#: which jax-triton's API ``import jax_triton`` gives under the bridge (see
#: :mod:`bridge.masquerade`)
JAX_TRITON_APIS = ("0.3", "0.4")


def _fraction(raw: str) -> float:
    value = float(raw)
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{raw!r} is not a fraction from 0 to 1")
    return value


def _target(raw: str) -> str:
    value = raw.strip()
    parse_name(value)
    return value


@dataclass(frozen=True)
class BridgeSettings:
    """The bridge's variables, parsed: one field per variable, each declared with
    :func:`kernelcache.config.setting` (its name, parser, default and meaning, once)."""

    target: str | None = setting(
        "KERNELCACHE_TARGET",
        _target,
        None,
        "detected",
        "compile target for the bridge, e.g. cuda:90 or hip:gfx942",
    )
    embed: str = setting(
        "KERNELCACHE_EMBED",
        choice(*EMBED_MODES),
        "auto",
        "auto",
        f"how the bridge embeds kernels: {', '.join(EMBED_MODES)}",
    )
    autotune: str = setting(
        "KERNELCACHE_AUTOTUNE",
        choice(*AUTOTUNE_MODES),
        "decided",
        "decided",
        f"which config of an autotuned call runs: {', '.join(AUTOTUNE_MODES)}",
    )
    record: Path | None = setting(
        "KERNELCACHE_RECORD",
        path,
        None,
        "(off)",
        "append every lowered specialization to this manifest file",
    )
    jax_triton: str | None = setting(
        "KERNELCACHE_JAX_TRITON",
        choice(*JAX_TRITON_APIS),
        None,
        "the installed jax-triton's, else 0.4",
        "which jax-triton's API `import jax_triton` gives under `kernelcache run` or "
        f"bridge.install_jax_triton(): {', '.join(JAX_TRITON_APIS)}",
    )
    audit: float = setting(
        "KERNELCACHE_AUDIT",
        _fraction,
        0.0,
        "0",
        "the fraction (0 to 1) of the job's cache hits (kernels, stored lowerings, program "
        "entries) made again in the job and compared with what was served",
    )


#: the bridge's variables, in the order :class:`BridgeSettings` declares them
VARIABLES = variables_of(BridgeSettings)
register_variables(*VARIABLES)

_parse = parser(VARIABLES, BridgeSettings)
_job_parse = parser(VARIABLES, BridgeSettings, in_a_job=True)


def settings(environ: Mapping[str, str] | None = None) -> BridgeSettings:
    """Parse the bridge's variables from ``environ`` (default: ``os.environ``; parsed again only
    when one of their values changed).

    Raises:
        kernelcache.ConfigError: a variable is set to a value that cannot be used.
    """
    return _parse(environ)


def setting_value(name: str, environ: Mapping[str, str] | None = None) -> Any:
    """The value of the bridge's variable ``name`` alone (its default when unset), whatever the
    others hold: what reads one setting (``kernelcache run``'s jax-triton API, the target of
    ``import --dry-run``) and must not stop at another that cannot be used.

    Raises:
        kernelcache.ConfigError: that variable is set to a value that cannot be used.
    """
    (var,) = (v for v in VARIABLES if v.name == name)
    return parse_variable(var, environ)


def job_settings(environ: Mapping[str, str] | None = None) -> BridgeSettings:
    """:func:`settings` for a lowering in a user's job (:func:`kernelcache.config.parser`,
    ``in_a_job``): a variable that cannot be used is said once and costs only itself (its
    default); the others apply."""
    return _job_parse(environ)


# -- the kernel cache a call uses -------------------------------------------------------------
_default: dict[Settings, Cache] = {}
_default_lock = threading.Lock()


def default_cache(cfg: Settings | None = None) -> Cache:
    """The process's kernel cache configured from the environment (one per configuration;
    ``cfg`` is a ``kernelcache.config.settings()`` snapshot, read now when None)."""
    from kernelcache.plugin import settings

    cfg = cfg or settings()
    with _default_lock:
        cache = _default.get(cfg)
        if cache is None:
            cache = _default[cfg] = Cache()
        return cache


def as_cache(cache: CacheArg, cfg: Settings | None = None) -> Cache:
    """``cache`` as a kernelcache.Cache: None for the default, or a root directory path."""
    if cache is None:
        return default_cache(cfg)
    if isinstance(cache, (str, os.PathLike)):
        return Cache(root=cache)
    return cache
