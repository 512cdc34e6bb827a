"""Compiling one specialization for one target, on a kernel-cache miss.

The bridge drives the backend's stages itself (as Triton's ``compile`` does) instead of calling
``triton.compile``, so Triton's own on-disk cache is neither read nor written and
``triton_key()`` is not computed on a miss. Invariant: the machine code is the same wherever the
sources are checked out (after the LLVM IR stage, absolute source directories in the debug
information are rewritten to paths relative to the import root).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from .errors import KernelArgumentError
from .targets import Target

logger = logging.getLogger(__name__)

_lock = threading.Lock()
_compiles = 0


def compile_count() -> int:
    """How many kernels this process compiled with Triton (kernel-cache misses)."""
    return _compiles


@dataclass(frozen=True)
class Compiled:
    """A compiled kernel: machine code, PTX text (CUDA only) and Triton's metadata."""

    binary: bytes
    ptx: str | None
    metadata: dict[str, Any]


_DIFILE = re.compile(r'!DIFile\(filename: "([^"]*)", directory: "([^"]*)"')


def _relative_dir(directory: str) -> str:
    """``directory`` relative to the longest ``sys.path`` entry containing it, else its name."""
    directory = os.path.normpath(directory)
    best = ""
    for entry in sys.path:
        root = os.path.normpath(os.path.abspath(entry or "."))
        if (directory == root or directory.startswith(root + os.sep)) and len(root) > len(best):
            best = root
    if best:
        rel = os.path.relpath(directory, best)
        return "" if rel == "." else rel
    return os.path.basename(directory)


def relative_debug_paths(llir: str) -> str:
    """Rewrite absolute ``!DIFile`` directories of LLVM IR text to import-relative ones."""

    def fix(m: re.Match[str]) -> str:
        name, directory = m.group(1), m.group(2)
        if os.path.isabs(name):
            directory, name = os.path.split(name)
        if os.path.isabs(directory):
            directory = _relative_dir(directory)
        return f'!DIFile(filename: "{name}", directory: "{directory}"'

    return _DIFILE.sub(fix, llir)


def compile_source(src: Any, target: Target, backend: Any, options: Any) -> Compiled:
    """Run the backend's stages from the source to machine code.

    Raises:
        whatever Triton raises for an invalid kernel (CompilationError, ...), with a note
        naming the kernel and target.
    """
    global _compiles
    import triton
    from triton._C.libtriton import get_cache_invalidating_env_vars, ir

    gpu_target = target.triton()
    env_vars = get_cache_invalidating_env_vars()
    metadata: dict[str, Any] = {
        "target": gpu_target,
        **vars(options),
        **env_vars,
        "triton_version": triton.__version__,
    }
    stages: dict[str, Any] = {}
    backend.add_stages(stages, options, src.language)
    context = ir.context()
    ir.load_dialects(context)
    backend.load_dialects(context)
    codegen_fns = backend.get_codegen_implementation(options)
    module_map = backend.get_module_map()
    ptx = None
    try:
        module = src.make_ir(gpu_target, options, codegen_fns, module_map, context)
        names = list(stages)
        for ext in names[names.index(src.ext) :]:
            module = stages[ext](module, metadata)
            if ext == "llir":
                module = relative_debug_paths(module)
            elif ext == "ptx":
                ptx = module
    except Exception as e:  # annotate and re-raise Triton's own error unchanged
        if hasattr(e, "add_note"):
            e.add_note(f"while compiling {src.name} for {target}")
            if "gluon" in str(src.language).lower():
                e.add_note(
                    f"Gluon layouts must fit the target: {target.warp_size} threads per warp on "
                    f"{target}, and warps_per_cta multiplying to num_warps={options.num_warps}"
                )
        raise
    if not isinstance(module, bytes):
        raise KernelArgumentError(
            f"Triton's {target.backend} pipeline ended in {names[-1]}, not machine code"
        )
    with _lock:
        _compiles += 1
    logger.debug("compiled %s for %s (%d bytes)", src.name, target, len(module))
    return Compiled(module, ptx, metadata)


@contextlib.contextmanager
def output_to_stderr() -> Iterator[None]:
    """Send what is written to standard output, by Python code (``sys.stdout``) and by native
    code (file descriptor 1), to standard error until the block ends; processes forked or
    started in the block inherit it.

    For commands whose standard output is one document (``--json``): whatever Triton prints
    while compiling (IR dumps, messages of its native code) cannot get into the document.
    """
    sys.stdout.flush()
    try:
        saved = os.dup(1)
    except OSError:  # no file descriptor 1: only Python's output can be redirected
        saved = -1
    try:
        if saved >= 0:
            os.dup2(2, 1)
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        sys.stderr.flush()
        if saved >= 0:
            os.dup2(saved, 1)
            os.close(saved)
