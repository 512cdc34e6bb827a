"""How a compiled kernel rides in jaxlib's custom call.

- ``inline``: the machine code (cubin or HSACO) in ``TritonKernel.module_image.object_file``.
  jaxlib >= 0.11.1 loads it as is: no ptxas at XLA compile time, no file on ROCm. The ``ptx``
  field, which jaxlib uses as part of its in-process module-cache key, then holds the real PTX
  where the target has PTX (valid for any fallback compile) and a key-derived token elsewhere;
  both end with the kernel key, so two different binaries never share it.
- ``ptx``: CUDA PTX text in ``ptx``; jaxlib runs ptxas on it at XLA compile time (every process
  whose JAX cache misses). For jaxlib without module_image. The ``.version`` line is the newest
  PTX ISA the installed jaxlib's ptxas assembles where the code needs nothing newer, else the
  lowering fails with the versions and the fix (see :mod:`bridge.embed.ptxisa`).
- ``path``: ROCm HSACO handed over by file path, for jaxlib without module_image (see
  :mod:`bridge.embed.handoff` for how the read-then-delete race is avoided).
- ``auto`` (default, or ``$KERNELCACHE_EMBED``): ``inline`` where the running jaxlib honours
  module_image, else the vendor's fallback (``ptx`` on CUDA, ``path`` on ROCm).

Which modes a target takes is its descriptor's (:meth:`bridge.vendors.vendor.Vendor.embed_modes`).
"""

from __future__ import annotations

import hashlib
import logging
from typing import TYPE_CHECKING

from kernelcache.plugin import warn_once

from .. import versions
from ..exceptions import EmbedError
from ..settings import EMBED_MODES
from ..vendors import backends
from ..vendors.targets import Target
from ..vendors.vendor import registered
from . import ptxisa

if TYPE_CHECKING:
    from kernelcache import Cache

    from ..settings import BridgeSettings

logger = logging.getLogger(__name__)

MODES = EMBED_MODES


def choose_mode(
    requested: str | None,
    target: Target,
    jaxlib: str | None = None,
    cfg: BridgeSettings | None = None,
) -> str:
    """The embedding to use for ``target`` under ``jaxlib`` (default: the running one).

    Raises:
        EmbedError: an unknown mode, or one that cannot work for this target and jaxlib.
    """
    from ..settings import settings

    mode = (requested or (cfg or settings()).embed or "auto").strip().lower()
    if mode not in MODES:
        raise EmbedError(f"embed={requested!r} is not one of {', '.join(MODES)}")
    jaxlib = jaxlib or versions.jaxlib_version()
    modern = versions.honours_module_image(jaxlib)
    vendor = target.vendor
    if mode == "auto":
        return vendor.auto_embed(modern)
    if mode not in vendor.embed_modes():
        takers = " and ".join(v.title for v in registered() if mode in v.embed_modes())
        takes = " or ".join(map(repr, vendor.embed_modes()))
        raise EmbedError(f"embed={mode!r} is for {takers}; {target} takes {takes}")
    if mode == "inline" and not modern:
        # honoured as asked: the module may be exported to run under a newer jaxlib
        minimum = ".".join(map(str, versions.MODULE_IMAGE))
        consequence = vendor.inline_on_old_jaxlib
        warn_once(
            logger,
            ("embed-inline", target.backend, jaxlib),
            "embed='inline': jaxlib %s ignores TritonKernel.module_image, so if this module "
            "runs under it, %s; inline machine code needs jaxlib >= %s",
            jaxlib,
            consequence,
            minimum,
        )
    return mode


def assembled_ptx(ptx: str, target: Target, what: str, cache: Cache | None, strict: bool) -> str:
    """``ptx`` for a jaxlib that assembles it itself: with the ``.version`` the installed
    jaxlib's ptxas accepts (unchanged where that is unknown: no jaxlib CUDA plugin).

    Raises:
        EmbedError: with ``strict`` (``embed="ptx"``), the code needs a newer PTX ISA than that
            ptxas assembles. Without it (inline machine code, which a newer jaxlib loads as is),
            such PTX is left as Triton wrote it.
    """
    assembler = ptxisa.jaxlib_assembler(cache)
    written = ptxisa.written_isa(ptx)
    if assembler is None or written is None or written <= assembler.isa:
        return ptx
    try:
        return ptxisa.lowered(ptx, assembler, backends.llvm_ptx_isa(target, written), what)
    except EmbedError:
        if strict:
            raise
        return ptx


def marked_ptx(ptx: str, binary: bytes) -> str:
    """PTX text ending in a comment naming the digest of the machine code it comes with: keeps
    jaxlib's cache key (the PTX text) unique to that code, and the same whichever entry of the
    cache served it (what embeds depends on what the kernel is, never on where it was kept)."""
    return f"{ptx.rstrip()}\n// kernelcache {_digest(binary)}\n"


def binary_token(ext: str, binary: bytes) -> str:
    """The ``ptx`` field of inline machine code without PTX (HSACO): a stable token unique to
    this binary."""
    return f"kernelcache:{ext}:{_digest(binary)}"


def handoff_name(ext: str, binary: bytes) -> str:
    """The file name machine code handed over by path has (:mod:`.handoff`): its digest, as
    the PTX marker and the inline token name it, so the path, and with it the lowered module,
    is the same whichever entry (a chained key, an in-memory compile) served the code."""
    return f"{_digest(binary)}.{ext}"


def _digest(binary: bytes) -> str:
    return hashlib.sha256(binary).hexdigest()
