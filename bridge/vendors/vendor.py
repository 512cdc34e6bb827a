"""What a GPU vendor is to the bridge: :class:`Vendor`, one object per Triton backend.

A vendor holds everything that differs by vendor: the names Triton and JAX give it, the grammar
of its target names, launch geometry, its machine code and how jaxlib receives it, host TMA
support, and the largest shared memory one block may use per architecture, as data; and as
methods, the rules: what its backend's identity depends on (:meth:`Vendor.backend_fingerprint`),
how its backend specializes pointers (:meth:`Vendor.tensor_specialization`) and how its machine
code is embedded (:meth:`Vendor.embed_modes`, :meth:`Vendor.auto_embed`). The defaults suit a
vendor with none of these particularities; :mod:`.cuda` and :mod:`.hip` override them.

The registered vendors are found here too: by name, platform and machine code, and target names
parsed against every one of them (:func:`parse_name`). A vendor module registers its one object
(:func:`register`) when it is imported; the folder's ``__init__`` imports :mod:`.cuda` and
:mod:`.hip`, so every vendor is registered before any module of the folder is used.

Invariants: a vendor is a singleton, compared by identity and pickled by name (:func:`register`);
the modules of this folder are the only ones of the bridge that compare
vendor, backend or platform names. Nothing here imports jax or triton at import time.
"""

from __future__ import annotations

import copyreg
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import FrozenInstanceError, dataclass
from typing import Any, NamedTuple

from ..exceptions import TargetError

Arch = int | str

KiB = 1024


def file_row(path: str, name: str) -> list[Any]:
    """``[name, size, mtime_ns]`` of the file at ``path`` (size and mtime None: no such file):
    how a file's identity enters a fingerprint."""
    try:
        st = os.stat(path)
    except OSError:
        return [name, None, None]
    return [name, st.st_size, st.st_mtime_ns]


class Driver(NamedTuple):
    """A vendor's GPU driver API, as measuring launches through it (:mod:`bridge.tune.jaxlib_launch`):
    the shared library, the names of the functions it calls, and jaxlib's Triton module for the
    platform (in ``jax._src.lib.gpu_triton``)."""

    library: str
    jaxlib_triton: str
    init: str
    #: how a thread makes a device current: its primary context (``device_get`` then
    #: ``primary_context`` then ``set_context``), or one call with the ordinal (``set_device``)
    device_get: str | None
    primary_context: str | None
    set_context: str | None
    set_device: str | None
    #: ``(handle*, flags)`` each
    stream_create: str
    event_create: str
    event_record: str
    event_synchronize: str
    #: the first of these that the library exports
    event_elapsed: tuple[str, ...]
    stream_synchronize: str
    #: ``(char*, len, device)``: the PCI bus id of a device
    bus_id: str


@dataclass(frozen=True, eq=False)
class Vendor:
    """What the bridge needs to know about one of Triton's vendor backends.

    The methods are the rules that depend on the vendor or the architecture; their defaults suit
    a vendor whose code runs only on the exact architecture it was compiled for, whose backend
    hashes only Triton's files and specializes pointers without help, and whose machine code
    rides inline in the custom call. A vendor is a singleton: compared by identity, pickled by
    name.
    """

    #: Triton's backend name, also the prefix of target names: "cuda"
    name: str
    #: Triton's vendor package (``triton.backends.<package>``): "nvidia"
    package: str
    #: JAX's platform name for these GPUs: "cuda"
    platform: str
    #: who makes the GPUs, and what the platform is called, in messages: "NVIDIA", "CUDA"
    maker: str
    title: str
    #: a target name: the prefix (name or an alias) and the architecture in group 1
    grammar: re.Pattern[str]
    #: how messages spell a target name of this vendor, and valid examples of one
    name_form: str
    examples: tuple[str, ...]
    #: how to get Triton's backend for this vendor when it is missing
    install_hint: str
    #: Triton's options dataclass in ``triton.backends.<package>.compiler``
    options_class: str
    #: an architecture whose options list the option names of the backend
    probe_arch: Arch
    #: the extension of the machine code Triton writes ("cubin"), and whether PTX comes with it
    binary_ext: str
    has_ptx: bool
    #: what happens to inline machine code under a jaxlib that ignores ``module_image``
    inline_on_old_jaxlib: str
    #: threads per warp in the code where the architecture does not decide it, threads per
    #: warp in jaxlib's launch geometry (block size = num_warps x this), threads per block
    warp_size_default: int
    jaxlib_threads_per_warp: int
    max_threads_per_block: int
    #: the most shared memory (LDS) one block may use, in bytes, per architecture
    shared_memory: Mapping[Arch, int]
    #: the ELF ``e_machine`` of the machine code (None: not ELF); a compile's output is checked
    #: against it (see :func:`bridge.compile.compiler.output_problem`)
    elf_machine: int | None = None
    #: the ``embed=`` mode besides "inline", which "auto" means under a jaxlib that ignores
    #: ``module_image`` ("ptx": jaxlib runs ptxas; "path": handed over as a file); None: inline
    #: only
    fallback_embed: str | None = None
    #: the driver API measuring launches through (None: configs are measured by compiled
    #: programs)
    driver: Driver | None = None

    def __repr__(self) -> str:
        return f"Vendor({self.name})"

    def backend_fingerprint(self, arch: Arch) -> str | None:
        """A digest of what the backend's ``hash()`` for ``arch`` reads besides Triton's own
        files, under which its result is memoized across processes; None: ``hash()`` is cheap
        and is computed in every process (the default)."""
        return None

    def known_archs(self) -> tuple[Arch, ...] | None:
        """The architectures the compiler Triton runs for this vendor here knows (asked of it
        once per process), so that a target it does not know is refused before any compile;
        None where it cannot be asked (the default): nothing is refused."""
        return None

    def tensor_specialization(self, backend_class: type) -> Callable[..., str] | None:
        """How a backend of ``backend_class`` specializes a pointer argument, where the bridge
        answers in its place (a replacement for its ``get_tensor_specialization``); None:
        Triton's own answer (the default)."""
        return None

    def embed_modes(self) -> tuple[str, ...]:
        """The ``embed=`` modes that work for this vendor besides "auto"."""
        return ("inline",) if self.fallback_embed is None else ("inline", self.fallback_embed)

    def auto_embed(self, honours_module_image: bool) -> str:
        """What ``embed="auto"`` means under a jaxlib that honours ``module_image`` or not:
        inline where it loads ``module_image``, else the fallback (if any)."""
        if honours_module_image or self.fallback_embed is None:
            return "inline"
        return self.fallback_embed

    def parse_arch(self, text: str) -> Arch | None:
        """The architecture named by ``text`` (stripped, lower case), None if it is not one of
        this vendor's target names.

        Raises:
            TargetError: a name of this vendor for an architecture Triton cannot compile for.
        """
        m = self.grammar.fullmatch(text)
        return None if m is None else self.arch_of(m.group(1), text)

    def arch_of(self, raw: str, text: str) -> Arch:
        """The architecture from the text the grammar matched (``text`` for messages)."""
        return raw

    def warp_size(self, arch: Arch) -> int:
        """Threads per warp of code compiled for ``arch``."""
        return self.warp_size_default

    def runs_on(self, ours: Arch, theirs: Arch) -> bool:
        """Whether code compiled for ``ours`` loads on a device of architecture ``theirs``."""
        return ours == theirs

    def proto_compute_capability(self, arch: Arch) -> int:
        """``TritonKernel.compute_capability`` in jaxlib's message for ``arch``."""
        return 0

    def host_tma(self, arch: Arch) -> bool:
        """Whether jaxlib can pass host-side TMA descriptors to code for ``arch``."""
        return False

    def device_arch(self, device: Any) -> Arch | None:
        """The architecture of a JAX device of this platform, None if it cannot be read."""
        return None

    def max_shared_memory(self, arch: Arch) -> int | None:
        """The most shared memory one block may use on ``arch``, in bytes (None: unknown)."""
        return self.shared_memory.get(arch)

    def device_shared_memory(self, device: Any) -> int | None:
        """The most shared memory one block may use on a local JAX ``device``, read from the
        device itself. Hook, not read yet (None): a device attribute or Triton's
        ``driver.active.utils.get_device_properties(i)["max_shared_mem"]`` can answer it
        where the target is the local device; :meth:`max_shared_memory` answers for now."""
        return None


