"""Well-formed artifacts for tests and benchmarks that store machine code or PTX without
compiling: kernelcache stores and serves only whole entries (:mod:`kernelcache.schema.document`:
an artifact whole for its extension, :mod:`kernelcache.formats`, with the launch metadata its
extension requires); and :func:`plant`, which writes an entry as a hostile or older writer
would, bypassing those checks."""

from __future__ import annotations

import itertools
import json
import os
import struct
from collections.abc import Mapping
from typing import Any

from kernelcache.formats import EM_AMDGPU, EM_CUDA
from kernelcache.schema import REQUIRED, make_metadata

#: the machine of each extension's ELF code
ELF_MACHINES = {"cubin": EM_CUDA, "hsaco": EM_AMDGPU}

#: the launch metadata of a machine-code entry (every field kernelcache requires of one)
LAUNCH: dict[str, Any] = {
    "name": "add_kernel",
    "target": "cuda:90",
    "num_warps": 4,
    "num_ctas": 1,
    "shared": 0,
}


def launch(ext: str = "cubin", **fields: Any) -> dict[str, Any]:
    """Metadata for an entry of extension ``ext``: the launch fields it requires (from
    :data:`LAUNCH`; none for an extension that requires none), then ``fields``."""
    return {**{k: v for k, v in LAUNCH.items() if k in REQUIRED.get(ext, ())}, **fields}


def ptx_text(name: str = "add_kernel") -> bytes:
    """A minimal whole PTX module defining the kernel ``name``."""
    return f""".version 8.7
.target sm_90a
.address_size 64

.visible .entry {name}(
\t.param .u64 {name}_param_0
)
{{
\tret;
}}
""".encode()


#: a minimal whole PTX module (of the kernel ``add_kernel``)
PTX = ptx_text()


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


def sized(ext: str, size: int, fill: bytes, name: str = "add_kernel") -> bytes:
    """``size`` bytes to store under extension ``ext``: a whole cubin or hsaco (ELF for its
    vendor's machine) or PTX (of the kernel ``name``) where ``size`` has room for one, its body
    ``fill`` repeated; otherwise (a smaller size, another extension) ``fill`` repeated, as it
    is."""
    if ext in ("cubin", "hsaco"):
        room = size - len(elf_image(sections=0))
        if room >= 0:
            body = (fill * (room // len(fill) + 1))[:room]
            return elf_image(body, ELF_MACHINES[ext], sections=0)
    text = ptx_text(name)
    if ext == "ptx" and size >= len(text) + 3:
        room = size - len(text) - 3
        return text + b"//" + (fill * (room // len(fill) + 1))[:room].replace(b"\n", b" ") + b"\n"
    return (fill * (size // len(fill) + 1))[:size]


def whole(ext: str, payload: bytes = b"", name: str = "add_kernel") -> bytes:
    """A whole artifact of extension ``ext`` holding ``payload``: an ELF image of the
    extension's machine, PTX of the kernel ``name`` with ``payload`` in a comment, or
    ``payload`` itself for an extension without a structure."""
    if ext in ELF_MACHINES:
        return elf_image(payload, ELF_MACHINES[ext])
    if ext == "ptx":
        return ptx_text(name) + b"// " + payload.hex().encode() + b"\n"
    return payload


def plant(
    root: str | os.PathLike[str], key: str, ext: str, data: bytes, meta: Mapping[str, Any]
) -> dict[str, Any]:
    """Write the entry ``key`` straight to ``root``, as a writer that checks nothing (an older
    version, a hostile one) would: its document made by the schema (valid digests, entry
    digest over what it covers), its artifact ``data`` as given, whole or not; returns the
    document."""
    doc = make_metadata(key, ext, data, meta)
    os.makedirs(root, exist_ok=True)
    with open(os.path.join(root, f"{key}.{ext}"), "wb") as f:
        f.write(data)
    with open(os.path.join(root, f"{key}.json"), "w") as f:
        json.dump(doc, f)
    return doc
