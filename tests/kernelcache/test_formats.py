"""Only whole artifacts: the structural checks of machine code (ELF) and PTX text, ``kernelcache
verify`` finding entries an older version stored cut short, a compile whose output a full
``TMPDIR`` cut short (a real tiny filesystem, and a ptxas that truncates its output and exits
0), and a lowering that meets a cut-short entry in the cache."""

from __future__ import annotations

import json
import shutil
import stat
import struct
import textwrap
from pathlib import Path

import pytest
from artifact_images import PTX, elf_image, launch, plant
from bridge_helpers import forget_lowerings, run_child
from cli_support import kc_json
from hypothesis import given, settings
from hypothesis import strategies as st
from support import CAN_UNSHARE, HELPERS, key_of, run_in_namespace

import kernelcache
from kernelcache.formats import EM_AMDGPU, EM_CUDA, artifact_problem, elf_problem, ptx_problem
from kernelcache.schema import COVERS_FIELD, RESERVED_FIELDS
from kernelcache.store import Problem, Store

#: a whole cubin-like image: four program sections, each covered by a program header
IMAGE = elf_image(bytes(range(256)) * 20, sections=4)
_EHDR = struct.Struct("<16sHHIQQQIHHHHHH")
_SHDR = struct.Struct("<IIQQQQIIQQ")


def patched(data: bytes, offset: int, fmt: str, *values: int) -> bytes:
    """``data`` with ``values`` packed (little-endian ``fmt``) at ``offset``."""
    out = bytearray(data)
    struct.pack_into("<" + fmt, out, offset, *values)
    return bytes(out)


def section_header(data: bytes, index: int) -> int:
    """The offset of section ``index``'s header in ``data``."""
    return _EHDR.unpack_from(data)[6] + index * _SHDR.size


# -- ELF: cubin, hsaco ------------------------------------------------------------------------
def test_a_whole_elf_file_is_whole_for_its_machine():
    assert elf_problem(IMAGE) is None and elf_problem(IMAGE, EM_CUDA) is None
    assert elf_problem(elf_image(machine=EM_AMDGPU), EM_AMDGPU) is None


def test_code_for_another_machine_is_refused_where_the_machine_is_named():
    reason = elf_problem(IMAGE, EM_AMDGPU)
    assert reason == "ELF code for machine 190 (NVIDIA CUDA), not 224 (AMD GPU)"
    assert elf_problem(elf_image(machine=62), EM_CUDA) == (
        "ELF code for machine 62 (x86-64), not 190 (NVIDIA CUDA)"
    )


def test_an_empty_or_header_only_file_is_refused():
    assert elf_problem(b"") == "the file is empty (0 bytes)"
    assert "past the end of the file (64 bytes)" in elf_problem(IMAGE[:64])
    no_table = patched(IMAGE[:64], 0x28, "Q", 0)  # e_shoff: no section header table
    assert elf_problem(no_table) == "no section header table (a header-only file)"


@pytest.mark.parametrize("size", [1, 3, 4, 5, 63])
def test_a_cut_short_header_is_refused(size):
    assert elf_problem(IMAGE[:size]) == f"the ELF header is cut short ({size} of 64 bytes)"


def test_every_prefix_of_a_whole_file_is_refused():
    refused = [size for size in range(len(IMAGE)) if elf_problem(IMAGE[:size]) is not None]
    assert refused == list(range(len(IMAGE)))
    # and so is what a full disk left of the same image, with the rest zero-filled
    assert elf_problem(IMAGE[:4096] + bytes(len(IMAGE) - 4096 - 1)) is not None


def test_other_files_are_refused():
    assert elf_problem(b"machine code") == "not an ELF file (no ELF magic)"
    wrong_class = patched(IMAGE, 4, "B", 1)  # 32-bit
    big_endian = patched(IMAGE, 5, "B", 2)
    for data in (wrong_class, big_endian):
        assert elf_problem(data) == "not a 64-bit little-endian ELF file of version 1"


