"""Well-formed artifacts for tests and benchmarks that store machine code or PTX without
compiling: kernelcache stores and serves only whole artifacts of the formats it checks
(:mod:`kernelcache.formats`)."""

from __future__ import annotations

import itertools
import struct

from kernelcache.formats import EM_AMDGPU, EM_CUDA

#: the machine of each extension's ELF code
ELF_MACHINES = {"cubin": EM_CUDA, "hsaco": EM_AMDGPU}

#: a minimal whole PTX module
PTX = b""".version 8.7
.target sm_90a
.address_size 64

.visible .entry add_kernel(
\t.param .u64 add_kernel_param_0
)
{
\tret;
}
"""


def elf_image(payload: bytes = b"", machine: int = EM_CUDA, *, sections: int = 1) -> bytes:
    """A whole ELF64 little-endian file for ``machine`` whose ``sections`` program sections
    (``.text``, ``.text1``, ...) hold ``payload`` between them, each covered by a program
    header: the ELF header, the program header table, the sections' bytes, the section name
    string table, then the section header table (null, the program sections, ``.shstrtab``).
    With no program section, ``payload`` pads the string table: the smallest whole file."""
    cut = [len(payload) * i // sections for i in range(sections + 1)] if sections else [0, 0]
    parts = [payload[a:b] for a, b in itertools.pairwise(cut)][:sections]
    section_names = [b".text" + (str(i).encode() if i else b"") for i in range(sections)]
    names = b"\0" + b"".join(n + b"\0" for n in section_names) + b".shstrtab\0"
    if not sections:
        names, payload = names + payload, b""
    program_at = 64
    data_at = program_at + 56 * sections
    names_at = data_at + len(payload)
    table_at = names_at + len(names)
    header = struct.pack(
        "<4sBBBB8sHHIQQQIHHHHHH",
        b"\x7fELF",
        2,  # 64-bit
        1,  # little-endian
        1,  # version 1
        0,
        b"",
        2,  # ET_EXEC
        machine,
        1,
        0,
        program_at,
        table_at,
        0,
        64,
        56,
        sections,
        64,
        sections + 2,
        sections + 1,  # the name string table's index
    )
    segment = struct.Struct("<IIQQQQQQ")
    section = struct.Struct("<IIQQQQIIQQ")
    programs = b""
    table = section.pack(0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
    name_at, offset = 1, data_at
    for name, part in zip(section_names, parts, strict=True):
        programs += segment.pack(1, 5, offset, 0, 0, len(part), len(part), 1)  # PT_LOAD, r-x
        table += section.pack(name_at, 1, 6, 0, offset, len(part), 0, 0, 1, 0)  # PROGBITS
        name_at += len(name) + 1
        offset += len(part)
    table += section.pack(name_at, 3, 0, 0, names_at, len(names), 0, 0, 1, 0)  # STRTAB
    return header + programs + payload + names + table


def sized(ext: str, size: int, fill: bytes) -> bytes:
    """``size`` bytes to store under extension ``ext``: a whole cubin or hsaco (ELF for its
    vendor's machine) or PTX where ``size`` has room for one, its body ``fill`` repeated;
    otherwise (a smaller size, another extension) ``fill`` repeated, as it is."""
    if ext in ("cubin", "hsaco"):
        room = size - len(elf_image(sections=0))
        if room >= 0:
            body = (fill * (room // len(fill) + 1))[:room]
            return elf_image(body, ELF_MACHINES[ext], sections=0)
    if ext == "ptx" and size >= len(PTX) + 3:
        room = size - len(PTX) - 3
        return PTX + b"//" + (fill * (room // len(fill) + 1))[:room].replace(b"\n", b" ") + b"\n"
    return (fill * (size // len(fill) + 1))[:size]
