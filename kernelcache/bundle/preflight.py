"""The first pass of an import: the whole bundle read and checked without writing anything.

A bundle is rejected (:class:`~kernelcache.errors.BundleError`, naming the member or entry)
for an absolute path, a ``..`` component, a link, a device or any other non-regular member, an
unexpected name, a duplicate, a member over the size limit, a manifest larger than its entries
justify (:func:`manifest_limit`: room for each entry's document, more the more its member
holds), a damaged archive, a bad manifest, an entry whose metadata the schema refuses
(:mod:`kernelcache.schema`, entry digest and coverage included), a member the manifest does not
list (or the reverse), a size or digest mismatch, and, with a signing key, an entry without a
valid signature. A second read checks the contract of an entry
(:func:`~kernelcache.schema.entry_problem`, in full: a cubin that is not a whole NVIDIA ELF file,
PTX without the kernel its metadata names, ...) for each member whose extension has a
structure to check (:func:`check_artifacts`).

Memory is bounded by what the bundle holds: members are streamed, and the manifest is parsed
one value at a time (:mod:`kernelcache.bundle.manifest_reader`).
"""

from __future__ import annotations

import hashlib
import tarfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import IO, Any

import xxhash

from ..errors import BundleError
from ..formats import STRUCTURED
from ..keys import META_EXT, split_entry_name
from ..schema.document import entry_problem
from .archive import (
    CHUNK,
    MANIFEST,
    MANIFEST_BASE,
    MANIFEST_ENTRY_MAX,
    MANIFEST_PER_ENTRY,
    MAX_MANIFEST_BYTES,
    MEMBER_DIR,
    OTHER_MAGIC,
    ZSTD_MAGIC,
    Progress,
    zstandard_module,
)
from .manifest_reader import Listed, Manifest, parse_manifest


@dataclass(frozen=True)
class _Member:
    name: str
    key: str
    ext: str
    size: int
    digest: str
    data: bytes | None
    sha256: bytes | None = None  # of the data, when asked for (signed imports)
    manifest: Manifest | None = None  # the manifest member, parsed


def _member_kind(m: tarfile.TarInfo) -> str | None:
    """Why a member's type is refused, or None for a plain regular file."""
    if m.issym():
        return f"symbolic link (to {m.linkname!r})"
    if m.islnk():
        return f"hard link (to {m.linkname!r})"
    if m.ischr() or m.isblk():
        return "device file"
    if m.isfifo():
        return "FIFO"
    if m.isdir():
        return "directory"
    if m.issparse():
        return "sparse file"
    if not m.isreg():
        return f"unsupported member type {m.type!r}"
    return None


def _check_name(name: str) -> tuple[str, str]:
    """(key, ext) of an entry member, ("", "") for the manifest; raises for anything else."""
    if name.startswith("/") or (len(name) > 1 and name[1] == ":"):
        raise BundleError(f"member {name!r} has an absolute path")
    if ".." in name.replace("\\", "/").split("/"):
        raise BundleError(f"member {name!r} escapes the bundle with '..'")
    if name == MANIFEST:
        return "", ""
    directory, _, filename = name.partition("/")
    parts = split_entry_name(filename) if directory == MEMBER_DIR else None
    if parts is None or parts[1] == META_EXT:
        raise BundleError(
            f"unexpected member {name!r}: a bundle holds only {MANIFEST} and "
            f"{MEMBER_DIR}/<key>.<ext> files"
        )
    return parts


#: the largest extended header (pax, GNU long name or link) a member may have: an export writes
#: none longer than a key's path, and Python's tarfile reads one whole and parses a pax one in
#: time quadratic in its size (CVE-2024-6232, on Pythons before 3.11.10 and 3.12.6) before any
#: check here sees the member (a 33 KB zstd bundle held a 1 GiB long name)
MAX_HEADER_BYTES = 16 << 10
_EXTENDED = frozenset(
    {tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.SOLARIS_XHDTYPE, tarfile.GNUTYPE_LONGNAME,
     tarfile.GNUTYPE_LONGLINK}
)  # fmt: skip


class _Header(tarfile.TarInfo):
    """A member's header, refused before tarfile reads what it announces where that is an
    extended header over :data:`MAX_HEADER_BYTES` or an old GNU sparse map (a chain of blocks
    tarfile follows to its end; a sparse member is refused anyway)."""

    def _proc_member(self, archive: tarfile.TarFile) -> tarfile.TarInfo:
        if self.type in _EXTENDED and self.size > MAX_HEADER_BYTES:
            raise BundleError(
                f"a member's extended header is {self.size:,} bytes (a bundle's are at most "
                f"{MAX_HEADER_BYTES:,}): not a kernelcache bundle, or a hostile one"
            )
        if self.type == tarfile.GNUTYPE_SPARSE:
            raise BundleError(f"member {self.name!r} is a sparse file")
        return super()._proc_member(archive)  # type: ignore[misc]


def _open_tar(
    f: IO[bytes],
) -> tuple[tarfile.TarFile, Any, tuple[type[BaseException], ...]]:
    """The archive in ``f`` (plain or zstd), its stream, and the errors reading it may raise."""
    f.seek(0)
    head = f.read(8)
    f.seek(0)
    for magic, name in OTHER_MAGIC.items():
        if head.startswith(magic):
            raise BundleError(f"{name}-compressed bundles are not supported; use tar or tar+zstd")
    stream: Any = f
    errors: tuple[type[BaseException], ...] = (tarfile.TarError, EOFError, OSError)
    if head.startswith(ZSTD_MAGIC):
        zstd = zstandard_module()
        stream = zstd.ZstdDecompressor().stream_reader(f, closefd=False)
        errors += (zstd.ZstdError,)
    try:
        return tarfile.open(fileobj=stream, mode="r|", tarinfo=_Header), stream, errors
    except errors as e:
        if stream is not f and not _zstd_whole(f):
            raise BundleError(TRUNCATED) from None
        raise BundleError(f"not a tar archive ({e})") from None


