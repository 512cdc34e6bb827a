"""JAX's persistent compilation cache, beside the kernel cache.

Lowering (and so the kernel-cache lookup) runs in every process; JAX's cache then saves XLA's
own compile. Because the bridge's opaque is byte-identical across processes, a second process
hits JAX's cache for computations containing Triton kernels.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

logger = logging.getLogger(__name__)


def enable_jax_cache(
    dir: str | os.PathLike[str] | None = None,
    *,
    min_compile_time_secs: float = 0.0,
    min_entry_size_bytes: int = 0,
    max_size: int | None = None,
) -> Path:
    """Turn on JAX's persistent compilation cache and return its directory.

    Args:
        dir: the cache directory; None for one beside the kernel cache:
            ``<parent of the kernel cache root>/<root name>-jax``.
        min_compile_time_secs: cache executables whose XLA compile took at least this long
            (JAX's default of 1 s skips most small programs; 0 caches everything).
        min_entry_size_bytes: cache executables at least this large (0: all).
        max_size: a size cap in bytes (JAX then evicts least recently used entries under a
            file lock); None leaves JAX's default (unlimited).
    """
    import jax

    if dir is None:
        from .caches import default_cache

        root = Path(default_cache().root)
        dir = root.parent / f"{root.name}-jax"
    path = Path(dir).expanduser()
    path.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", float(min_compile_time_secs))
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", int(min_entry_size_bytes))
    if max_size is not None:
        jax.config.update("jax_compilation_cache_max_size", int(max_size))
    try:
        jax.config.update("jax_enable_compilation_cache", True)
    except AttributeError:  # older JAX without the switch
        pass
    logger.info("JAX persistent compilation cache at %s", path)
    return path
