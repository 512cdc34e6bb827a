"""Which PTX ISA the running jaxlib can assemble, and PTX text it accepts.

Where jaxlib compiles the ``ptx`` field itself (``embed="ptx"``, or ``"inline"`` under a jaxlib
that ignores module_image), it runs ptxas at XLA compile time. jaxlib's CUDA plugins are built
without libnvptxcompiler (their ``_triton`` library carries XLA's stub, "XLA was built without
libnvptxcompiler support"), so that is a ``ptxas`` executable, found the way XLA finds it
(``FindPtxAsExecutable``): ``bin/ptxas`` under the working directory, the ``PATH``, then the
CUDA roots XLA knows (``/usr/local/cuda``, ``/opt/cuda``, and the ``nvidia-cuda-nvcc`` wheel
installed beside the plugin: ``site-packages/nvidia/cu13`` for CUDA 13, ``nvidia/cuda_nvcc``
for CUDA 12), skipping releases older than 11.8 and 12.3.103. A ptxas accepts PTX up to the ISA
of its CUDA release (CUDA 13.0 -> ISA 9.0), and Triton writes the ISA of the ptxas *it* bundles
(Triton 3.9: CUDA 13.4 -> ``.version 9.4``), which an older jaxlib ptxas refuses.

Triton's own rule for an older ptxas is to write that ptxas's ISA on the ``.version`` line
(``make_ptx``), while LLVM generates code for at most the ISA Triton lets it use (``get_features``:
``min(ptx_version, 90)`` in Triton 3.9, ``min(ptx_version, 86)`` in 3.6) and for the target's
minimum. :func:`lowered` applies the same rule to a PTX text: it writes the ISA jaxlib accepts
when the code needs nothing newer, and otherwise raises an error naming both versions and the fix.

Detection needs no GPU: it runs ``ptxas --version``, memoized in the kernel cache by the
identity (path, size, mtime) of the file. Where no ptxas is found, the fallback is the CUDA
release the plugin was built with: what every ptxas its wheels install accepts, and what a
plugin built with libnvptxcompiler (one without the stub) assembles.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import stat
import subprocess
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from ..entries import memos
from ..exceptions import EmbedError

if TYPE_CHECKING:
    from kernelcache import Cache

logger = logging.getLogger(__name__)

#: jaxlib's CUDA plugins, in the order jax looks for them, with the CUDA major of each
PLUGINS = (("jax_cuda13_plugin", 13), ("jax_cuda12_plugin", 12))
#: XLA's bounds on the ptxas it runs (subprocess_compilation.cc)
MINIMUM_PTXAS = (11, 8, 0)
EXCLUDED_PTXAS = ((12, 3, 103),)
_VERSION = re.compile(r"\bV(\d+)\.(\d+)\.(\d+)\b")
#: in a jaxlib library built without libnvptxcompiler: it runs the ptxas executable
NO_LIBRARY = b"XLA was built without libnvptxcompiler support"
_DOT_VERSION = re.compile(r"^(\s*\.version\s+)(\d+)\.(\d+)", re.MULTILINE)

#: the lowest PTX ISA each ``.target`` needs (PTX ISA release notes); unlisted targets are
#: assumed to need the ISA the PTX was written for
TARGET_ISA = {
    "sm_70": 60,
    "sm_72": 61,
    "sm_75": 63,
    "sm_80": 70,
    "sm_86": 71,
    "sm_87": 74,
    "sm_89": 78,
    "sm_90": 78,
    "sm_90a": 80,
    "sm_100": 86,
    "sm_100a": 86,
    "sm_100f": 88,
    "sm_101": 86,
    "sm_101a": 86,
    "sm_103": 88,
    "sm_103a": 88,
    "sm_110": 90,
    "sm_110a": 90,
    "sm_120": 87,
    "sm_120a": 87,
    "sm_121": 88,
    "sm_121a": 88,
}


def max_isa(cuda: str | Sequence[int]) -> int:
    """The newest PTX ISA (as 10*major + minor) that ptxas of CUDA ``cuda`` assembles:
    Triton's table (``ptx_get_version``). "13.0" -> 90, "12.9" -> 88, "12.8" -> 87, "11.8" -> 78.

    Raises:
        ValueError: not a CUDA version, or older than CUDA 10.
    """
    try:
        parts = [int(p) for p in (cuda.split(".") if isinstance(cuda, str) else cuda)][:2]
        major, minor = parts[0], parts[1] if len(parts) > 1 else 0
    except (ValueError, IndexError):
        raise ValueError(f"not a CUDA version: {cuda!r}") from None
    if major >= 13:
        return 90 + (major - 13) * 10 + minor
    if major == 12:
        return 80 + minor if minor < 6 else 80 + minor - 1
    if major == 11:
        return 70 + minor
    if major == 10:
        return 63 + minor
    raise ValueError(f"CUDA {cuda} is older than 10.0, which no supported Triton handles")


def cuda_for_isa(isa: int) -> str:
    """The oldest CUDA release whose ptxas assembles PTX ISA ``isa`` (the inverse of
    :func:`max_isa`): 90 -> "13.0", 88 -> "12.9", 85 -> "12.5"."""
    for major in range(10, 100):
        for minor in range(10):
            if max_isa((major, minor)) >= isa:
                return f"{major}.{minor}"
    raise ValueError(f"no CUDA release assembles PTX ISA {isa}")


def isa_text(isa: int) -> str:
    """90 -> "9.0"."""
    return f"{isa // 10}.{isa % 10}"


def written_isa(ptx: str) -> int | None:
    """The ISA on the ``.version`` line of ``ptx``, or None without one."""
    m = _DOT_VERSION.search(ptx)
    return int(m.group(2)) * 10 + int(m.group(3)) if m else None


def _target(ptx: str) -> str | None:
    m = re.search(r"^\s*\.target\s+(sm_\w+)", ptx, re.MULTILINE)
    return m.group(1) if m else None


class Assembler(NamedTuple):
    """The PTX assembler jaxlib runs: its CUDA release, the ISA it takes and where it is
    (``origin``: the ptxas path, or how the release was inferred)."""

    cuda: str
    isa: int
    origin: str


def lowered(ptx: str, accepts: Assembler, llvm_isa: int | None, what: str) -> str:
    """``ptx`` with a ``.version`` line ``accepts`` can assemble.

    Unchanged when its ISA is not newer than ``accepts.isa``. Otherwise the ``.version`` line is
    rewritten to ``accepts.isa`` (Triton's rule for an older ptxas), provided the code needs
    nothing newer: ``llvm_isa``, the ISA Triton let LLVM generate code for (None: unknown, taken
    as the written one), and the minimum ISA of the ``.target``.

    Raises:
        EmbedError: the code needs a newer ISA than ``accepts`` assembles; the message names
            both versions and the ways out. ``what`` names the kernel and target in it.
    """
    written = written_isa(ptx)
    if written is None or written <= accepts.isa:
        return ptx
    target = _target(ptx)
    floor = TARGET_ISA.get(target or "", written)
    needs = max(written if llvm_isa is None else min(llvm_isa, written), floor)
    if needs <= accepts.isa:
        return _DOT_VERSION.sub(lambda m: m.group(1) + isa_text(accepts.isa), ptx, count=1)
    ways = ["embed='inline' (jaxlib >= 0.11.1 loads the compiled binary and runs no ptxas)"]
    if floor <= accepts.isa:
        ways.append(
            f"pass ptx_version={accepts.isa} so that Triton generates PTX for ISA "
            f"{isa_text(accepts.isa)}"
        )
    cuda = cuda_for_isa(needs)
    wheel = "nvidia-cuda-nvcc" if int(cuda.split(".")[0]) >= 13 else "nvidia-cuda-nvcc-cu12"
    ways.append(
        f"give jaxlib a ptxas of CUDA >= {cuda} (first on PATH, or pip install '{wheel}>={cuda}')"
    )
    on = f" for {target}" if target else ""
    raise EmbedError(
        f"{what}: Triton wrote PTX ISA {isa_text(written)}{on} whose code may use PTX ISA "
        f"{isa_text(needs)}, but the ptxas jaxlib runs ({accepts.origin}, CUDA {accepts.cuda}) "
        f"assembles PTX ISA {isa_text(accepts.isa)} at most. Use " + "; or ".join(ways)
    )


# -- detection ---------------------------------------------------------------------------------
def plugin() -> tuple[str, int] | None:
    """The directory of jaxlib's CUDA plugin package and its CUDA major, without importing it."""
    import importlib.util

    for name, major in PLUGINS:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        if spec is not None and spec.submodule_search_locations:
            return next(iter(spec.submodule_search_locations)), major
    return None


#: the CUDA installations XLA looks in after the PATH, before the wheels beside the plugin
SYSTEM_ROOTS = ("/usr/local/cuda", "/opt/cuda")


def candidates(
    path: Sequence[str],
    plugin_dir: str | None,
    cuda_major: int,
    system_roots: Sequence[str] = SYSTEM_ROOTS,
) -> list[str]:
    """The ptxas paths XLA tries, in its order: ``FindCudaExecutable`` with ptxas preferred from
    the PATH (``path``: its directories), then ``CandidateCudaRoots`` (``system_roots``, then
    roots relative to the plugin's library)."""
    found = [os.path.join("bin", "ptxas")]
    found += [os.path.join(d, "ptxas") for d in path]
    roots = list(system_roots)
    if plugin_dir:
        wheel = "cu13" if cuda_major >= 13 else "cuda_nvcc"
        roots += [
            os.path.join(plugin_dir, "..", "nvidia", wheel),
            os.path.join(plugin_dir, "..", "..", "nvidia", wheel),
            os.path.join(plugin_dir, "cuda"),
            os.path.join(plugin_dir, "..", "..", "..", ".."),
            os.path.join(plugin_dir, "..", "..", "..", "..", ".."),
        ]
    found += [os.path.join(r, "bin", "ptxas") for r in roots]
    return found


def ptxas_release(path: str) -> tuple[int, int, int] | None:
    """The CUDA release of the ptxas at ``path`` (from ``--version``), or None if it does not
    run or names no release."""
    try:
        out = subprocess.run(
            [path, "--version"], capture_output=True, text=True, timeout=60, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    m = _VERSION.search(out)
    return (int(m.group(1)), int(m.group(2)), int(m.group(3))) if m else None


def _fingerprint(path: str, executable: bool = True) -> str | None:
    """A digest of the identity of the (executable) regular file at ``path``, or None."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    if not stat.S_ISREG(st.st_mode) or (executable and not os.access(path, os.X_OK)):
        return None
    doc = json.dumps([os.path.abspath(path), st.st_size, st.st_mtime_ns])
    return hashlib.sha256(doc.encode()).hexdigest()


_RELEASE = re.compile(r"\d{1,6}\.\d{1,6}\.\d{1,6}")


def _release_text(text: str) -> bool:
    return _RELEASE.fullmatch(text) is not None


def _release(path: str, cache: Cache | None) -> tuple[int, ...] | None:
    """:func:`ptxas_release`, memoized in ``cache`` by the file's identity."""
    fingerprint = _fingerprint(path)
    if fingerprint is None:
        return None
    known = memos.lookup(cache, "ptxas-release", fingerprint, _release_text)
    if known is not None:
        return tuple(int(x) for x in known.split("."))
    release = ptxas_release(path)
    if release is not None:
        memos.remember(cache, "ptxas-release", fingerprint, ".".join(map(str, release)))
    return release


def find(paths: Iterable[str], cache: Cache | None = None) -> Assembler | None:
    """The first of ``paths`` that XLA would run as ptxas (an executable of a release it
    accepts), with its release; releases are memoized in ``cache`` (a kernelcache.Cache or
    None) by file identity."""
    for path in paths:
        release = _release(path, cache)
        if release is None or release < MINIMUM_PTXAS or release in EXCLUDED_PTXAS:
            continue
        return Assembler(".".join(map(str, release)), max_isa(release), path)
    return None


def _built_with(plugin_name: str) -> tuple[int, int] | None:
    """The CUDA release jaxlib's plugin was built with (13000 -> (13, 0)), if it says."""
    import importlib

    try:
        versions = importlib.import_module(f"{plugin_name}._versions")
        built = int(versions.cuda_runtime_build_version())
    except (ImportError, AttributeError, RuntimeError, TypeError, ValueError):
        return None
    return (built // 1000, built % 1000 // 10) if built > 0 else None


def runs_ptxas_executable(plugin_dir: str, cache: Cache | None = None) -> bool:
    """Whether the plugin's Triton library runs a ptxas executable: it carries XLA's stub for a
    build without libnvptxcompiler (memoized by the library's identity). True where the library
    cannot be read: jaxlib's wheels have always done so."""
    try:  # _triton*.so, listed without glob (which compiles its pattern in every process)
        names = os.listdir(plugin_dir)
    except OSError:
        names = []
    libraries = sorted(
        os.path.join(plugin_dir, n) for n in names if n.startswith("_triton") and n.endswith(".so")
    )
    if not libraries:
        return True
    fingerprint = _fingerprint(libraries[0], executable=False)
    if fingerprint is None:
        return True
    known = memos.lookup(cache, "ptxas-stub", fingerprint, ("0", "1").__contains__)
    if known is not None:
        return known == "1"
    import mmap  # (a library is read once: its answer is memoized in the cache)

    try:
        with open(libraries[0], "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            stub = m.find(NO_LIBRARY) >= 0
    except (OSError, ValueError):
        return True
    memos.remember(cache, "ptxas-stub", fingerprint, "1" if stub else "0")
    return stub


def detect(
    path: Sequence[str],
    plugin_at: tuple[str, int] | None,
    cache: Cache | None,
    system_roots: Sequence[str] = SYSTEM_ROOTS,
) -> Assembler | None:
    """The assembler of the jaxlib whose CUDA plugin is at ``plugin_at`` (directory, CUDA major)
    for a process whose PATH is ``path``; None without a plugin. See :func:`jaxlib_assembler`."""
    if plugin_at is None:
        logger.debug("no jaxlib CUDA plugin: the PTX ISA jaxlib assembles is unknown")
        return None
    plugin_dir, major = plugin_at
    name = os.path.basename(os.path.normpath(plugin_dir))
    if not runs_ptxas_executable(plugin_dir, cache):
        built = _built_with(name) or (major, 0)
        linked = Assembler(
            f"{built[0]}.{built[1]}", max_isa(built), f"libnvptxcompiler linked into {name}"
        )
        logger.debug("jaxlib's PTX assembler: %s", linked)
        return linked
    assembler = find(candidates(path, plugin_dir, major, system_roots), cache)
    if assembler is not None:
        logger.debug("jaxlib's ptxas: %s", assembler)
        return assembler
    built = _built_with(name) or (major, 0)
    assumed = Assembler(
        f"{built[0]}.{built[1]}", max_isa(built), f"no ptxas found; the CUDA {name} was built with"
    )
    logger.warning(
        "kernelcache: no ptxas where jaxlib looks for one (bin/ptxas, PATH, /usr/local/cuda, the "
        "nvidia-cuda-nvcc wheel beside %s): assuming PTX ISA %s, which CUDA %s (%s's build) "
        "assembles. jaxlib needs a ptxas to compile PTX: pip install 'nvidia-cuda-nvcc>=%s', or "
        "use embed='inline' with jaxlib >= 0.11.1",
        name,
        isa_text(assumed.isa),
        assumed.cuda,
        name,
        assumed.cuda,
    )
    return assumed


_detected: dict[tuple[Any, ...], Assembler | None] = {}


def jaxlib_assembler(cache: Cache | None = None) -> Assembler | None:
    """The PTX assembler the installed jaxlib runs: the first ptxas found as XLA finds it, else
    (with a warning) the CUDA release the plugin was built with; None without a jaxlib CUDA
    plugin. Detected once per process and PATH."""
    path = tuple(os.get_exec_path())
    key = (path, str(getattr(cache, "root", None)))
    if key not in _detected:
        _detected[key] = detect(path, plugin(), cache)
    return _detected[key]
