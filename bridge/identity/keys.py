"""Kernel keys: computed without compiling, from everything that decides the binary.

Ingredients, named one by one and listed once, in :data:`STEPS`:
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
exactly raises :class:`~bridge.errors.Undescribable`: such a kernel has no key.

Each entry records the components, so that a miss can be explained by the ingredients that
differ (``kernelcache explain``); the key is a digest of the same components.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
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


@dataclass(frozen=True)
class Ingredients:
    """What one kernel key is computed from: the target and its backend, Triton's source object
    for the specialization, the parsed options and the language; ``cache`` memoizes the
    compiler's and the backend's identities."""

    cache: Cache | None
    target: Target
    backend: Any
    src: Any
    options: Any
    language: str


@dataclass(frozen=True)
class Step:
    """One ingredient of a kernel key: its ``name`` (recorded in each entry), how ``explain``
    words it (``label``) and how it is computed (``value``)."""

    name: str
    label: str
    value: Callable[[Ingredients], str]


def _triton_version(_: Ingredients) -> str:
    from ..versions import triton_version

    return triton_version()


def _signature(made: Ingredients) -> str:
    sig = [v for _, v in sorted(made.src.signature.items())]
    return text_digest(f"{made.src.attrs}-{sig}")


#: the ingredients of a kernel key, in the order ``explain`` reports them: the one list both the
#: key (:func:`kernel_key`) and the components an entry records (:func:`key_components`) are
#: made of. The source hash is split the way Triton's ``ASTSource.hash()`` assembles it.
STEPS: tuple[Step, ...] = (
    Step("pipeline", "the bridge's compile pipeline", lambda _: PIPELINE_VERSION),
    Step("triton", "Triton version", _triton_version),
    Step("compiler", "compiler identity (Triton's files)", lambda m: triton_identity(m.cache)),
    Step("target", "target", lambda m: str(m.target)),
    Step(
        "backend",
        "backend identity (target, ptxas version)",
        lambda m: text_digest(backend_identity(m.cache, m.target, m.backend)),
    ),
    Step("language", "language", lambda m: m.language),
    Step(
        "source",
        "source digest (the kernel and the functions it calls)",
        lambda m: text_digest(str(m.src.fn.cache_key)),
    ),
    Step(
        "code",
        "code digest (every global, attribute and helper the frontend reads)",
        lambda m: code_digest(m.src.fn),
    ),
    Step("signature", "signature digest (argument types and specialization)", _signature),
    Step("constexprs", "constexprs digest", lambda m: constexprs_digest(m.src.fn, m.src.constants)),
    Step(
        "options",
        "options digest (num_warps, num_stages, ...)",
        lambda m: options_digest(m.options),
    ),
    Step(
        "environment",
        "Triton's cache-invalidating environment variables",
        lambda _: text_digest(env_digest()),
    ),
    Step("binary", "kind of machine code", lambda m: str(getattr(m.backend, "binary_ext", ""))),
)

#: what each component of a key is, by name, in :data:`STEPS` order (how ``explain`` words it)
COMPONENTS: dict[str, str] = {step.name: step.label for step in STEPS}


def key_components(
    cache: Cache | None, target: Target, backend: Any, src: Any, options: Any, language: str
) -> dict[str, str]:
    """The ingredients of :func:`kernel_key`, named, one per step of :data:`STEPS`: the key is
    their digest, and an entry records them, so that a miss can say which of them differ.

    Raises:
        Undescribable: a constexpr of ``src``, or a value its code reads, has no description.
    """
    made = Ingredients(cache, target, backend, src, options, language)
    return {step.name: step.value(made) for step in STEPS}


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
