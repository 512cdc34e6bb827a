"""Running Triton's frontend for one specialization: the IR the backend receives, as text and
as a digest.

An *open* kernel (one whose description cannot be proved complete: :mod:`.describe`) is keyed
by what the frontend produced for it, as ccache's preprocessed mode keys a source by the
preprocessor's output: the frontend runs in this process on every lowering (its cost, not the
backend's), and the backend compile is skipped on a hit. Every compile records the digest of
the IR it started from (:func:`digest` of the same text), so ``kernelcache audit`` can tell
whether a stored key still gives the IR it was built from.

The text is the module as MLIR prints it with its locations (the line table reaches the
binary), with each absolute source directory rewritten to the import-relative form the compile
writes into the binary's debug information (:func:`relative_locations`, by
:func:`~.static_reads.relative_path`): the same source at two checkouts gives the same text, as
it gives the same binary.
"""

from __future__ import annotations

import hashlib
import re
import threading
from typing import Any

from ..vendors.targets import Target
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
    context = _context(backend, reuse)
    codegen_fns = backend.get_codegen_implementation(options)
    module_map = backend.get_module_map()
    return src.make_ir(target.triton(), options, codegen_fns, module_map, context)


def text(made: Any) -> str:
    """The text of a module :func:`module` made (see the module docstring)."""
    return relative_locations(made.str())


def digest(ir_text: str) -> str:
    """The digest of IR text (what kernel entries record, what open kernels are keyed by)."""
    return hashlib.sha256(ir_text.encode()).hexdigest()


def ir_digest(src: Any, target: Target, backend: Any, options: Any) -> str:
    """Run the frontend for ``src`` and digest its IR (see :func:`module`)."""
    return digest(text(module(src, target, backend, options, reuse=True)))
