"""Kernel keys: computed without compiling, from everything that decides the binary.

Ingredients, all Triton's own: the compiler's identity (what ``triton_key()`` hashes, digested
with xxh3 and memoized across processes: see :mod:`bridge.identity`), the source hash of the
kernel with its dependencies and specialization (``ASTSource.hash()``: ``fn.cache_key``,
signature, constexprs, attributes), the backend's identity (``backend.hash()``: the target and,
on CUDA, the ptxas version), the options (every field of the parsed options; extern libraries by
content, not path), and the environment variables Triton declares cache-invalidating. Plus the
language (Triton or Gluon), the target and the version of the bridge's own compile pipeline.

Invariants: the same call in any process on any machine with the same software gets the same
key; any change that can change the binary changes it.

:func:`key_components` names these ingredients one by one (the source hash split into the
kernel's source, its signature and its constexprs): each entry records them, so that a miss can
be explained by the ingredients that differ (``kernelcache explain``). They explain a key; they
never make one.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from typing import TYPE_CHECKING, Any

from .identity import backend_identity, triton_identity
from .targets import Target

if TYPE_CHECKING:
    from kernelcache import Cache

#: bump when the bridge's compile pipeline changes its output for the same inputs
PIPELINE_VERSION = "bridge-pipeline-1"


@functools.lru_cache(maxsize=256)
def file_digest(path: str, size: int, mtime_ns: int) -> str:
    """sha256 of a file's content, memoized per process by its identity."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def options_digest(options: Any) -> str:
    """sha256 over every field of Triton's options object, extern libraries by content."""
    fields = dict(vars(options))
    libs = []
    for name, path in fields.get("extern_libs") or ():
        st = os.stat(path)
        libs.append((name, file_digest(os.path.abspath(path), st.st_size, st.st_mtime_ns)))
    fields["extern_libs"] = sorted(libs)
    text = json.dumps(sorted((k, repr(v)) for k, v in fields.items()), separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def env_digest() -> str:
    """The environment variables Triton declares cache-invalidating, as set now."""
    from triton._C.libtriton import get_cache_invalidating_env_vars

    return json.dumps(sorted(get_cache_invalidating_env_vars().items()), separators=(",", ":"))


def source(fn: Any, gluon: bool, signature: Any, constexprs: Any, attrs: Any) -> Any:
    """Triton's source object for one specialization (``ASTSource`` or ``GluonASTSource``)."""
    if gluon:
        from triton.experimental.gluon._runtime import GluonASTSource

        return GluonASTSource(fn, signature, constexprs, attrs)
    from triton.compiler.compiler import ASTSource

    return ASTSource(fn, signature, constexprs, attrs)


def text_digest(text: str) -> str:
    """sha256 of ``text``: how a component that is not already a digest is recorded."""
    return hashlib.sha256(text.encode()).hexdigest()


#: the components of a key, in the order ``explain`` reports them, and what each is
COMPONENTS: dict[str, str] = {
    "pipeline": "the bridge's compile pipeline",
    "triton": "Triton version",
    "compiler": "compiler identity (Triton's files)",
    "target": "target",
    "backend": "backend identity (target, ptxas version)",
    "language": "language",
    "source": "source digest (the kernel and the functions it calls)",
    "signature": "signature digest (argument types and specialization)",
    "constexprs": "constexprs digest",
    "options": "options digest (num_warps, num_stages, ...)",
    "environment": "Triton's cache-invalidating environment variables",
}


def key_components(
    cache: Cache | None, target: Target, backend: Any, src: Any, options: Any, language: str
) -> dict[str, str]:
    """The ingredients of :func:`kernel_key`, named (see :data:`COMPONENTS`): what an entry
    records so that a miss can say which of them differ. The source hash is split the way
    Triton's ``ASTSource.hash()`` assembles it."""
    from .versions import triton_version

    sig = [v for _, v in sorted(src.signature.items())]
    constants = "-".join(
        v.cache_key if hasattr(v, "cache_key") else str(v) for _, v in sorted(src.constants.items())
    )
    return {
        "pipeline": PIPELINE_VERSION,
        "triton": triton_version(),
        "compiler": triton_identity(cache),
        "target": str(target),
        "backend": text_digest(backend_identity(cache, target, backend)),
        "language": language,
        "source": text_digest(str(src.fn.cache_key)),
        "signature": text_digest(f"{src.attrs}-{sig}"),
        "constexprs": text_digest(constants),
        "options": options_digest(options),
        "environment": text_digest(env_digest()),
    }


def kernel_key(
    cache: Cache, target: Target, backend: Any, src: Any, options: Any, language: str
) -> str:
    """The 64-hex-digit key of one compiled kernel (see the module docstring)."""
    parts = [
        PIPELINE_VERSION,
        triton_identity(cache),
        src.hash(),
        backend_identity(cache, target, backend),
        options_digest(options),
        env_digest(),
        language,
        str(target),
        str(getattr(backend, "binary_ext", "")),
    ]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def derived_key(key: str, role: str) -> str:
    """The key of a companion artifact of ``key`` (e.g. ``role="ptx"``)."""
    return hashlib.sha256(f"{key}:{role}".encode()).hexdigest()