def test_a_section_past_the_end_is_refused_unless_it_takes_no_file_space():
    at = section_header(IMAGE, 2)
    past = patched(IMAGE, at + 32, "Q", len(IMAGE))  # sh_size of section 2
    assert elf_problem(past).startswith("section 2 ends at byte ")
    assert elf_problem(patched(past, at + 4, "I", 8)) is None  # SHT_NOBITS (.bss): no bytes


def test_a_segment_past_the_end_is_refused():
    past = patched(IMAGE, 64 + 32, "Q", len(IMAGE))  # p_filesz of program header 0
    assert elf_problem(past).startswith("program header 0's segment ends at byte ")


def test_the_section_name_string_table_must_be_there():
    assert elf_problem(patched(IMAGE, 0x3E, "H", 0)) == (
        "no section name string table (index 0 of 6 sections)"
    )
    strtab = section_header(IMAGE, 5)
    assert elf_problem(patched(IMAGE, strtab + 4, "I", 1)) == (
        "section 5, the section name string table, is not a string table"
    )


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, len(IMAGE) - 1), st.integers(0, 255)), max_size=8),
    st.integers(0, len(IMAGE)),
)
def test_damaged_images_never_raise(flips, size):
    data = bytearray(IMAGE)
    for at, value in flips:
        data[at] = value
    reason = elf_problem(bytes(data[:size]), EM_CUDA)
    assert reason is None or isinstance(reason, str)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=600))
def test_odd_bytes_never_raise(data):
    for ext in ("cubin", "hsaco", "ptx"):
        reason = artifact_problem(ext, data)
        assert reason is None or isinstance(reason, str)


# -- PTX ------------------------------------------------------------------------------------
def test_whole_ptx_is_whole():
    assert ptx_problem(PTX) is None
    assert ptx_problem(PTX.rstrip()) is None  # the final newline is not needed


def test_every_prefix_of_whole_ptx_is_refused():
    text = PTX.rstrip()
    assert all(ptx_problem(text[:size]) is not None for size in range(len(text)))


def test_what_is_not_whole_ptx_says_why():
    assert ptx_problem(b"") == "the file is empty (0 bytes)"
    assert ptx_problem(PTX[:40] + b"\0" + PTX[41:]) == (
        "NUL bytes in PTX text (a damaged or short write)"
    )
    assert ptx_problem(PTX + b'\t.file\t1 "kernels') == (
        "a string is not terminated: the text is cut short"
    )
    assert ptx_problem(PTX + b"/* the end") == (
        "a comment is not terminated: the text is cut short"
    )
    assert ptx_problem(PTX.replace(b".version 8.7", b"")) == "no .version directive"
    assert ptx_problem(PTX.replace(b".target sm_90a", b"")) == "no .target directive"
    assert ptx_problem(PTX.replace(b".entry", b".global")) == "no .entry or .func"
    assert ptx_problem(PTX.rstrip()[:-1]) == "1 '{' but 0 '}': the text is cut short"
    assert ptx_problem(PTX + b".extern .shared .align 16 .b8 smem") == (
        "the text ends inside a statement: it is cut short"
    )


def test_braces_in_strings_and_comments_do_not_count():
    noisy = PTX.replace(b"\tret;", b'\tret; // } }\n\t.pragma "nounroll{";') + (
        b'\t.file\t1 "dir/{weird}/kernels.py"\n/* { */\n.extern .shared .b8 smem[];\n'
    )
    assert ptx_problem(noisy) is None
    cut = noisy.split(b"}\n", 1)[0].rsplit(b"\n", 1)[0] + b"\n// }\n"  # cut before the last }
    assert ptx_problem(cut) == "1 '{' but 0 '}': the text is cut short"


def test_each_extension_has_its_check():
    for ext in ("cubin", "hsaco", "ptx"):
        assert artifact_problem(ext, b"") == "the file is empty (0 bytes)"
    assert (
        artifact_problem("cubin", IMAGE) is None
        and artifact_problem("hsaco", elf_image(machine=EM_AMDGPU)) is None
    )
    assert artifact_problem("ptx", PTX) is None
    assert artifact_problem("ptx", IMAGE) is not None and artifact_problem("cubin", PTX) is not None
    assert artifact_problem("bin", b"") is None and artifact_problem("json", b"x") is None


