"""Helpers for the bridge tests: lowering on CPU for GPU platforms, reading the opaque back,
and running fresh Python processes that import this checkout."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
import types
from pathlib import Path
from typing import Any

import command_server
from identity_targets import platform_of, target_params
from support import HELPERS, REPO, checked, child_env

ELF_MAGIC = b"\x7fELF"


def jaxlib_triton() -> Any | None:
    """jaxlib's Triton bindings when a GPU plugin provides them (the CUDA plugin imports on
    CPU-only machines), else None."""
    try:
        from jax._src.lib import gpu_triton
    except ImportError:
        return None
    return gpu_triton if getattr(gpu_triton, "TritonKernel", None) is not None else None


def lowered_module(fn: Any, *avals: Any, platform: str = "cuda") -> Any:
    import jax

    return jax.jit(fn).trace(*avals).lower(lowering_platforms=(platform,))


def custom_calls(lowered: Any) -> list[dict[str, Any]]:
    """The stablehlo.custom_call ops of a lowered computation: target name, api version,
    opaque bytes (FFI form) or backend_config bytes (legacy form), operand/result counts."""
    from jax._src.lib.mlir import ir

    module = lowered.compiler_ir("stablehlo")
    found: list[Any] = []

    def visit(op: Any) -> Any:
        if op.name == "stablehlo.custom_call":
            found.append(op)
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    out = []
    with module.context:
        for op in found:
            attrs = op.attributes
            entry: dict[str, Any] = {
                "target": ir.StringAttr(attrs["call_target_name"]).value,
                # absent once a module went through jax.export's serialization (the default)
                "api_version": ir.IntegerAttr(attrs["api_version"]).value
                if "api_version" in attrs
                else None,
                "operands": len(op.operands),
                "results": len(op.results),
            }
            if "mhlo.backend_config" in attrs:
                config = ir.DictAttr(attrs["mhlo.backend_config"])
                entry["opaque"] = ir.StringAttr(config["opaque"]).value_bytes
            else:
                entry["opaque"] = ir.StringAttr(attrs["backend_config"]).value_bytes
            if "output_operand_aliases" in attrs:
                entry["aliases"] = str(attrs["output_operand_aliases"])
            out.append(entry)
    return out


def decoded(fn: Any, *avals: Any, platform: str = "cuda") -> list[Any]:
    """Lower ``fn`` and return the parsed TritonAnyKernelCall of every Triton custom call."""
    from bridge.lowering import proto

    return [
        proto.decode_opaque(c["opaque"])
        for c in custom_calls(lowered_module(fn, *avals, platform=platform))
    ]


def kernel_keys(fn: Any, *avals: Any, platform: str = "cuda") -> list[str]:
    """The kernel key of each variant a lowering of ``fn`` lowers (as ``bridge.on_lowered``
    reports them: what the cache holds the kernels under)."""
    import bridge

    seen: list[dict[str, Any]] = []
    remove = bridge.on_lowered(seen.append)
    try:
        lowered_module(fn, *avals, platform=platform)
    finally:
        remove()
    return [r["key"] for r in seen]


def to_protobuf(message: Any, into: Any = None) -> Any:
    """``message`` (a :mod:`bridge.lowering.proto` dataclass) as a protobuf message, built field by field
    through protobuf's message API: the reference the bridge's own encoder is compared with."""
    from bridge.lowering import proto

    cls = type(message)
    out = proto.messages()[cls._proto_name]() if into is None else into
    for f in cls._proto_fields:
        value = getattr(message, f.name)
        if f.repeated and isinstance(f.kind, str):
            getattr(out, f.name).extend(value)
        elif f.repeated:
            for item in value:
                to_protobuf(item, getattr(out, f.name).add())
        elif value is None:
            continue
        elif isinstance(f.kind, str):
            setattr(out, f.name, value)
        else:
            getattr(out, f.name).SetInParent()
            to_protobuf(value, getattr(out, f.name))
    return out


def kernels_of(call: Any) -> list[Any]:
    """The TritonKernel messages of a TritonAnyKernelCall (one per config)."""
    if call.HasField("kernel_call"):
        return [call.kernel_call.kernel]
    return [c.kernel_call.kernel for c in call.autotuned_kernel_call.configs]


def run_child(
    code: str, *argv: str, timeout: float = 240, cwd: str | None = None, **env: str
) -> Any:
    """Run ``code`` with ``argv`` in a process of its own (:func:`command_server.run_python`);
    it prints one JSON document last. Returns it."""
    proc = command_server.run_python(
        textwrap.dedent(code), list(argv), child_env(**env), timeout=timeout, cwd=cwd or REPO
    )
    return json.loads(checked(proc).stdout.strip().splitlines()[-1])


def start_child(code: str, *argv: str, **env: str) -> subprocess.Popen:
    """Start ``code`` with ``argv`` in a fresh interpreter (finish with :func:`finish_child`)."""
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code), *argv],
        env=child_env(**env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=str(REPO),
    )


def finish_child(proc: subprocess.Popen, timeout: float = 240) -> Any:
    out, err = proc.communicate(timeout=timeout)
    checked(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    return json.loads(out.strip().splitlines()[-1])


def finish_children(procs: list[subprocess.Popen], timeout: float = 240) -> list[Any]:
    """Each child's last JSON line, once every child has ended; if any failed, an
    AssertionError showing the output of each that failed (a child that died names itself,
    not only the peers left waiting for it)."""
    deadline = time.monotonic() + timeout
    done = []
    for proc in procs:
        try:
            out, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            err += f"\n(killed: still running after {timeout} s)"
        done.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    failed = [(i, c) for i, c in enumerate(done) if c.returncode != 0]
    if failed:
        raise AssertionError(
            "\n".join(
                f"child {i} failed ({c.returncode})\n--- stdout\n{c.stdout}\n--- stderr\n{c.stderr}"
                for i, c in failed
            )
        )
    return [json.loads(c.stdout.strip().splitlines()[-1]) for c in done]


# Child-process code that counts every way Triton could compile in that process: the front end
# of both languages, triton.compile, and triton_key() (the 0.3 s compiler hash a warm start must
# not pay). Prepend it to a child's code; read the totals from ``counts``. Compiles run in
# compiler processes forked from the child (bridge.compile.compiler_process): they count in memory
# shared with it, which ``counts`` shows after each compile.
COUNT_COMPILES = f"""
import mmap, sys
sys.path.insert(0, {str(HELPERS)!r})
counts = {{"make_ir": 0, "compile": 0, "triton_key": 0}}
_shared = mmap.mmap(-1, 8 * len(counts))

