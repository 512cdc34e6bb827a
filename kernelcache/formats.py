"""Whether an artifact is whole: a structural check per extension.

A compiler that runs out of room (a full ``TMPDIR``) can exit 0 after a short write; what it
leaves is an empty file or a prefix of the artifact. These checks tell such leftovers from a
complete artifact by structure alone, without knowing who produced it:

* ``cubin`` and ``hsaco`` are ELF64 little-endian files: the header is whole, there is a
  section header table, it and every section that occupies file space (all but
  ``SHT_NOBITS``) lie within the file, the section name string table is there, and every
  program header's file image lies within the file. An empty or header-only file is refused. Which machine the code
  is for (``e_machine``) is the compiler's business: :func:`elf_problem` checks it where the
  caller names one.
* ``ptx`` is PTX text: ``.version`` and ``.target`` directives, at least one ``.entry`` or
  ``.func``, balanced braces, no unterminated string or comment, no NUL byte, and the text ends
  with a complete statement (``}`` or ``;``), not in the middle of one.

Other extensions have no structural check. Invariants: a check never raises, whatever the bytes
(it returns why they are not a whole artifact, or None); an ELF check costs time in proportion
to the file's header tables, not to its size.

Who checks: ``kernelcache verify`` checks every entry (and ``--repair`` quarantines what fails);
the bridge checks what a compile produced before it is stored, and each kernel binary it reads
before embedding it, against the target's machine. A plain read (``Cache.get``) checks the
digest only: the structure is the writer's to guarantee.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable, Mapping

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


#: what is not code in PTX: strings, line comments, block comments
_PTX_NOISE = re.compile(rb'"(?:[^"\\\n]|\\.)*"|//[^\n]*|/\*.*?\*/', re.DOTALL)
_PTX_VERSION = re.compile(rb"(?m)^\s*\.version\s+\d+\.\d+")
_PTX_TARGET = re.compile(rb"(?m)^\s*\.target\s+\w")
_PTX_FUNCTION = re.compile(rb"\.(?:entry|func)\s")


def ptx_problem(data: bytes) -> str | None:
    """Why ``data`` is not whole PTX text; None when it is."""
    if not data:
        return "the file is empty (0 bytes)"
    if b"\0" in data:
        return "NUL bytes in PTX text (a damaged or short write)"
    code = _PTX_NOISE.sub(b" ", data)
    if b'"' in code:
        return "a string is not terminated: the text is cut short"
    if b"/*" in code:
        return "a comment is not terminated: the text is cut short"
    if _PTX_VERSION.search(code) is None:
        return "no .version directive"
    if _PTX_TARGET.search(code) is None:
        return "no .target directive"
    if _PTX_FUNCTION.search(code) is None:
        return "no .entry or .func"
    opened, closed = code.count(b"{"), code.count(b"}")
    if opened != closed:
        return f"{opened} '{{' but {closed} '}}': the text is cut short"
    if code.rstrip()[-1:] not in (b"}", b";"):
        return "the text ends inside a statement: it is cut short"
    return None


#: the structural check of each extension that has one
CHECKS: Mapping[str, Callable[[bytes], str | None]] = {
    "cubin": elf_problem,
    "hsaco": elf_problem,
    "ptx": ptx_problem,
}


def problem(ext: str, data: bytes) -> str | None:
    """Why ``data`` is not a whole artifact of extension ``ext``; None when it is one, or when
    ``ext`` has no structural check."""
    check = CHECKS.get(ext)
    return None if check is None else check(data)