# -- verify: entries an older version stored cut short ----------------------------------------
def _store_as_before(root: Path, key: str, ext: str, data: bytes, **meta: object) -> None:
    """Store ``data`` the way a version without these checks did: a valid entry (metadata,
    size and digest all agree) whose artifact is what the compiler left (``put`` refuses it
    now: the files are written directly)."""
    plant(root, key, ext, data, launch(ext, **{"name": "k", "target": "cuda:90", **meta}))


def test_verify_reports_entries_stored_cut_short_and_repair_quarantines_them(tmp_path):
    root = tmp_path / "cache"
    keys = {name: key_of("verify", name) for name in ("good", "empty", "short", "ptx", "hsaco")}
    _store_as_before(root, keys["good"], "cubin", IMAGE)
    _store_as_before(root, keys["empty"], "cubin", b"")
    _store_as_before(root, keys["short"], "cubin", IMAGE[:4096])
    _store_as_before(root, keys["ptx"], "ptx", PTX[:100])
    _store_as_before(root, keys["hsaco"], "hsaco", elf_image(machine=EM_AMDGPU)[:64])
    # such an entry was served to every process until now; a read refuses machine code that is
    # not whole (its ELF header tables), and leaves the PTX text scan to verify
    short = Store(root).inspect(keys["short"])
    assert isinstance(short, Problem) and short.corrupt
    assert Store(root).inspect(keys["ptx"]).data == PTX[:100]

    doc = kc_json(root, "verify", code=1)
    assert doc["entries_checked"] == 5 and doc["entries_ok"] == 1
    found = {p["key"]: (p["kind"], p["detail"]) for p in doc["problems"]}
    assert set(found) == set(keys.values()) - {keys["good"]}
    assert found[keys["empty"]] == (
        "corrupt",
        "not a whole .cubin artifact: the file is empty (0 bytes)",
    )
    assert found[keys["short"]] == (
        "corrupt",
        "not a whole .cubin artifact: the section header table ends at byte "
        f"{section_header(IMAGE, 1)}, past the end of the file (4096 bytes): the file is cut short",
    )
    assert found[keys["ptx"]][1].startswith("not a whole .ptx artifact: ")
    assert found[keys["hsaco"]][1].startswith("not a whole .hsaco artifact: ")

    repaired = kc_json(root, "verify", "--repair")
    assert repaired["repair"]["counts"] == {"done": 4} and repaired["clean"] is True
    quarantined = {p.name.split(".")[0] for p in (root / ".quarantine").iterdir()}
    assert quarantined == set(keys.values()) - {keys["good"]}
    again = kc_json(root, "verify")
    assert again["clean"] is True and again["entries_ok"] == 1
    assert Store(root).get(keys["good"], "cubin").data == IMAGE
    assert Store(root).get(keys["short"], "cubin") is None


# -- Cache.quarantine: a reader that checks more than a read does -------------------------------
def test_a_reader_reports_an_unusable_entry_and_it_is_quarantined(tmp_path):
    root = tmp_path / "cache"
    cache = kernelcache.Cache(root, readonly_roots=(), remote="")
    key = key_of("unusable")
    art = cache.put(key, "cubin", elf_image(b"old"), launch())
    corrupt = kernelcache.process_stats()["corrupt"]
    assert cache.quarantine(art, "its kernel is not in its symbol table")
    assert kernelcache.process_stats()["corrupt"] == corrupt + 1
    assert cache.get(key, "cubin") is None
    (note,) = (root / ".quarantine").glob("*.reason")
    assert json.loads(note.read_bytes())["reason"] == "its kernel is not in its symbol table"

    # an entry written again since it was read is left alone
    stale = art
    fresh = cache.put(key, "cubin", IMAGE, launch())
    assert not cache.quarantine(stale, "stale") and cache.get(key, "cubin").data == IMAGE
    # a read-only root is never modified
    reader = kernelcache.Cache(tmp_path / "mine", readonly_roots=[root], remote="")
    assert not reader.quarantine(reader.get(key, "cubin"), "read-only")
    assert cache.get(key, "cubin").data == fresh.data