def _synced():
    for i, label in enumerate(counts):
        counts[label] = int.from_bytes(_shared[8 * i : 8 * i + 8], "little")

def counting(owner, name, label):
    original = getattr(owner, name)
    at = 8 * list(counts).index(label)
    def wrapper(*args, **kwargs):
        n = int.from_bytes(_shared[at : at + 8], "little") + 1
        _shared[at : at + 8] = n.to_bytes(8, "little")
        _synced()
        return original(*args, **kwargs)
    setattr(owner, name, wrapper)

import triton
import triton.compiler.compiler as tc
import triton.runtime.cache as rc
from triton.experimental.gluon import _runtime as gr
import bridge.compile.compiler_process as _compiler_process
counting(tc.ASTSource, "make_ir", "make_ir")
counting(gr.GluonASTSource, "make_ir", "make_ir")
counting(tc, "compile", "compile")
counting(triton, "compile", "compile")
counting(rc, "triton_key", "triton_key")
_run = _compiler_process.run
def _run_and_count(*args, **kwargs):
    try:
        return _run(*args, **kwargs)
    finally:
        _synced()
_compiler_process.run = _run_and_count
"""


def cuda_devices() -> list[Any]:
    """This machine's CUDA devices as JAX sees them (none without a GPU)."""
    import jax

    try:
        return jax.devices("cuda")
    except RuntimeError:
        return []


def forget_lowerings(root: Any) -> int:
    """Remove the lowering and program entries under ``root`` (see :mod:`bridge.entries.lowerings`),
    so that the next lowering works from the kernel entries alone; returns how many files went."""
    from bridge.entries.lowerings import LOWERING, PROGRAM, VARIANTS

    gone = 0
    for ext in (LOWERING.ext, VARIANTS.ext, PROGRAM.ext):
        for path in Path(root).glob(f"*.{ext}"):
            path.with_suffix(".json").unlink()
            path.unlink()
            gone += 1
    return gone


def forget_programs(root: Any) -> int:
    """Remove the program entries under ``root`` (:mod:`bridge.entries.lowerings`), so that the next
    lowering reads each call's own lowering entries; returns how many went."""
    from bridge.entries.lowerings import PROGRAM

    gone = 0
    for path in Path(root).glob(f"*.{PROGRAM.ext}"):
        path.with_suffix(".json").unlink()
        path.unlink()
        gone += 1
    return gone


