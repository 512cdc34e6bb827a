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
one value at a time (:class:`_JsonStream`), each from a bounded window, keeping only each valid
entry's own text; a hostile manifest of countless tiny values costs no more than its size.
"""

from __future__ import annotations

import codecs
import hashlib
import json
import re
import tarfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import IO, Any, NamedTuple

import xxhash

from .._version import __version__
from ..errors import BundleError
from ..formats import STRUCTURED
from ..jsonio import load_json
from ..keys import META_EXT, split_entry_name
from ..problem import Problem
from ..schema.contract import entry_problem
from ..schema.document import check_written
from ..schema.format import FORMAT_VERSION
from .archive import (
    BUNDLE_FORMAT,
    BUNDLE_VERSION,
    CHUNK,
    MANIFEST,
    MANIFEST_BASE,
    MANIFEST_ENTRY_MAX,
    MANIFEST_PER_ENTRY,
    MAX_MANIFEST_BYTES,
    MEMBER_DIR,
    NAME_MAX,
    OTHER_MAGIC,
    VALUE_MAX,
    ZSTD_MAGIC,
    Progress,
    zstandard_module,
)


@dataclass(frozen=True)
class _Member:
    name: str
    key: str
    ext: str
    size: int
    digest: str
    data: bytes | None
    sha256: bytes | None = None  # of the data, when asked for (signed imports)
    manifest: _Manifest | None = None  # the manifest member, parsed


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
        return tarfile.open(fileobj=stream, mode="r|"), stream, errors
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
    """Each member of the bundle, checked (name, type, size) and hashed, in archive order.
    The manifest's size is checked against :func:`manifest_limit` from its header, before
    any of it is read; with ``read_manifest`` it is parsed (:func:`_read_manifest`), else
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
                    parsed = _read_manifest(source, m.size)
                    yield _Member(name, key, ext, m.size, "", None, manifest=parsed)
                continue
            if m.size > max_member:
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


# -- the manifest, one value at a time ---------------------------------------------------------
_SPACE = re.compile(r"[ \t\n\r]*")
_WINDOW_FIRST = 4096  # most values fit: tried before the value's whole window


class _JsonStream:
    """JSON read from a UTF-8 byte stream one value at a time, each parsed from a window of at
    most a given number of characters: a value longer than its window is refused, so what
    parsing one value costs is bounded by its window, whatever the stream holds."""

    def __init__(self, source: IO[bytes]) -> None:
        self._source = source
        self._decode = codecs.getincrementaldecoder("utf-8")().decode
        self._text = ""
        self._pos = 0
        self._ended = False
        self.read = 0  # bytes read from the stream
        self._decoder = json.JSONDecoder()

    def _fill(self, want: int) -> None:
        """Have ``want`` characters from the position on, unless the stream ends first."""
        while len(self._text) - self._pos < want and not self._ended:
            chunk = self._source.read(CHUNK)
            self.read += len(chunk)
            self._ended = not chunk
            try:
                text = self._decode(chunk, final=self._ended)
            except UnicodeDecodeError:
                raise BundleError("bad manifest: not JSON (not UTF-8)") from None
            self._text = self._text[self._pos :] + text
            self._pos = 0

    def peek(self) -> str:
        """The next character that is not white space ("" at the end), not consumed."""
        while True:
            self._fill(1)
            self._pos = _SPACE.match(self._text, self._pos).end()  # type: ignore[union-attr]
            if self._pos < len(self._text) or self._ended:
                return self._text[self._pos : self._pos + 1]

    def take(self, char: str) -> bool:
        """Consume ``char`` if it comes next; whether it did."""
        if self.peek() != char:
            return False
        self._pos += 1
        return True

    def value(self, limit: int, what: str) -> tuple[Any, str]:
        """The next JSON value and its text, if that is at most ``limit`` characters.

        Raises:
            BundleError: not JSON, nested too deeply, or longer than ``limit`` (``what`` names
                it).
        """
        self.peek()
        for size in (min(_WINDOW_FIRST, limit), limit):
            self._fill(size + 1)
            window = self._text[self._pos : self._pos + size + 1]
            cut = len(window) > size  # more text follows the window
            try:
                value, end = self._decoder.raw_decode(window)
            except RecursionError:
                raise BundleError("bad manifest: not JSON (nested too deeply)") from None
            except ValueError as e:
                if cut and size < limit:
                    continue
                if cut:
                    raise BundleError(
                        f"bad manifest: {what} is larger than {limit} bytes"
                    ) from None
                raise BundleError(f"bad manifest: not JSON ({e})") from None
            if end <= size:
                self._pos += end
                return value, window[:end]
            if size == limit:
                raise BundleError(f"bad manifest: {what} is larger than {limit} bytes")
        raise AssertionError("unreachable")