# -- the bridge: a compile whose output is cut short -------------------------------------------
LOWER = """
import json, os, sys, tempfile
import jax, jax.numpy as jnp
import kernelcache
from examples import ops

ROOT = {root!r}
cache = kernelcache.Cache(ROOT, readonly_roots=(), remote="")
F32 = jax.ShapeDtypeStruct((4096,), jnp.float32)


def lower():
    fn = lambda x, y: ops.add(x, y, cache=cache, target="cuda:90", embed="inline")
    try:
        jax.jit(fn).trace(F32, F32).lower(lowering_platforms=("cuda",))
        return "lowered"
    except Exception as e:  # what the test expects is one error: say which it was
        return f"{{type(e).__name__}}: {{e}}"


def entries():
    return sorted(n for n in os.listdir(ROOT) if n.endswith((".cubin", ".ptx", ".failure")))
"""


def _kernel_entries(root: Path) -> dict[str, bytes]:
    return {p.suffix: p.read_bytes() for p in root.iterdir() if p.suffix in (".cubin", ".ptx")}


def _stored_whole(root: Path) -> None:
    """``root`` holds the kernel, whole, and no remembered failure; verify finds it clean."""
    found = _kernel_entries(root)
    assert set(found) == {".cubin", ".ptx"}
    assert elf_problem(found[".cubin"], EM_CUDA) is None and ptx_problem(found[".ptx"]) is None
    assert not list(root.glob("*.failure"))
    assert kc_json(root, "verify")["clean"] is True


@pytest.mark.skipif(not CAN_UNSHARE, reason="needs a private mount namespace to mount tmpfs")
def test_a_full_tmpdir_fails_the_compile_and_the_next_one_with_room_stores_it(tmp_path):
    """TMPDIR on tmpfs of 4, 8 and 12 KiB: Triton cannot write the PTX (4 KiB), or ptxas exits 0
    after writing none (8 KiB) or 4 KiB (12 KiB) of the cubin; each compile fails naming
    TMPDIR, nothing is stored or remembered, and a later process with room stores it."""
    root = tmp_path / "cache"
    root.mkdir()
    sizes = ("4k", "8k", "12k")
    setup = "mount -t tmpfs -o size=1m tmpfs /mnt\n" + "".join(
        f"mkdir /mnt/{s} && mount -t tmpfs -o size={s} tmpfs /mnt/{s}\n" for s in sizes
    )
    code = LOWER.format(root=str(root)) + textwrap.dedent(f"""
        out = {{}}
        for size in {sizes!r}:
            tempfile.tempdir = "/mnt/" + size
            out[size] = [lower(), entries()]
        print(json.dumps(out))
    """)
    out = json.loads(run_in_namespace(setup, code, timeout=600).stdout.splitlines()[-1])
    for size in sizes:
        message, stored = out[size]
        assert message.startswith("IncompleteOutput: compiling add_kernel for cuda:90: "), message
        assert f"TMPDIR, /mnt/{size} (" in message and " free)" in message, message
        assert "nothing was stored" in message and stored == [], (size, stored)
    assert "a disk filled up while compiling" in out["4k"][0]
    assert "its .cubin" in out["8k"][0] + out["12k"][0]  # ptxas cut it short and exited 0

    later = run_child(LOWER.format(root=str(root)) + "print(json.dumps(lower()))")
    assert later == "lowered"
    _stored_whole(root)


PTXAS = """#!/bin/sh
# ptxas, then the output file cut to $PTXAS_KEEP_BYTES bytes (if set), exiting 0 as ptxas does
# after a short write on a full disk
{real} "$@" || exit $?
out=""
prev=""
for arg in "$@"; do
    if [ "$prev" = "-o" ]; then out="$arg"; fi
    prev="$arg"
done
if [ -n "$out" ] && [ -n "$PTXAS_KEEP_BYTES" ]; then truncate -s "$PTXAS_KEEP_BYTES" "$out"; fi
exit 0
"""