def kernel_module(directory: Path, name: str, body: str):
    """Import ``body`` (Triton code) as the module ``name`` from a file under ``directory``
    (importing it again after the file changed gives the new kernel: the source is compiled
    each time, never taken from a bytecode cache, which cannot tell an edit that keeps the
    file's size within the same second)."""
    path = directory / f"{name}.py"
    path.write_text("import triton\nimport triton.language as tl\n" + textwrap.dedent(body))
    module = types.ModuleType(name)
    module.__file__ = str(path)
    sys.modules[name] = module
    exec(compile(path.read_text(), str(path), "exec"), module.__dict__)
    return module


#: the start of the kernel modules below: Triton imported, ``head``, then ``kernel`` (with
#: ``params`` before ``BLOCK``) up to its loaded block ``x``
_KERNEL_HEAD = """
import triton
import triton.language as tl
{head}

@triton.jit
def kernel(x_ptr, n, out_ptr, {params}BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
"""
#: a kernel module's source: ``kernel`` stores ``body`` (an expression of ``x``)
KERNEL_SOURCE = _KERNEL_HEAD + "    tl.store(out_ptr + offs, {body}, mask=mask)\n"


def kernel_source(head: str, body: str, params: str = "") -> str:
    """:data:`KERNEL_SOURCE` with ``head`` (dedented), ``body`` and ``params``."""
    return KERNEL_SOURCE.format(head=textwrap.dedent(head), body=body, params=params)


#: a kernel whose loaded block ``x`` goes through ``stmts`` (indented lines that set ``out``)
KERNEL_STATEMENTS = _KERNEL_HEAD + "{stmts}\n    tl.store(out_ptr + offs, out, mask=mask)\n"
#: a Gluon kernel, likewise (its layout for ``TPW`` threads per warp: the target's)
GLUON_STATEMENTS = """
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
{head}


@gluon.jit
def kernel(x_ptr, n, out_ptr, BLOCK: gl.constexpr, TPW: gl.constexpr):
    layout: gl.constexpr = gl.BlockedLayout([4], [TPW], [4], [0])
    offs = gl.program_id(0) * BLOCK + gl.arange(0, BLOCK, layout=layout)
    x = gl.load(x_ptr + offs, mask=offs < n)
{stmts}
    gl.store(out_ptr + offs, out, mask=offs < n)
"""


def kernel_statements(head: str, stmts: str, params: str = "", gluon: bool = False) -> str:
    """:data:`KERNEL_STATEMENTS` (or :data:`GLUON_STATEMENTS`) with ``head`` and ``stmts``
    (dedented, then indented as the kernel's body)."""
    body = textwrap.indent(textwrap.dedent(stmts).strip("\n"), "    ")
    template = GLUON_STATEMENTS if gluon else KERNEL_STATEMENTS
    return template.format(head=textwrap.dedent(head), stmts=body, params=params)


#: a static ``if`` on ``{cond}`` choosing between two expressions
CHOOSE = """
if {cond}:
    out = tl.exp(x)
else:
    out = tl.sin(x)
"""


def _lowered_call(
    kernel: Any, root: Any, embed: str | None, params: dict[str, Any], target: str = "cuda:90"
) -> Any:
    """The custom call a lowering of ``kernel`` (one float32 vector of 4096 and its size;
    ``BLOCK=1024``, 4 programs; a Gluon kernel's ``TPW``: :func:`identity_targets.target_params`)
    for ``target`` makes (cache at ``root``)."""
    import jax
    import jax.numpy as jnp

    import bridge
    import kernelcache

    def fn(x: Any) -> Any:
        return bridge.triton_call(
            x,
            x.size,
            kernel=kernel,
            out_shape=x,
            grid=(4,),
            BLOCK=1024,
            target=target,
            embed=embed,
            cache=kernelcache.Cache(str(root)),
            **target_params(kernel, target),
            **params,
        )

    avals = jax.ShapeDtypeStruct((4096,), jnp.float32)
    (call,) = custom_calls(lowered_module(fn, avals, platform=platform_of(target)))
    return call


def opaque(kernel: Any, root: Any, *, target: str = "cuda:90", **params: Any) -> str:
    """The digest of the opaque a lowering of ``kernel`` embeds (see :func:`_lowered_call`)."""
    import hashlib

    call = _lowered_call(kernel, root, None, params, target)
    return hashlib.sha256(call["opaque"]).hexdigest()


def machine_code(kernel: Any, root: Any, *, target: str = "cuda:90", **params: Any) -> bytes:
    """The machine code a lowering of ``kernel`` for ``target`` embeds inline (see
    :func:`_lowered_call`): what a process runs, whichever entry (and so whichever key in the
    opaque) it came from."""
    from bridge.lowering import proto

    call = _lowered_call(kernel, root, "inline", params, target)
    images = [k.module_image.object_file for k in kernels_of(proto.decode_opaque(call["opaque"]))]
    return b"".join(images)
