"""Whether an artifact is whole: a structural check per extension.

A compiler that runs out of room (a full ``TMPDIR``) can exit 0 after a short write; what it
leaves is an empty file or a prefix of the artifact. A hostile writer can leave code for
another machine under a GPU extension. These checks tell such artifacts from a complete one by
structure alone, without knowing who produced it:

* ``cubin`` and ``hsaco`` are ELF64 little-endian files for the extension's machine
  (:data:`MACHINES`: ``e_machine`` EM_CUDA=190 for a cubin, EM_AMDGPU=224 for an HSACO; an
  x86-64 object under either is refused): the header is whole, there is a section header
  table, it and every section that occupies file space (all but ``SHT_NOBITS``) lie within the
  file, the section name string table is there, and every program header's file image lies
  within the file. An empty or header-only file is refused.
* ``ptx`` is PTX text: ``.version`` and ``.target`` directives, balanced braces, no
  unterminated string or comment, no NUL byte, the text ends with a complete statement
  (``}`` or ``;``), at least one ``.entry`` with a body (the one the caller names, where it
  names one: an entry's metadata ``name``), and a body for every function it calls or declares
  (a ``.func`` declared by a prototype ending in ``;`` has its definition ``{...}`` in the same
  text, unless it is ``.extern``, such as ``vprintf``).

Other extensions have no structural check. Invariants: a check never raises, whatever the bytes
(it returns why they are not a whole artifact, or None); an ELF check costs time in proportion
to the file's header tables, not to its size; the PTX check is a scan of the whole text.

Who checks: :func:`kernelcache.schema.entry_problem` is the one contract of an entry (these
checks and the launch metadata of :mod:`kernelcache.schema.fields`), applied by ``put`` and
``replace`` (every build of ``get_or_create`` included), by ``verify``, to every remote value
and bundle entry, and by every read of an entry whose metadata is read from disk (there without
the PTX scan: see :func:`problem`'s ``full``). The bridge also checks what a compile produced
(:func:`elf_problem` against the target's machine, :func:`ptx_problem`) before it is stored.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Mapping

#: ELF header (64 bytes), section header (64), program header (56): ELF64, little-endian
_EHDR = struct.Struct("<16sHHIQQQIHHHHHH")
_SHDR = struct.Struct("<IIQQQQIIQQ")
#: what the bounds checks read of a section header (type, offset, size) and of a program
#: header (offset, file size)
_SECTION = struct.Struct("<4xI16xQQ24x")
_SEGMENT = struct.Struct("<8xQ16xQ16x")
ELF_MAGIC = b"\x7fELF"
ELFCLASS64 = 2
ELFDATA2LSB = 1
EV_CURRENT = 1
SHT_STRTAB = 3
SHT_NOBITS = 8
#: e_shnum / e_shstrndx / e_phnum escape values: the real value is in section header 0
SHN_XINDEX = 0xFFFF
PN_XNUM = 0xFFFF
#: e_machine values of the GPU code this cache holds
EM_CUDA = 190
EM_AMDGPU = 224
#: e_machine values named in messages
MACHINE_NAMES = {
    3: "x86",
    62: "x86-64",
    183: "AArch64",
    EM_CUDA: "NVIDIA CUDA",
    EM_AMDGPU: "AMD GPU",
}


def machine_name(machine: int) -> str:
    """``e_machine`` as a message names it: ``190 (NVIDIA CUDA)``."""
    name = MACHINE_NAMES.get(machine)
    return f"{machine} ({name})" if name else str(machine)


def elf_problem(data: bytes, machine: int | None = None) -> str | None:
    """Why ``data`` is not a whole ELF64 little-endian file (of ``machine``, when given: an
    ``e_machine`` value such as :data:`EM_CUDA`); None when it is one."""
    size = len(data)
    if size == 0:
        return "the file is empty (0 bytes)"
    if not data.startswith(ELF_MAGIC):
        return _short(size) if ELF_MAGIC.startswith(data) else "not an ELF file (no ELF magic)"
    if size < _EHDR.size:
        return _short(size)
    (ident, _, e_machine, _, _, phoff, shoff, _, ehsize, phentsize, phnum, shentsize, shnum,
     shstrndx) = _EHDR.unpack_from(data)  # fmt: skip
    if ident[4] != ELFCLASS64 or ident[5] != ELFDATA2LSB or ident[6] != EV_CURRENT:
        return "not a 64-bit little-endian ELF file of version 1"
    if machine is not None and e_machine != machine:
        return f"ELF code for machine {machine_name(e_machine)}, not {machine_name(machine)}"
    if ehsize != _EHDR.size:
        return f"an ELF header of {ehsize} bytes, not {_EHDR.size}"
    if shoff == 0:
        return "no section header table (a header-only file)"
    if shentsize != _SHDR.size:
        return f"section headers of {shentsize} bytes, not {_SHDR.size}"
    if shoff + _SHDR.size > size:
        return _past_end("the section header table", shoff, _SHDR.size, size)
    first = _SHDR.unpack_from(data, shoff)
    if shnum == 0:  # extended numbering: the count is section 0's sh_size
        shnum = first[5]
    if shstrndx == SHN_XINDEX:
        shstrndx = first[6]
    if phnum == PN_XNUM:
        phnum = first[7]
    if shnum == 0:
        return "no sections"
    if shoff + shnum * _SHDR.size > size:
        return _past_end(
            f"the section header table ({shnum} sections)", shoff, shnum * _SHDR.size, size
        )
    table = memoryview(data)[shoff : shoff + shnum * _SHDR.size]
    sections = _SECTION.iter_unpack(table)
    if max([o + n for t, o, n in sections if t != SHT_NOBITS], default=0) > size:
        for index, (sh_type, offset, length) in enumerate(_SECTION.iter_unpack(table)):
            if sh_type != SHT_NOBITS and offset + length > size:
                return _past_end(f"section {index}", offset, length, size)
    if not 0 < shstrndx < shnum:
        return f"no section name string table (index {shstrndx} of {shnum} sections)"
    strtab = _SHDR.unpack_from(data, shoff + shstrndx * _SHDR.size)
    if strtab[1] != SHT_STRTAB or strtab[5] == 0:
        return f"section {shstrndx}, the section name string table, is not a string table"
    if phnum:
        if phentsize != _SEGMENT.size:
            return f"program headers of {phentsize} bytes, not {_SEGMENT.size}"
        if phoff + phnum * _SEGMENT.size > size:
            return _past_end("the program header table", phoff, phnum * _SEGMENT.size, size)
        headers = memoryview(data)[phoff : phoff + phnum * _SEGMENT.size]
        for index, (offset, filesz) in enumerate(_SEGMENT.iter_unpack(headers)):
            if offset + filesz > size:
                return _past_end(f"program header {index}'s segment", offset, filesz, size)
    return None


def _short(size: int) -> str:
    return f"the ELF header is cut short ({size} of {_EHDR.size} bytes)"


def _past_end(what: str, offset: int, length: int, size: int) -> str:
    return (
        f"{what} ends at byte {offset + length}, past the end of the file ({size} bytes): "
        "the file is cut short"
    )


# The patterns of the PTX scan are compiled at its first use (``re`` keeps them): a process that
# only reads entries never scans PTX text.
#: what is not code in PTX: strings, line comments, block comments
_PTX_NOISE = rb'(?s)"(?:[^"\\\n]|\\.)*"|//[^\n]*|/\*.*?\*/'
_PTX_VERSION = rb"(?m)^\s*\.version\s+\d+\.\d+"
_PTX_TARGET = rb"(?m)^\s*\.target\s+\w"
_PTX_FUNCTION = rb"\.(?:entry|func)\s"
#: a function's header: its kind, name, and what ends it: ``{`` (its body follows: a
#: definition) or ``;`` (a declaration, a prototype); between the parameters and that,
#: performance directives such as ``.maxntid 128, 1, 1`` or ``.noreturn``
_PTX_HEADER = (
    rb"\.(entry|func)(?![\w$])\s*"
    rb"(?:\([^()]*\)\s*)?"  # a .func's return parameter
    rb"([A-Za-z_$%][\w$]*)\s*"  # the name
    rb"(?:\([^()]*\))?"  # the parameters
    rb"[^{};]*([{;])"
)
#: the linkage directives before a header that declare an external function (``.extern``)
_PTX_EXTERN = rb"\.extern\s+(?:\.(?:visible|weak|common)\s+)*\Z"
#: a direct call (``call.uni (retval0), name, (param0);``); an indirect one names a register
_PTX_CALL = rb"\bcall(?:\.uni)?\s+(?:\([^()]*\)\s*,\s*)?([A-Za-z_$][\w$]*)"


def ptx_problem(data: bytes, entry: str | None = None) -> str | None:
    """Why ``data`` is not whole PTX text (with a ``.entry`` named ``entry``, when given: the
    kernel an entry's metadata names); None when it is."""
    if not data:
        return "the file is empty (0 bytes)"
    if b"\0" in data:
        return "NUL bytes in PTX text (a damaged or short write)"
    code = re.sub(_PTX_NOISE, b" ", data)
    if b'"' in code:
        return "a string is not terminated: the text is cut short"
    if b"/*" in code:
        return "a comment is not terminated: the text is cut short"
    if re.search(_PTX_VERSION, code) is None:
        return "no .version directive"
    if re.search(_PTX_TARGET, code) is None:
        return "no .target directive"
    if re.search(_PTX_FUNCTION, code) is None:
        return "no .entry or .func"
    opened, closed = code.count(b"{"), code.count(b"}")
    if opened != closed:
        return f"{opened} '{{' but {closed} '}}': the text is cut short"
    if code.rstrip()[-1:] not in (b"}", b";"):
        return "the text ends inside a statement: it is cut short"
    return _functions_problem(code, entry)


def _functions_problem(code: bytes, entry: str | None) -> str | None:
    """Why the functions of PTX ``code`` (strings and comments blanked) are not whole: no
    kernel (``.entry``) with a body, not the one named ``entry``, or a function declared or
    called whose body the text lacks."""
    entries: set[bytes] = set()
    defined: set[bytes] = set()
    external: set[bytes] = set()
    declared: set[bytes] = set()
    extern = re.compile(_PTX_EXTERN)
    for header in re.finditer(_PTX_HEADER, code):
        kind, name, end = header.groups()
        if kind == b"entry":
            if end == b"{":
                entries.add(name)
        elif end == b"{":
            defined.add(name)
        elif extern.search(code, max(0, header.start() - 64), header.start()):
            external.add(name)
        else:
            declared.add(name)
    if not entries:
        return "no .entry with a body (no kernel): the text is cut short, or holds no kernel"
    if entry is not None and entry.encode("utf-8", "replace") not in entries:
        return (
            f"no .entry {entry} with a body: its metadata names that kernel, the text defines "
            f"{_names(entries)}"
        )
    called = set(re.findall(_PTX_CALL, code))
    missing = (declared | called) - defined - external
    if missing:
        return (
            f"function {_names(missing)} is declared or called but has no body "
            "(.func ... { ... }): the text is cut short"
        )
    return None


def _names(names: set[bytes]) -> str:
    """Some of ``names`` (PTX identifiers, ASCII), sorted, for a message."""
    shown = sorted(names)
    text = ", ".join(name.decode("ascii", "replace") for name in shown[:3])
    return text + (f" and {len(shown) - 3} more" if len(shown) > 3 else "")


#: the ELF machine (``e_machine``) of each extension that holds machine code
MACHINES: Mapping[str, int] = {"cubin": EM_CUDA, "hsaco": EM_AMDGPU}
#: the extensions that have a structural check
STRUCTURED = frozenset({*MACHINES, "ptx"})


def artifact_problem(
    ext: str, data: bytes, entry: str | None = None, *, full: bool = True
) -> str | None:
    """Why ``data`` is not a whole artifact of extension ``ext``; None when it is one, or when
    ``ext`` has no structural check. A cubin or HSACO must be ELF code of the extension's
    machine (:data:`MACHINES`); PTX must define the ``.entry`` named ``entry`` (when given).

    ``full=False`` leaves out the checks whose cost grows with the artifact's size (the PTX
    text scan): what a read of an entry runs; ``put`` and ``verify`` run them all."""
    machine = MACHINES.get(ext)
    if machine is not None:
        return elf_problem(data, machine)
    if ext == "ptx" and full:
        return ptx_problem(data, entry)
    return None