class Listed(NamedTuple):
    """An entry of a manifest, checked: what the checks and the publishing pass need of it,
    and its document's own text (parsed again when it is published)."""

    key: str
    ext: str
    size: int
    digest: str
    text: str

    def document(self) -> dict[str, Any]:
        """The entry's document, as written."""
        doc: dict[str, Any] = load_json(self.text)
        return doc


@dataclass(frozen=True)
class _Manifest:
    """A parsed manifest: its entries by member name, and its other fields (with
    ``entries`` mapped to None)."""

    entries: dict[str, Listed]
    fields: dict[str, Any]


def _read_manifest(source: IO[bytes], size: int) -> _Manifest:
    """Parse the manifest member ``source`` of ``size`` bytes one value at a time, checking
    each entry as it comes (:func:`_check_entry`) and keeping only its text.

    Raises:
        BundleError: the manifest is not a JSON object of bounded fields, or (once its format
            and version are known to be this one's) an entry is bad.
    """
    stream = _JsonStream(source)
    entries: dict[str, Listed] = {}
    keys: set[str] = set()
    fields: dict[str, Any] = {}
    first_error: BundleError | None = None
    try:
        if not stream.take("{"):
            if stream.peek() in ("", "[", '"', "t", "f", "n", "-") or stream.peek().isdigit():
                raise BundleError(f"bad manifest: not a {BUNDLE_FORMAT} manifest")
            raise BundleError("bad manifest: not JSON")
        while not stream.take("}"):
            if fields and not stream.take(","):
                raise BundleError("bad manifest: not JSON (expected ',' or '}')")
            name, _ = stream.value(NAME_MAX, "a field name")
            if not isinstance(name, str) or not stream.take(":"):
                raise BundleError("bad manifest: not JSON (expected a field name)")
            if name in fields:
                raise BundleError(f"bad manifest: field {name!r} appears twice")
            fields[name] = None
            if name != "entries":
                fields[name] = stream.value(VALUE_MAX, f"field {name!r}")[0]
                continue
            if not stream.take("["):
                first_error = first_error or BundleError(
                    "bad manifest: 'entries' must be a list, 'compatibility' an object"
                )
                stream.value(VALUE_MAX, "field 'entries'")
                continue
            number = 0
            while not stream.take("]"):
                if number and not stream.take(","):
                    raise BundleError("bad manifest: not JSON (expected ',' or ']')")
                meta, text = stream.value(MANIFEST_ENTRY_MAX, f"entry #{number}")
                if first_error is None:
                    try:
                        listed = _check_entry(number, meta, text, keys)
                        entries[f"{MEMBER_DIR}/{listed.key}.{listed.ext}"] = listed
                    except BundleError as e:
                        first_error = e
                        entries.clear()  # kept no longer: it is refused
                number += 1
        if stream.peek() != "":
            raise BundleError("bad manifest: not JSON (extra data after it)")
    except BundleError:
        if stream.read < size and stream.peek() == "":
            raise BundleError(f"member {MANIFEST!r} is truncated") from None
        raise
    _check_header(fields)
    if first_error is not None:
        raise first_error
    return _Manifest(entries, fields)


def _check_header(fields: dict[str, Any]) -> None:
    """Raise BundleError if the manifest is not of this format and version."""
    if fields.get("format") != BUNDLE_FORMAT:
        raise BundleError(f"bad manifest: not a {BUNDLE_FORMAT} manifest")
    version = fields.get("version")
    if version != BUNDLE_VERSION:
        raise BundleError(
            f"bad manifest: bundle version {version!r} is not supported by kernelcache "
            f"{__version__} (it reads version {BUNDLE_VERSION}); upgrade kernelcache"
        )
    compat = fields.get("compatibility")
    if "entries" not in fields or not isinstance(compat, dict):
        raise BundleError("bad manifest: 'entries' must be a list, 'compatibility' an object")
    if compat.get("entry_format") != FORMAT_VERSION:
        raise BundleError(
            f"bad manifest: entry format {compat.get('entry_format')!r} differs from this "
            f"kernelcache's ({FORMAT_VERSION}); export the entries again with kernelcache "
            f"{__version__}"
        )


def _check_entry(number: int, meta: Any, text: str, seen: set[str]) -> Listed:
    """The entry #``number`` of a manifest, checked as the publishing pass will check it
    (:func:`~kernelcache.schema.check_written`): the metadata schema, its entry digest, what
    it covers and its size.

    Raises:
        BundleError: naming the entry and what is wrong.
    """
    key = meta.get("key") if isinstance(meta, dict) else None
    if not isinstance(key, str) or split_entry_name(f"{key}.{META_EXT}") is None:
        raise BundleError(f"bad manifest: entry #{number} has no valid key")
    checked = check_written(meta, key)
    if isinstance(checked, Problem):
        raise BundleError(f"bad manifest: entry {key}: {checked.reason}")
    if key in seen:
        raise BundleError(f"bad manifest: key {key} is listed twice")
    seen.add(key)
    return Listed(key, checked["ext"], checked["size"], checked["digest"], text)


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