#: what a bundle whose file ends before its data does is told
TRUNCATED = "the bundle is truncated (its file ends before its data does): copy it again"


def _zstd_whole(f: IO[bytes]) -> bool:
    """Whether the zstd data in ``f`` ends where its frame does (False: cut short). Read in
    chunks: only after the archive in it could not be read."""
    zstd = zstandard_module()
    whole = zstd.ZstdDecompressor().decompressobj()
    f.seek(0)
    try:
        while chunk := f.read(1 << 20):
            whole.decompress(chunk)  # (thrown away: only where the frame ends matters)
            if whole.eof:
                return True
    except zstd.ZstdError:
        return True  # damaged, not cut short: the caller's message says so
    return bool(whole.eof)


def manifest_limit(sizes: Iterable[int]) -> int:
    """The largest manifest a bundle may have after entry members of ``sizes`` bytes: room for
    each entry's document, more the more its member holds (a document is at most
    :data:`MANIFEST_ENTRY_MAX`), so that what a manifest costs is bounded by what the bundle
    holds, never bought by empty members."""
    room = sum(min(MANIFEST_ENTRY_MAX, MANIFEST_PER_ENTRY + size) for size in sizes)
    return min(MAX_MANIFEST_BYTES, MANIFEST_BASE + room)


def tar_members(
    f: IO[bytes],
    max_member: int,
    *,
    keep_data: bool,
    sha256: bool = False,
    progress: Progress | None = None,
    read_manifest: bool = False,
) -> Iterator[_Member]:
    """Each member of the bundle, checked (name, type, size: at most ``max_member`` bytes, 0
    meaning no limit) and hashed, in archive order. The manifest's size is checked against :func:`manifest_limit` from its header, before
    any of it is read; with ``read_manifest`` it is parsed (:func:`.parse_manifest`), else
    skipped."""
    seen: set[str] = set()
    sizes: list[int] = []
    tar, stream, errors = _open_tar(f)
    try:
        for m in tar:
            name = m.name
            why = _member_kind(m)
            if why is not None:
                raise BundleError(f"member {name!r} is a {why}; only regular files are allowed")
            key, ext = _check_name(name)
            if name in seen:
                raise BundleError(f"member {name!r} appears twice")
            seen.add(name)
            source = tar.extractfile(m)
            assert source is not None
            if name == MANIFEST:
                limit = manifest_limit(sizes)
                if m.size > limit:
                    raise BundleError(
                        f"member {name!r} is oversized: {m.size} bytes, the limit for a "
                        f"manifest after {len(sizes)} entries of {sum(sizes)} bytes is {limit}"
                    )
                if read_manifest:
                    parsed = parse_manifest(source, m.size)
                    yield _Member(name, key, ext, m.size, "", None, manifest=parsed)
                continue
            if max_member and m.size > max_member:  # (0: no limit)
                raise BundleError(
                    f"member {name!r} is oversized: {m.size} bytes, the limit is {max_member} "
                    "(raise it with --max-member-size)"
                )
            sizes.append(m.size)
            hasher = xxhash.xxh3_128()
            strong = hashlib.sha256() if sha256 else None
            chunks = []
            got = 0
            while True:
                chunk = source.read(CHUNK)
                if not chunk:
                    break
                got += len(chunk)
                hasher.update(chunk)
                if strong is not None:
                    strong.update(chunk)
                if keep_data:
                    chunks.append(chunk)
            if got != m.size:
                raise BundleError(f"member {name!r} is truncated")
            if progress is not None:
                progress(1)
            yield _Member(
                name,
                key,
                ext,
                got,
                "xxh3_128:" + hasher.hexdigest(),
                b"".join(chunks) if keep_data else None,
                None if strong is None else strong.digest(),
            )
    except EOFError:
        raise BundleError(TRUNCATED) from None
    except errors as e:
        if stream is not f and not _zstd_whole(f):
            raise BundleError(TRUNCATED) from None
        raise BundleError(f"the bundle is damaged: {e}") from None
    finally:
        tar.close()
        if stream is not f:
            stream.close()


def check_artifacts(f: IO[bytes], listed: dict[str, Listed], max_member: int) -> None:
    """Check the contract of an entry (:func:`~kernelcache.schema.entry_problem`, in full) for
    every entry of the bundle ``f`` whose extension has a structure to check, reading its
    members again, one in memory at a time (a bundle of none is not read again). What this
    accepts, the publishing pass publishes: ``dry_run`` runs it too.

    Raises:
        BundleError: naming the entry and what is wrong, or the member that changed since the
            first pass.
    """
    names = {name for name, entry in listed.items() if entry.ext in STRUCTURED}
    if not names:
        return
    for member in tar_members(f, max_member, keep_data=True):
        entry = listed.get(member.name)
        if entry is None or member.name not in names:
            continue
        if member.digest != entry.digest or member.data is None:
            raise BundleError(f"the bundle changed while being imported (member {member.name!r})")
        reason = entry_problem(entry.ext, member.data, entry.document())
        if reason is not None:
            raise BundleError(
                f"entry {entry.key} is refused: {reason} (the bundle was made from a damaged "
                "cache, or altered: export it again from a cache `kernelcache verify` finds "
                "clean; nothing was imported)"
            )