def test_a_cubin_cut_short_by_ptxas_is_a_compile_failure_never_remembered(tmp_path):
    """ptxas exits 0 after writing 0 or 4096 bytes of the cubin: each compile fails with a
    message naming TMPDIR and its free space, stores nothing and remembers nothing; the next
    compile, whole, is stored."""
    from triton import knobs

    wrapper = tmp_path / "ptxas"
    wrapper.write_text(PTXAS.format(real=knobs.nvidia.ptxas.path))
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    root = tmp_path / "cache"
    root.mkdir()
    code = LOWER.format(root=str(root)) + textwrap.dedent("""
        from bridge.entries import failures
        out = {}
        for keep in ("0", "4096"):
            os.environ["PTXAS_KEEP_BYTES"] = keep
            out[keep] = [lower(), entries()]
        del os.environ["PTXAS_KEEP_BYTES"]
        out["whole"] = [lower(), entries()]
        (cubin,) = [n for n in entries() if n.endswith(".cubin")]
        out["remembered"] = failures.remembered(cache, cubin.split(".")[0])
        out["tmp"] = tempfile.gettempdir()
        print(json.dumps(out))
    """)
    out = run_child(code, TRITON_PTXAS_PATH=str(wrapper))
    message, stored = out["0"]
    assert message.startswith(
        "IncompleteOutput: compiling add_kernel for cuda:90: its .cubin (0 bytes) is not whole: "
        "the file is empty "
        f"(0 bytes). Triton's compilers write their files under TMPDIR, {out['tmp']} ("
    )
    assert stored == []
    message, stored = out["4096"]
    assert message.startswith(
        "IncompleteOutput: compiling add_kernel for cuda:90: its .cubin (4,096 bytes) is not "
        "whole: the section header table"
    ) and message.endswith(
        "a full disk there cuts their output short: free space there, or set TMPDIR to a "
        "directory with room, and run again (nothing was stored; the kernel is compiled again "
        "next time)"
    )
    assert stored == []
    assert out["whole"][0] == "lowered" and out["remembered"] is None
    _stored_whole(root)


# -- the bridge: a lowering that meets a cut-short entry in the cache ---------------------------
def test_a_lowering_never_embeds_a_cut_short_entry(tmp_path):
    """An entry an older version stored cut short (valid digest): the lowering reports it
    corrupt (quarantined, counted), compiles the kernel again, stores it whole and embeds
    that; verify finds the root clean."""
    first = tmp_path / "first"
    first.mkdir()
    assert run_child(LOWER.format(root=str(first)) + "print(json.dumps(lower()))") == "lowered"
    root = tmp_path / "cache"
    shutil.copytree(first, root)
    forget_lowerings(root)  # the next lowering works from the kernel entries
    (cubin,) = root.glob("*.cubin")
    key = cubin.stem
    whole = cubin.read_bytes()
    meta = json.loads((root / f"{key}.json").read_bytes())
    Store(root).delete(key)
    fields = {k: v for k, v in meta.items() if k not in RESERVED_FIELDS and k != COVERS_FIELD}
    _store_as_before(root, key, "cubin", whole[:4096], **fields)

    code = LOWER.format(root=str(root)) + textwrap.dedent(f"""
        sys.path.insert(0, {str(HELPERS)!r})
        from bridge_helpers import decoded, kernels_of
        (call,) = decoded(lambda x, y: ops.add(x, y, cache=cache, target="cuda:90",
                                                embed="inline"), F32, F32)
        (kernel,) = kernels_of(call)
        print(json.dumps({{"embedded": kernel.module_image.object_file.hex(),
                           "corrupt": kernelcache.process_stats()["corrupt"]}}))
    """)
    out = run_child(code)
    assert bytes.fromhex(out["embedded"]) == whole and out["corrupt"] == 1
    assert (root / f"{key}.cubin").read_bytes() == whole
    assert any(p.name.startswith(f"{key}.cubin.") for p in (root / ".quarantine").iterdir())
    _stored_whole(root)