# -- the registered vendors -------------------------------------------------------------------
_registry: dict[str, Vendor] = {}


def register(vendor: Vendor) -> Vendor:
    """Make ``vendor`` known by its name (and its platform to the lowering), and pickled by its
    name; returns it.

    Raises:
        ValueError: another descriptor has its name or platform.
    """
    for other in _registry.values():
        if other is not vendor and other.platform == vendor.platform:
            raise ValueError(f"platform {vendor.platform!r} belongs to {other.name}")
    if _registry.get(vendor.name, vendor) is not vendor:
        raise ValueError(f"a vendor named {vendor.name!r} is registered already")
    _registry[vendor.name] = vendor
    copyreg.pickle(type(vendor), _reduce)
    return vendor


def frozen(self: Vendor, name: str, *value: Any) -> None:
    """``__setattr__`` and ``__delattr__`` of a vendor class that adds no field to
    :class:`Vendor` and so is no dataclass of its own (the generated methods refuse only
    :class:`Vendor`'s fields on an object of a subclass): every assignment is refused."""
    raise FrozenInstanceError(f"cannot assign to field {name!r}")


def _reduce(vendor: Vendor) -> tuple[Any, tuple[str]]:
    return by_name, (vendor.name,)


def unregister(vendor: Vendor) -> None:
    """Forget ``vendor`` (tests register descriptors of their own)."""
    if _registry.get(vendor.name) is vendor:
        del _registry[vendor.name]


def registered() -> tuple[Vendor, ...]:
    """Every registered descriptor, in registration order."""
    return tuple(_registry.values())


def by_name(name: str) -> Vendor:
    """The descriptor of Triton's backend ``name``.

    Raises:
        TargetError: no such backend is registered.
    """
    try:
        return _registry[name]
    except KeyError:
        known = ", ".join(_registry)
        raise TargetError(f"unknown GPU backend {name!r}: the bridge knows {known}") from None


def by_binary_ext(ext: str) -> Vendor | None:
    """The descriptor whose machine code has the extension ``ext``, None if there is none."""
    return next((v for v in _registry.values() if v.binary_ext == ext), None)


def by_platform(platform: str) -> Vendor | None:
    """The descriptor of JAX's ``platform``, None for a platform of no registered vendor."""
    return next((v for v in _registry.values() if v.platform == platform), None)


def examples() -> str:
    """Valid target names of every vendor, for messages."""
    return ", ".join(e for v in _registry.values() for e in v.examples)


def parse_name(text: str) -> tuple[Vendor, Arch]:
    """The vendor and architecture a target name names (any case, surrounding blanks ignored).

    Raises:
        TargetError: not a target name (the message shows valid examples), or one for an
            architecture Triton cannot compile for.
    """
    value = text.strip().lower()
    for vendor in _registry.values():
        arch = vendor.parse_arch(value)
        if arch is not None:
            return vendor, arch
    forms = " or ".join(v.name_form for v in _registry.values())
    raise TargetError(f"invalid target {text!r}: use {forms}, e.g. {examples()}")
