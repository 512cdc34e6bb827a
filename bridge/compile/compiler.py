"""Compiling one specialization for one target, on a kernel-cache miss.

The bridge drives the backend's stages itself (as Triton's ``compile`` does) instead of calling
``triton.compile``, so Triton's own on-disk cache is neither read nor written and
``triton_key()`` is not computed on a miss. Invariant: the machine code is the same wherever the
sources are checked out, whenever they were written, and from whatever working directory: after
the LLVM IR stage, absolute source directories in the debug information are rewritten to paths
relative to the import root; after the PTX stage, each source file of the line table gets a
fixed time and an unknown size (:func:`fixed_file_stamps`), which ptxas would otherwise read
from the file wherever it finds one by that relative path.

Only whole output leaves a compile: the machine code must be a complete ELF file of the
target's machine and the PTX complete text (:func:`output_problem`). A compiler that runs out
of room in its temporary directory can exit 0 after a short write; that, and running out of
space while compiling, is an :class:`~bridge.exceptions.IncompleteOutput` naming ``TMPDIR`` and its
free space, never a result (nothing is stored, and nothing is remembered as the kernel's
failure: the next compile, with room, stores the kernel).

The stages run in a compiler process (:mod:`bridge.compile.compiler_process`): a compiler that aborts or
segfaults fails its compile with a :class:`~bridge.exceptions.CompilerCrash`, and the job
goes on. A Gluon compile that fails because a layout does not fit the target (Triton's verifier
says so on standard error) gets a note saying what fits; other errors do not.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import shutil
import sys
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from kernelcache.plugin import artifact_problem, elf_problem, ptx_problem

from ..exceptions import IncompleteOutput, KernelArgumentError
from ..identity import frontend
from ..identity.static_reads import relative_dir
from ..readsets import frontend_hooks, read_sets, witness
from ..vendors.targets import Target
from ..vendors.vendor import Vendor, by_binary_ext
from . import compiler_process

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
    #: the digest of the IR the compile started from (:mod:`bridge.identity.frontend`)
    ir: str | None = None
    #: what the frontend read to generate that IR (:mod:`bridge.readsets.witness`)
    reads: str | None = None


_DIFILE = re.compile(r'!DIFile\(filename: "([^"]*)", directory: "([^"]*)"')


def relative_debug_paths(llir: str) -> str:
    """Rewrite absolute ``!DIFile`` directories of LLVM IR text to import-relative ones."""

    def fix(m: re.Match[str]) -> str:
        name, directory = m.group(1), m.group(2)
        if os.path.isabs(name):
            directory, name = os.path.split(name)
        if os.path.isabs(directory):
            directory = relative_dir(directory)
        return f'!DIFile(filename: "{name}", directory: "{directory}"'

    return _DIFILE.sub(fix, llir)


#: a PTX ``.file`` directive: its index and name, and the time and size it may carry
_PTX_FILE = re.compile(
    r'^([ \t]*\.file\s+\d+\s+"(?:[^"\\]|\\.)*")(?:\s*,\s*\d+\s*,\s*\d+)?[ \t]*$', re.M
)
#: what every source file of a PTX line table says of itself: a fixed modification time (1 s
#: after the epoch: 0 would make ptxas read the file's) and an unknown size
FILE_STAMPS = ", 1, 0"


def fixed_file_stamps(ptx: str) -> str:
    """``ptx`` with every ``.file`` directive carrying :data:`FILE_STAMPS`: ptxas puts a
    source file's time and size in the cubin's line table, read from the file where it finds
    one by the directive's path from its working directory, unless the directive gives them."""
    return _PTX_FILE.sub(lambda m: m.group(1) + FILE_STAMPS, ptx)


def _machine_code_problem(vendor: Vendor, data: bytes) -> str | None:
    """Why ``data`` is not whole machine code of ``vendor``: a complete ELF file of its machine
    (or whole by its extension's check, for a vendor whose code is not ELF)."""
    if vendor.elf_machine is not None:
        reason = elf_problem(data, vendor.elf_machine)
    else:
        reason = artifact_problem(vendor.binary_ext, data)
    if reason is None:
        return None
    return f"its .{vendor.binary_ext} ({len(data):,} bytes) is not whole: {reason}"


def output_problem(binary: bytes, ptx: str | None, target: Target) -> str | None:
    """Why what a compile for ``target`` produced is not whole, None when it is: the machine
    code is checked as a complete ELF file of the target's machine (or by its extension's
    check, for a vendor whose code is not ELF), the PTX as complete PTX text (see
    :mod:`kernelcache.formats`)."""
    reason = _machine_code_problem(target.vendor, binary)
    if reason is not None:
        return reason
    if ptx is not None:
        reason = ptx_problem(ptx.encode())
        if reason is not None:
            return f"its PTX is not whole: {reason}"
    return None


def binary_problem(ext: str, data: bytes) -> str | None:
    """Why ``data``, machine code of extension ``ext`` read from the cache, is not what a
    compile gives (as :func:`output_problem` checks it); None when it is."""
    vendor = by_binary_ext(ext)
    if vendor is None:
        reason = artifact_problem(ext, data)
        return None if reason is None else f"its .{ext} is not whole: {reason}"
    return _machine_code_problem(vendor, data)