def test_the_bridge_checks_each_vendors_machine():
    from bridge.compile.compiler import binary_problem

    assert binary_problem("cubin", IMAGE) is None
    assert binary_problem("hsaco", elf_image(machine=EM_AMDGPU)) is None
    assert binary_problem("hsaco", IMAGE) == (
        f"its .hsaco ({len(IMAGE):,} bytes) is not whole: ELF code for machine 190 (NVIDIA "
        "CUDA), not 224 (AMD GPU)"
    )
    assert (
        binary_problem("cubin", b"")
        == "its .cubin (0 bytes) is not whole: the file is empty (0 bytes)"
    )


# -- what each extension must be: the machine, the kernel, every function's body ---------------
def test_each_extension_names_its_machine():
    hsaco, x86 = elf_image(machine=EM_AMDGPU), elf_image(machine=62)
    assert (
        artifact_problem("cubin", hsaco)
        == "ELF code for machine 224 (AMD GPU), not 190 (NVIDIA CUDA)"
    )
    assert (
        artifact_problem("cubin", x86) == "ELF code for machine 62 (x86-64), not 190 (NVIDIA CUDA)"
    )
    assert (
        artifact_problem("hsaco", IMAGE)
        == "ELF code for machine 190 (NVIDIA CUDA), not 224 (AMD GPU)"
    )
    assert artifact_problem("hsaco", x86) == "ELF code for machine 62 (x86-64), not 224 (AMD GPU)"
    assert artifact_problem("cubin", IMAGE) is None and artifact_problem("hsaco", hsaco) is None


HEADER = b".version 8.7\n.target sm_90a\n.address_size 64\n"
CALLEE = b".func (.param .b32 func_retval0) helper(\n\t.param .b32 helper_param_0\n)\n"
KERNEL = (
    b".visible .entry k(\n\t.param .u64 k_param_0\n)\n.maxntid 128, 1, 1\n{\n"
    b"\t.param .b32 param0;\n\t.param .b32 retval0;\n"
    b"\tcall.uni (retval0), helper, (param0);\n\tret;\n}\n"
)
BODY = b"{\n\tst.param.b32 [func_retval0], 0;\n\tret;\n}\n"


def test_ptx_needs_a_kernel_and_the_body_of_every_function_it_calls():
    whole = HEADER + CALLEE + b";\n" + KERNEL + CALLEE + BODY  # declared, called, defined
    assert ptx_problem(whole) is None and ptx_problem(whole, "k") is None
    assert ptx_problem(HEADER + CALLEE + BODY + KERNEL) is None  # defined before the call
    # cut after the declaration: a .func but no kernel
    assert ptx_problem(HEADER + CALLEE + b";\n") == (
        "no .entry with a body (no kernel): the text is cut short, or holds no kernel"
    )
    # cut after the kernel: the function it calls has no body
    missing = "function helper is declared or called but has no body (.func ... { ... }): "
    assert ptx_problem(HEADER + CALLEE + b";\n" + KERNEL) == missing + "the text is cut short"
    assert ptx_problem(HEADER + KERNEL) == missing + "the text is cut short"  # never declared
    # an external function (vprintf, __assertfail) has its body elsewhere
    extern = HEADER + b".extern " + CALLEE + b";\n" + KERNEL
    assert ptx_problem(extern) is None
    # the kernel an entry's metadata names
    assert ptx_problem(whole, "other") == (
        "no .entry other with a body: its metadata names that kernel, the text defines k"
    )
    assert artifact_problem("ptx", whole, "other") is not None
    assert artifact_problem("ptx", whole, "other", full=False) is None  # what a read checks
    # an indirect call (through a register) names no function
    indirect = KERNEL.replace(b"helper, (param0)", b"%rd1, (param0), prototype_0")
    assert ptx_problem(HEADER + indirect) is None
