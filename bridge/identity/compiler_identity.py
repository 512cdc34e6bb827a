"""The compiler's identity: what every kernel key holds besides the kernel itself, namely the
bridge's compile pipeline (:data:`PIPELINE_VERSION`), Triton's files, its backend and its
environment, each memoized where computing it costs.

Triton's identity digests what ``triton_key()`` hashes (Triton's version and the contents of
every file it reads) with xxh3-128, memoized in the kernel cache (:mod:`bridge.entries.memos`)
under the path, size and modification time of those files. A backend whose ``hash()`` reads more
(ptxas on CUDA) is memoized under the fingerprint its vendor gives.

The compiler's environment is what Triton reads from the process that changes the code it
compiles, as set now. Which variables count is found from the installed Triton once per version:
every knob of ``triton.knobs``, every variable its Python files read directly, and those its
native library declares cache-invalidating; less those that cannot change compiled code
(:data:`NEUTRAL`; :data:`NOT_APPLIED`: what Triton's ``compile`` does and the bridge's own stages
do not, warned of once; :data:`DEVICE_SELECTION`). Its digest (:func:`environment_digest`) holds
each counted variable that is set (a boolean knob's value as Triton parses it, none at its
default), each knob set from Python whose variable counts, a tool or library a variable names
(:data:`TOOLS`) by its file's content, and a stage-inspection hook by its description.
Invariant: variables left unset and knobs left alone add nothing, so the digest of a plain
process is the same on every machine. A memo found is checked for its form before use.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import re
import sysconfig
from typing import TYPE_CHECKING, Any

from kernelcache.plugin import warn_once

from ..entries.memos import memoized
from ..vendors.targets import Target
from ..vendors.vendor import file_row
from .file_digests import file_digest
from .static_reads import plain_text

if TYPE_CHECKING:
    from kernelcache import Cache

logger = logging.getLogger(__name__)

#: bump when the bridge's compile pipeline changes its output for the same inputs, or when what an
#: entry's read set records widens (an entry without the new reads would be trusted for them)
#: (9: keys hold the kernel's own code only, the read set decides; 10: a JIT function's defaults,
#: annotations and names as its ``def`` bound them, and ``is`` of two values, partial)
PIPELINE_VERSION = "bridge-pipeline-10"
#: the version of what Triton's identity covers (in its fingerprint and digest)
_TRITON_VERSION = 1


def _package_rows(directory: str, package: str, rows: list[list[Any]]) -> None:
    """Append the rows (:func:`~bridge.vendors.vendor.file_row`) of the Python files of ``package`` (at
    ``directory``) and of its sub-packages (directories with ``__init__.py``, as
    ``pkgutil.walk_packages`` finds them; not ``__pycache__``, which never is one), in name
    order."""
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return
    sep = os.sep
    for name in names:
        if name.endswith(".py"):
            rows.append(file_row(directory + sep + name, package + sep + name))
        elif name != "__pycache__" and name.isidentifier():
            path = directory + sep + name
            if os.path.exists(path + sep + "__init__.py"):
                _package_rows(path, package + sep + name, rows)


def _triton_rows() -> tuple[str, list[list[Any]]]:
    """Triton's directory, and the row (:func:`~bridge.vendors.vendor.file_row`) of every file ``triton_key()``
    reads (plus the ``__init__.py`` of the packages it walks); one pass over the files."""
    import triton

    base = os.path.dirname(os.path.abspath(triton.__file__))
    ext = sysconfig.get_config_var("EXT_SUFFIX").split(".")[-1]
    rows = [
        file_row(os.path.join(base, name), name)
        for name in (os.path.join("runtime", "cache.py"), os.path.join("_C", f"libtriton.{ext}"))
    ]
    for package in ("compiler", "backends", "language"):
        _package_rows(os.path.join(base, package), package, rows)
    return base, rows


def _library_rows(base: str) -> list[list[Any]]:
    """The rows of the libraries the backends link kernels with (``backends/*/lib``: libdevice,
    the ROCm device libraries): options name them, and a kernel key holds their content."""
    rows: list[list[Any]] = []
    backends = os.path.join(base, "backends")
    try:
        vendors = sorted(os.listdir(backends))
    except OSError:
        return rows
    for vendor in vendors:
        lib = os.path.join(backends, vendor, "lib")
        try:
            names = sorted(os.listdir(lib))
        except OSError:
            continue
        rows += [file_row(os.path.join(lib, n), os.path.join(vendor, "lib", n)) for n in names]
    return rows


@functools.lru_cache(maxsize=1)
def triton_fingerprint() -> str:
    """A digest of the identity (path, size, mtime) of every file ``triton_key()`` reads and of
    the backends' device libraries (computed once per process)."""
    import triton

    base, rows = _triton_rows()
    doc = [_TRITON_VERSION, triton.__version__, rows, _library_rows(base)]
    return hashlib.sha256(json.dumps(doc, separators=(",", ":")).encode()).hexdigest()


def triton_digest() -> str:
    """xxh3-128 of Triton's version and of the contents of every file ``triton_key()`` reads
    (each with its relative path and size): what ``triton_key()`` hashes, with a faster hash."""
    import triton
    import xxhash

    base, rows = _triton_rows()
    h = xxhash.xxh3_128()
    h.update(f"{_TRITON_VERSION}\0{triton.__version__}\0".encode())
    for row in rows:
        path = os.path.join(base, row[0])
        h.update(f"{os.path.relpath(path, base)}\0".encode())
        try:
            with open(path, "rb") as f:
                h.update(f"{os.fstat(f.fileno()).st_size}\0".encode())
                for chunk in iter(lambda: f.read(1 << 22), b""):
                    h.update(chunk)
        except OSError as e:
            h.update(f"unreadable {e.errno}\0".encode())
    return h.hexdigest()


_memo: dict[tuple[str, str], str] = {}
#: what a memo of Triton's files, and a variable's name in one of its environment, may be
_DIGEST, _NAME = re.compile(r"[0-9a-f]{16,64}"), re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")


def triton_identity(cache: Cache | None) -> str:
    """The compiler's identity (:func:`triton_digest`), without computing it when the cache
    knows it."""
    fp = triton_fingerprint()
    found = _memo.get(("triton", fp))
    if found is None:
        found = _memo[("triton", fp)] = memoized(
            cache, "triton_files", fp, triton_digest, _DIGEST.fullmatch
        )
    return found


def backend_identity(cache: Cache | None, target: Target, backend: Any) -> str:
    """``backend.hash()`` for ``target``; where the vendor names what it reads besides Triton's
    files (:meth:`~bridge.vendors.vendor.Vendor.backend_fingerprint`: ptxas on CUDA), memoized
    under that."""
    fp = target.vendor.backend_fingerprint(target.arch)
    if fp is None:
        return str(backend.hash())
    found = _memo.get(("backend", fp))
    if found is None:
        found = _memo[("backend", fp)] = memoized(
            cache, f"backend:{target}", fp, lambda: str(backend.hash()), _text
        )
    return found


# -- the compiler's environment ---------------------------------------------------------------
#: variables whose effect the bridge does not apply, with what Triton's ``compile`` would do: the
#: bridge runs the backend's stages itself, so they change nothing it compiles (a process that
#: sets one is warned, once)
NOT_APPLIED = {"TRITON_KERNEL_OVERRIDE": "Triton's override files (TRITON_OVERRIDE_DIR)"}
#: variables Triton reads that cannot change the code it compiles: where caches and dumps go,
#: what only times, dumps or prints (the native library's timers, IR dumps, diagnostics, LLVM's
#: debug output), how MLIR schedules its passes on threads (not what they compute), tools whose
#: identity the backend's holds, what only the launcher or the autotuner reads
NEUTRAL = (
    frozenset(
        {"TRITON_CACHE_DIR", "TRITON_DUMP_DIR", "TRITON_OVERRIDE_DIR", "TRITON_HOME",
         "TRITON_CACHE_MANAGER", "TRITON_REMOTE_CACHE_BACKEND", "TRITON_REDIS_HOST",
         "TRITON_REDIS_PORT", "TRITON_REDIS_KEY_FORMAT", "TRITON_KERNEL_DUMP",
         "TRITON_DUMP_PTXAS_LOG", "NVPTX_ENABLE_DUMP", "AMDGCN_ENABLE_DUMP",
         "MLIR_ENABLE_DUMP", "MLIR_DUMP_PATH", "LLVM_IR_ENABLE_DUMP", "MLIR_ENABLE_TIMING",
         "LLVM_ENABLE_TIMING", "MLIR_ENABLE_DIAGNOSTICS", "TRITON_ENABLE_LLVM_DEBUG",
         "TRITON_LLVM_DEBUG_ONLY", "MLIR_DISABLE_MULTITHREADING", "TRITON_ALWAYS_COMPILE",
         "TRITON_STORE_BINARY_ONLY", "TRITON_CACHE_AUTOTUNING", "TRITON_PRINT_AUTOTUNING",
         "TRITON_PROTON_DISABLE", "TRITON_ENABLE_NVTX", "TRITON_FRONT_END_DEBUGGING",
         "TRITON_LIBCUDA_PATH", "TRITON_LIBHIP_PATH", "TRITON_CUDART_PATH",
         "TRITON_CUDACRT_PATH", "CC", "PATH", "LD_LIBRARY_PATH", "ROCM_PATH", "HIP_PATH",
         "TRITON_BACKENDS_IN_TREE", "TRITON_PTXAS_PATH", "TRITON_PTXAS_BLACKWELL_PATH",
         "TRITON_CUOBJDUMP_PATH", "TRITON_NVDISASM_PATH", "HOME", "TMPDIR", "USER",
         "PYTHONPATH"}
    )
    | NOT_APPLIED.keys()
)  # fmt: skip
#: variables that select which devices a process sees (the target is given or detected, never
#: taken from them): never part of a key, whichever Triton reads them
DEVICE_SELECTION = frozenset(
    {"CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES",
     "GPU_DEVICE_ORDINAL", "HSA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "LOCAL_RANK", "RANK",
     "WORLD_SIZE", "TRITON_DEVICE"}
)  # fmt: skip
#: Triton's files and folders that never run in a compile (its test runner and helpers, the
#: profiler, command-line tools): what they read is not scanned
NOT_COMPILER = frozenset(
    {"_test_runner.py", "_internal_testing.py", "testing.py", "_compile_warmup.py",
     "_compile_warmup_pool.py", "profiler", "tools", "__pycache__"}
)  # fmt: skip
#: variables naming a tool the compile runs or a library it links or loads (an LLVM pass
#: plugin): they count by the content of the file they name
TOOLS = ("TRITON_PTXAS_PATH", "TRITON_PTXAS_BLACKWELL_PATH", "TRITON_LIBDEVICE_PATH",
         "LLVM_PASS_PLUGIN_PATH")  # fmt: skip
#: knob groups whose knobs cannot change compiled code
NEUTRAL_GROUPS = frozenset({"cache", "redis", "autotuning", "proton", "build"})
#: the version of how the environment's variables are found (in the memo's fingerprint)
_ENVIRONMENT_VERSION = 3
_DIRECT = re.compile(
    r"""(?:getenv(?:_bool)?\(|environ\.get\(|environ\[)\s*["']([A-Za-z_][A-Za-z0-9_]*)["']"""
)
#: what Triton's native library reads as true in a boolean variable (lowercased; any other
#: value is false)
_NATIVE_TRUE = frozenset({"on", "true", "1"})


def counts(name: str) -> bool:
    """Whether the variable ``name`` can change what the bridge compiles: not one of
    :data:`NEUTRAL` (which holds :data:`NOT_APPLIED`) or :data:`DEVICE_SELECTION`."""
    return name not in NEUTRAL and name not in DEVICE_SELECTION


@functools.lru_cache(maxsize=1)
def _groups() -> tuple[tuple[str, Any], ...]:
    """Triton's knob groups, by name."""
    from triton import knobs

    base = getattr(knobs, "base_knobs", None)
    if base is None:
        return ()
    return tuple((n, v) for n, v in sorted(vars(knobs).items()) if isinstance(v, base))


def _descriptors(kind: type) -> dict[str, Any]:
    """The knobs of a group of type ``kind`` that read a variable, by name (``.key`` is the
    variable)."""
    from triton import knobs

    base = getattr(knobs, "env_base", None)
    found = {}
    for cls in reversed(kind.__mro__):
        for name, value in vars(cls).items():
            if base is not None and isinstance(value, base):
                found[name] = value
    return found


def _scan() -> str:
    """Every variable the installed Triton reads that can change compiled code (see the
    module docstring), as a JSON list."""
    import triton

    names: set[str] = set()
    for group, knobs in _groups():
        if group not in NEUTRAL_GROUPS:
            found = _descriptors(type(knobs)).values()
            names.update(str(d.key) for d in found if hasattr(d, "key"))
    base = os.path.dirname(os.path.abspath(triton.__file__))
    for directory, subdirs, files in os.walk(base):
        subdirs[:] = [d for d in subdirs if d not in NOT_COMPILER]
        for name in files:
            if name.endswith(".py") and name not in NOT_COMPILER:
                try:
                    with open(os.path.join(directory, name), encoding="utf-8") as f:
                        names.update(_DIRECT.findall(f.read()))
                except (OSError, UnicodeDecodeError):
                    continue
    return json.dumps(sorted(n for n in names if counts(n)))


_known: dict[str, tuple[str, ...]] = {}
#: the label of the memo of :func:`environment_variables`
ENVIRONMENT_LABEL = "triton_environment"


def environment_fingerprint() -> str:
    """What the memo of :func:`environment_variables` is keyed by: the installed Triton's
    files."""
    return f"{_ENVIRONMENT_VERSION}:{triton_fingerprint()}"


def environment_variables(cache: Cache | None) -> tuple[str, ...]:
    """The variables that count (see the module docstring), found once per Triton."""
    fp = environment_fingerprint()
    found = _known.get(fp)
    if found is None:
        found = _known[fp] = _listed(memoized(cache, ENVIRONMENT_LABEL, fp, _scan, _listed))
    return found


def _text(value: str) -> bool:
    return len(value) <= 4096 and all(c.isprintable() or c in "\t\n\r" for c in value)


def _listed(text: str) -> tuple[str, ...]:
    """The names in ``text``, :func:`_scan`'s JSON list (ValueError where it is not one)."""
    names = json.loads(text)
    if type(names) is not list or not all(type(n) is str and _NAME.fullmatch(n) for n in names):
        raise ValueError("not a list of variable names")
    return tuple(names)


def _shown(value: Any) -> Any:
    """A knob's value as plain data (a tool by its version and the content of its file: its
    path is the machine's)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return plain_text(value)
    version = getattr(value, "version", None)
    if version is not None:
        return ["tool", str(version), tool_digest(str(getattr(value, "path", "")))]
    return ["object", type(value).__qualname__]


def tool_digest(path: str) -> str | None:
    """The sha256 of the file at ``path`` (memoized by its size and modification time), None
    where there is none."""
    try:
        st = os.stat(path)
        return file_digest(os.path.abspath(path), st.st_size, st.st_mtime_ns)
    except OSError:
        return None


#: hooks with no exact description, by id: (the hook, this process's own token for it)
_own: dict[int, tuple[Any, str]] = {}


def _hook(hook: Any) -> Any:
    """A stages hook as plain data: its description, or a token of this process's own."""
    from .jit import constant

    try:
        return ["hook", constant(hook)]
    except (ValueError, RecursionError):
        known = _own.get(id(hook))
        if known is None or known[0] is not hook:
            known = _own[id(hook)] = (hook, f"{os.getpid()}:{os.urandom(8).hex()}")
        return ["hook of this process", known[1]]


@functools.lru_cache(maxsize=1)
def _native() -> Any:
    from triton._C.libtriton import get_cache_invalidating_env_vars

    return get_cache_invalidating_env_vars


@functools.lru_cache(maxsize=1)
def _boolean_knobs() -> dict[str, tuple[Any, str, Any]]:
    """The variables behind Triton's boolean knobs (``env_bool``, with a default), each with
    its knob: ``(the group, the knob's name, its descriptor)``."""
    from triton import knobs

    kind = getattr(knobs, "env_bool", None)
    found: dict[str, tuple[Any, str, Any]] = {}
    for _, group in _groups() if kind is not None else ():
        for name, knob in _descriptors(type(group)).items():
            if type(knob) is kind and isinstance(getattr(knob, "default", None), bool):
                found[str(knob.key)] = (group, name, knob)
    return found


def _boolean(knob: Any, text: str) -> Any:
    """The variable behind the boolean knob ``knob``, set to ``text``, as Triton reads it:
    the knob's value (its Python reading) and the native library's reading (:data:`_NATIVE_TRUE`).
    None where both give the knob's default: set so, the variable changes nothing."""
    python = bool(knob.get())
    native = text.isascii() and text.lower() in _NATIVE_TRUE
    if python == knob.default and native == knob.default:
        return None
    return ["bool", python, native]


def _variables(cache: Cache | None) -> dict[str, Any]:
    """The variables that count, as set now, by name: their values (a boolean knob's as
    :func:`_boolean` reads it, a tool by its file's content)."""
    environ = os.environ
    found: dict[str, Any] = {n: environ[n] for n in environment_variables(cache) if n in environ}
    found.update((n, v) for n, v in _native()().items() if counts(n))
    booleans = _boolean_knobs()
    for name in [n for n in found if n in booleans]:
        value = _boolean(booleans[name][2], environ.get(name, str(found[name])))
        if value is None:
            del found[name]
        else:
            found[name] = value
    for name in TOOLS:
        if environ.get(name):
            found[name] = ["tool", tool_digest(environ[name])]
    return found


def _knob_counts(knob: Any, value: Any) -> bool:
    """Whether the knob ``knob``, set from Python to ``value``, can change what the bridge
    compiles: its variable counts (or names a tool), and a boolean knob is not set to its
    default."""
    variable = getattr(knob, "key", None)
    if isinstance(variable, str) and not counts(variable) and variable not in TOOLS:
        return False
    default = getattr(knob, "default", None)
    return not (isinstance(value, bool) and isinstance(default, bool) and value == default)


def _warn_not_applied() -> None:
    """Warn, once per process, that a variable of :data:`NOT_APPLIED` asks for what the bridge
    does not do (a boolean knob's variable where Triton reads it as true, another where set)."""
    booleans = _boolean_knobs()
    for variable, what in NOT_APPLIED.items():
        knob = booleans.get(variable)
        if not (getattr(knob[0], knob[1], False) if knob else os.environ.get(variable)):
            continue
        warn_once(
            logger,
            ("not applied", variable),
            "%s is set, but the bridge compiles kernels through its own stages and does not "
            "apply %s: the kernels are compiled from their code as if it were unset (unset "
            "it, or compile with triton directly)",
            variable,
            what,
        )


def environment_settings(cache: Cache | None) -> list[Any]:
    """What counts, as set now: ``[[variable, value], ...]`` then ``[[group, knob, value],
    ...]`` for knobs set from Python. Warns where a variable the bridge does not apply is set
    (:data:`NOT_APPLIED`)."""
    _warn_not_applied()
    found = _variables(cache)
    knobs = []
    for group, values in _groups():
        own = vars(values)
        if own and group not in NEUTRAL_GROUPS:  # (knobs set from Python: few, if any)
            described = _descriptors(type(values))
            for name in sorted(described.keys() & own.keys()):
                value = own[name]
                if not _knob_counts(described[name], value):
                    continue
                file = getattr(described[name], "key", None) in TOOLS and isinstance(value, str)
                knobs.append([group, name, ["tool", tool_digest(value)] if file else _shown(value)])
    from triton import knobs as triton_knobs

    hook = getattr(getattr(triton_knobs, "runtime", None), "add_stages_inspection_hook", None)
    if hook is not None:
        knobs.append(["runtime", "add_stages_inspection_hook", _hook(hook)])
    return [sorted(found.items()), knobs]


def environment_digest(cache: Cache | None) -> str:
    """The digest of :func:`environment_settings`: the compiler's environment as set now."""
    text = json.dumps(environment_settings(cache), separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()