def temp_dir() -> str:
    """The directory Triton's compilers write their files to (``TMPDIR``), with its free
    space, for messages."""
    from kernelcache.plugin import human_size

    path = tempfile.gettempdir()
    try:
        free = f"{human_size(shutil.disk_usage(path).free)} free"
    except OSError as e:
        free = f"free space unknown: {e.strerror}"
    return f"{path} ({free})"


def _incomplete(src: Any, target: Target, what: str) -> IncompleteOutput:
    return IncompleteOutput(
        f"compiling {src.name} for {target}: {what}. Triton's compilers write their files under "
        f"TMPDIR, {temp_dir()}, and a full disk there cuts their output short: free space "
        "there, or set TMPDIR to a directory with room, and run again (nothing was stored; the "
        "kernel is compiled again next time)"
    )


def _out_of_space(error: BaseException) -> bool:
    """Whether ``error`` says a disk is full (also in a compiler's message)."""
    if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    text = str(error)
    return os.strerror(errno.ENOSPC) in text or os.strerror(errno.EDQUOT) in text


#: what Triton's verifier says of a Gluon layout that does not fit the module: its threads per
#: warp against the target's warp size, its warps against num_warps (Triton 3.6 to 3.9, on
#: standard error; the exception itself only says "error encountered during parsing")
_LAYOUT_MISFIT = re.compile(r"\bLayout has \d+ (threads per warp|warps per CTA)\b")


def about_layouts(error: BaseException, said: str) -> bool:
    """Whether a compile that raised ``error``, its compiler having written ``said`` to
    standard error, failed because a layout does not fit the target's warp size or the
    kernel's number of warps."""
    return any(_LAYOUT_MISFIT.search(text) for text in (said, str(error)))


def compile_source(src: Any, target: Target, backend: Any, options: Any) -> Compiled:
    """Compile ``src`` for ``target`` in a compiler process (see :mod:`bridge.compile.compiler_process`:
    a compiler that aborts or segfaults fails this compile, not the job), and check that what
    it produced is whole (:func:`output_problem`).

    Raises:
        IncompleteOutput: the output is not whole, or a disk filled up while compiling.
        CompilerCrash: the compiler process died (lasting or not: see its ``lasting``).
        whatever Triton raises for an invalid kernel (CompilationError, ...), with a note
        naming the kernel and target (and, for a Gluon layout that does not fit the target,
        one saying what fits).
    """
    global _compiles
    ran = compiler_process.run(_stages, src, target, backend, options)
    error = ran.error
    if error is not None:
        if _out_of_space(error):
            raise _incomplete(src, target, f"a disk filled up while compiling ({error})") from error
        if hasattr(error, "add_note"):
            error.add_note(f"while compiling {src.name} for {target}")
            if "gluon" in str(src.language).lower() and about_layouts(error, ran.said):
                error.add_note(
                    f"Gluon layouts must fit the target: {target.warp_size} threads per warp on "
                    f"{target}, and warps_per_cta multiplying to num_warps={options.num_warps}"
                )
        raise error
    compiled: Compiled = ran.value
    problem = output_problem(compiled.binary, compiled.ptx, target)
    if problem is not None:
        raise _incomplete(src, target, problem)
    with _lock:
        _compiles += 1
    logger.debug("compiled %s for %s (%d bytes)", src.name, target, len(compiled.binary))
    return compiled


def _stages(src: Any, target: Target, backend: Any, options: Any) -> Compiled:
    """Run the backend's stages from the source to machine code (in the compiler process)."""
    import triton
    from triton._C.libtriton import get_cache_invalidating_env_vars

    gpu_target = target.triton()
    env_vars = get_cache_invalidating_env_vars()
    metadata: dict[str, Any] = {
        "target": gpu_target,
        **vars(options),
        **env_vars,
        "triton_version": triton.__version__,
    }
    frontend_hooks.install()
    with witness.recording(src.fn, read_sets.params(src)) as recorder:
        with witness.reading_environment(recorder):
            with recorder.watching():  # (program code the frontend runs unwitnessed counts)
                module = frontend.module(src, target, backend, options)
            ir = frontend.digest(frontend.text(module))
            recorder.ran(frontend.specialization(src, options), ir)
            return _backend_stages(src, target, backend, options, metadata, module, ir, recorder)


def _backend_stages(
    src: Any,
    target: Target,
    backend: Any,
    options: Any,
    metadata: dict[str, Any],
    module: Any,
    ir: str,
    recorder: witness.Recorder,
) -> Compiled:
    """The backend's stages from the frontend's ``module`` to machine code (``recorder``: what
    the frontend and these stages read)."""
    stages: dict[str, Any] = {}
    backend.add_stages(stages, options, src.language)
    ptx = None
    names = list(stages)
    for ext in names[names.index(src.ext) :]:
        module = stages[ext](module, metadata)
        if ext == "llir":
            module = relative_debug_paths(module)
        elif ext == "ptx":
            module = ptx = fixed_file_stamps(module)
    if not isinstance(module, bytes):
        raise KernelArgumentError(
            f"Triton's {target.backend} pipeline ended in {names[-1]}, not machine code"
        )
    return Compiled(module, ptx, metadata, ir, recorder.text())


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
