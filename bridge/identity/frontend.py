"""Running Triton's frontend for one specialization: the IR the backend receives, as text and
as a digest.

Every compile records the digest of the IR it started from (:func:`digest`), so ``kernelcache
audit`` can tell whether a stored key still gives that IR. The text is the module as MLIR prints
it with its locations, each absolute source directory rewritten to the import-relative form the
compile writes into the binary's debug information (:func:`relative_locations`): the same
source at two checkouts gives the same text, as it gives the same binary.

The IR is also a read of a read set (the op ``"ir"``): where the witness cannot vouch for what
the frontend read (the read set is *partial*), a check runs the frontend again for the same
specialization (:func:`specialization`, made again by :func:`ir_again`) and compares digests.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
import sys
import threading
from typing import Any

from ..vendors.targets import Target
from .exact_values import triton_home
from .namespaces import exact, remake
from .static_reads import relative_path

_LOCATION = re.compile(r'loc\("((?:[^"\\]|\\.)*)":')


def relative_locations(text: str) -> str:
    """MLIR text with the file of every location made import-relative."""
    return _LOCATION.sub(lambda m: f'loc("{relative_path(m.group(1))}":', text)


_local = threading.local()


def _context(backend: Any, reuse: bool) -> Any:
    """An MLIR context with the dialects of ``backend`` loaded: this thread's own for the
    backend's class where ``reuse`` (loading dialects costs about 1 ms), else a new one."""
    from triton._C.libtriton import ir

    contexts: dict[type, Any] = _local.__dict__.setdefault("contexts", {})
    found = contexts.get(type(backend)) if reuse else None
    if found is None:
        found = ir.context()
        ir.load_dialects(found)
        backend.load_dialects(found)
        if reuse:
            contexts[type(backend)] = found
    return found


def module(src: Any, target: Target, backend: Any, options: Any, reuse: bool = False) -> Any:
    """Run the frontend: Triton's IR module for ``src`` (an ``ASTSource``), as the first stage
    of the backend receives it (in this thread's context for the backend where ``reuse``: the
    module is then only read, never passed on to the backend's stages).

    Raises:
        whatever Triton raises for a kernel it cannot compile (CompilationError, ...).
    """
    return _made(src, target.triton(), backend, options, reuse)


def _made(src: Any, gpu_target: Any, backend: Any, options: Any, reuse: bool) -> Any:
    context = _context(backend, reuse)
    codegen_fns = backend.get_codegen_implementation(options)
    module_map = backend.get_module_map()
    return src.make_ir(gpu_target, options, codegen_fns, module_map, context)


def text(made: Any) -> str:
    """The text of a module :func:`module` made (see the module docstring)."""
    return relative_locations(made.str())


def digest(ir_text: str) -> str:
    """The digest of IR text (what kernel entries record, what open kernels are keyed by)."""
    return hashlib.sha256(ir_text.encode()).hexdigest()


def ir_digest(src: Any, target: Target, backend: Any, options: Any) -> str:
    """Run the frontend for ``src`` and digest its IR (see :func:`module`)."""
    return digest(text(module(src, target, backend, options, reuse=True)))


# -- the IR as a read ---------------------------------------------------------------------
def specialization(src: Any, options: Any) -> Any:
    """The specialization ``src`` (an ``ASTSource`` or ``GluonASTSource``) compiled with
    ``options``, as plain data that :func:`ir_again` makes again: the signature, each
    constexpr exactly (or, an object, by the name of the kernel's parameter that holds it), the
    attributes and every option field; None where a part has no exact description or the
    options are not made again equal."""
    names = list(src.fn.arg_names)
    constants = []
    for path, value in src.constants.items():
        plain = exact(value)
        if plain is None and len(path) == 1 and path[0] < len(names):
            plain = ["param", names[path[0]]]
        constants.append([exact(tuple(path)), plain])
    attrs = [[exact(tuple(path)), exact(value)] for path, value in src.attrs.items()]
    fields = [[name, exact(value)] for name, value in option_fields(options)]
    signature = [[name, exact(value)] for name, value in src.signature.items()]
    kind = triton_home(type(options))
    doc = {
        "gluon": "gluon" in type(src).__module__.lower(),
        "kind": kind,
        "signature": signature,
        "constants": constants,
        "attrs": attrs,
        "options": fields,
    }
    if kind is None or any(
        d is None for rows in (constants, attrs, fields, signature) for _, d in rows
    ):
        return None
    try:
        same = _options(type(options), fields) == options
    except (TypeError, ValueError):
        same = False
    return doc if same else None


def option_fields(options: Any) -> list[tuple[str, Any]]:
    """The fields ``options`` (a backend's options, a dataclass in every backend Triton ships)
    is made from, by name: its constructor's, not what its ``__post_init__`` derives and sets
    beside them (``HIPOptions.warp_size``, from the arch), which the constructor refuses."""
    if dataclasses.is_dataclass(options):
        made = [f.name for f in dataclasses.fields(options) if f.init]
        return [(name, getattr(options, name)) for name in sorted(made)]
    return sorted(vars(options).items())


def _options(kind: type, fields: list[Any]) -> Any:
    return kind(**{str(name): remake(value) for name, value in fields})


def _home(home: Any) -> type:
    """The class of Triton's own that :func:`~.exact_values.triton_home` placed at ``home``."""
    _, module, qualname = home
    found: Any = sys.modules[str(module)]
    for part in str(qualname).split("."):
        found = getattr(found, part)
    if not isinstance(found, type) or triton_home(found) != home:
        raise ValueError(f"not a class of Triton's: {home!r:.80}")
    return found


def ir_again(kernel: Any, made: Any, given: dict[str, Any], backend: Any) -> str:
    """The digest of the IR the frontend gives now for the JIT function ``kernel`` in the
    specialization :func:`specialization` described as ``made`` (``given``: the constexpr
    arguments by parameter name, for those described by name), for ``backend``'s target.

    Raises:
        ValueError: ``made`` describes no specialization (or ``backend`` is not given).
        whatever the frontend raises for code it cannot compile now.
    """
    from .kernel_keys import source

    if backend is None or not isinstance(made, dict):
        raise ValueError("no specialization to run the frontend for")
    constants = {}
    for path, value in made["constants"]:
        if isinstance(value, list) and value[:1] == ["param"]:
            constants[remake(path)] = given[str(value[1])]
        else:
            constants[remake(path)] = remake(value)
    signature = {str(name): remake(value) for name, value in made["signature"]}
    attrs = {remake(path): remake(value) for path, value in made["attrs"]}
    src = source(kernel, bool(made["gluon"]), signature, constants, attrs)
    options = _options(_home(made["kind"]), made["options"])
    return digest(text(_made(src, backend.target, backend, options, reuse=True)))
