"""Kernel keys: computed without compiling, at the level of Triton's own cache key.

Ingredients, named one by one and listed once, in :data:`STEPS`: the compiler's identity
(:mod:`.compiler_identity`), the kernel's own code (:func:`.jit.identity`), the signature and
specialization, the constexprs (by content: :func:`.jit.constant`), the backend's identity
(``backend.hash()``), the options (extern libraries by content, not path), the compiler's
environment, the language, the target, the binary's kind and the bridge's pipeline version.
Each entry records them, so that a miss can be explained by the ingredients that differ
(``kernelcache explain``); the key is their digest (:func:`kernelcache.keys.digest_of`).

A key routes; it is not asked to be complete: what the frontend reads beyond the code the key
holds is the kernel's read set (:mod:`bridge.readsets`), checked before a cached kernel is used.

Invariants: the same call in any process on any machine with the same software gets the same
key. Every ingredient but the kernel's own (code, signature, constexprs) is a property of the
process, the target and the options, computed by the functions a lowering key is made of too
(:mod:`bridge.lowering.lowering_keys`).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kernelcache.plugin import digest_of

from ..vendors.targets import Target
from .compiler_identity import (
    PIPELINE_VERSION,
    backend_identity,
    environment_digest,
    triton_identity,
)
from .file_digests import file_digest
from .jit import constant, identity

if TYPE_CHECKING:
    from kernelcache import Cache


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
    function ``fn``: each by :func:`bridge.identity.jit.constant`, an object with no
    description by content as an object only (the read set's ``"p"`` read decides)."""
    rows = []
    for path, value in sorted(constants.items()):
        try:
            rows.append([repr(path), constant(value)])
        except (ValueError, RecursionError):
            rows.append([repr(path), ["object"]])
    return text_digest(repr(rows))


@dataclass(frozen=True)
class Ingredients:
    """What one kernel key is computed from: the target and its backend, Triton's source object
    for the specialization, the parsed options and the language; ``cache`` memoizes the
    compiler's and the backend's identities and what the environment step reads."""

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
#: made of
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
        "code",
        "code digest (the kernel's source, settings and first line, and its JIT helpers')",
        lambda m: identity(m.src.fn),
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
        "the compiler's environment (variables and knobs that change code)",
        lambda m: environment_digest(m.cache),
    ),
    Step("binary", "kind of machine code", lambda m: str(getattr(m.backend, "binary_ext", ""))),
)
#: what each component of a key is, by name, in :data:`STEPS` order (how ``explain`` words it)
COMPONENTS: dict[str, str] = {step.name: step.label for step in STEPS}


def key_components(
    cache: Cache | None, target: Target, backend: Any, src: Any, options: Any, language: str
) -> dict[str, str]:
    """The ingredients of :func:`kernel_key`, named, one per step: the key is their digest,
    and an entry records them, so that a miss can say which of them differ."""
    made = Ingredients(cache, target, backend, src, options, language)
    return {step.name: step.value(made) for step in STEPS}


def kernel_key(
    cache: Cache, target: Target, backend: Any, src: Any, options: Any, language: str
) -> str:
    """The key of one compiled kernel (see the module docstring)."""
    return digest_of(key_components(cache, target, backend, src, options, language))
