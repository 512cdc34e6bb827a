"""Kernel keys: computed without compiling, from everything that decides the binary.

Ingredients, named one by one in :data:`COMPONENTS` and listed once (:func:`key_components`):
the compiler's identity (what ``triton_key()`` hashes, digested with xxh3 and memoized across
processes: see :mod:`bridge.identity.compiler`), the kernel's code as Triton's ``cache_key`` holds it
(its source and the jitted functions and constexpr globals it reaches by name), the code as
:mod:`bridge.identity.jit` identifies it (everything the frontend reads besides: constexprs
reached as attributes of other modules, globals read by a ``constexpr_function``, helpers and
values rebound since Triton memoized its key), the signature and specialization, every
constexpr described exactly (:func:`bridge.identity.jit.constant`, never by its ``str``), the
backend's identity (``backend.hash()``: the target and, on CUDA, the ptxas version), the
options (every field of the parsed options; extern libraries by content, not path), the
environment variables Triton declares cache-invalidating, the language, the target, the
binary's kind and the version of the bridge's own compile pipeline. Triton's own source hash
(``ASTSource.hash()``) is part of the key too, so whatever a Triton release adds to it counts.

Invariants: the same call in any process on any machine with the same software gets the same
key; any change that can change the binary changes it. A constexpr that cannot be described
exactly raises :class:`~bridge.identity.jit.Undescribable`: such a kernel has no key.

Each entry records the components, so that a miss can be explained by the ingredients that
differ (``kernelcache explain``); the key is a digest of the same components.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from typing import TYPE_CHECKING, Any

from ..errors import Undescribable
from ..targets import Target
from .compiler import backend_identity, triton_identity
from .jit import constant, identity

if TYPE_CHECKING:
    from kernelcache import Cache

#: bump when the bridge's compile pipeline changes its output for the same inputs
PIPELINE_VERSION = "bridge-pipeline-2"


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
    "code": "code digest (every global, attribute and helper the frontend reads)",
    "signature": "signature digest (argument types and specialization)",
    "constexprs": "constexprs digest",
    "options": "options digest (num_warps, num_stages, ...)",
    "environment": "Triton's cache-invalidating environment variables",
    "binary": "kind of machine code",
}


def constexprs_digest(fn: Any, constants: Any) -> str:
    """The digest of the constexprs (``ASTSource.constants``) of a specialization of the JIT
    function ``fn``, each described exactly (:func:`bridge.identity.jit.constant`).

    Raises:
        Undescribable: a constexpr has no exact description (the message names it).
    """
    rows = []
    for path, value in sorted(constants.items()):
        try:
            rows.append([repr(path), constant(value)])
        except ValueError as e:  # (Undescribable, or a repr that fails)
            where = path if isinstance(path, tuple) else (path,)
            names = list(getattr(fn, "arg_names", ()))
            first = where[0] if where and isinstance(where[0], int) else None
            name = names[first] if first is not None and first < len(names) else str(path)
            raise Undescribable(f"its constexpr {name}: {e}", where) from e
    return text_digest(repr(rows))


def code_digest(fn: Any) -> str:
    """The identity of the JIT function ``fn`` (:func:`bridge.identity.jit.identity`).

    Raises:
        Undescribable: a value its code reads has no description (a ``repr`` that fails).
    """
    try:
        return identity(fn)
    except ValueError as e:
        raise Undescribable(f"its code reads {e}") from e


def key_components(
    cache: Cache | None, target: Target, backend: Any, src: Any, options: Any, language: str
) -> dict[str, str]:
    """The ingredients of :func:`kernel_key`, named (see :data:`COMPONENTS`): the key is their
    digest, and an entry records them, so that a miss can say which of them differ. The source
    hash is split the way Triton's ``ASTSource.hash()`` assembles it.

    Raises:
        Undescribable: a constexpr of ``src``, or a value its code reads, has no description.
    """
    from ..versions import triton_version

    sig = [v for _, v in sorted(src.signature.items())]
    return {
        "pipeline": PIPELINE_VERSION,
        "triton": triton_version(),
        "compiler": triton_identity(cache),
        "target": str(target),
        "backend": text_digest(backend_identity(cache, target, backend)),
        "language": language,
        "source": text_digest(str(src.fn.cache_key)),
        "code": code_digest(src.fn),
        "signature": text_digest(f"{src.attrs}-{sig}"),
        "constexprs": constexprs_digest(src.fn, src.constants),
        "options": options_digest(options),
        "environment": text_digest(env_digest()),
        "binary": str(getattr(backend, "binary_ext", "")),
    }


def kernel_key(
    cache: Cache, target: Target, backend: Any, src: Any, options: Any, language: str
) -> str:
    """The 64-hex-digit key of one compiled kernel (see the module docstring): a digest of
    :func:`key_components` and of Triton's own source hash.

    Raises:
        Undescribable: a constexpr of ``src`` has no exact description (the kernel has no key).
    """
    parts = key_components(cache, target, backend, src, options, language)
    text = repr([src.hash(), sorted(parts.items())])
    return hashlib.sha256(text.encode()).hexdigest()
