"""Single-file bundles of cache entries: export from one root, import into another.

A bundle is a POSIX tar archive, optionally compressed with zstd (the optional ``zstandard``
package, ``pip install 'kernelcache[zstd]'``), holding exactly:

* ``entries/<key>.<ext>``: each artifact, a regular file;
* ``manifest.json`` (written last): ``{"format": "kernelcache-bundle", "version": 1,
  "created": <unix time>, "compatibility": {...}, "entries": [<metadata document>, ...]}``,
  where each metadata document is the entry's own ``<key>.json`` (with its size and xxh3-128
  digest) and ``compatibility`` holds the entry format version, this package's version, and the
  producer versions, targets and extensions found in the entries.

Import is all-or-nothing: a first pass reads the whole bundle without writing anything and
rejects it (:class:`BundleError`, naming the member or entry) for an absolute path, a ``..``
component, a link, a device or any other non-regular member, an unexpected name, a duplicate, a
member over the size limit, a manifest larger than its entries justify (:func:`manifest_limit`:
room for each entry's document, more the more its member holds), a damaged archive, a bad
manifest, an entry whose metadata the schema refuses (:mod:`kernelcache.schema`, entry digest
and coverage included), a member the manifest does not list (or the reverse), a size or digest mismatch, and,
with a signing key, an entry without a valid signature. ``dry_run`` stops there, with the same
outcome. Only then does a second pass publish each entry through :meth:`Store.publish` (atomic,
first writer wins), re-checking each member's digest first; entries already present are skipped.
Each document is published as written (its fields, ``covers`` and entry digest; its signature is
dropped), and exported as the root holds it (plus a signature): a bundle never widens what an
entry's writer covered.
If anything fails during that pass (the file changed, a full disk), the entries this import
published are deleted again before the error is raised: an import publishes everything or
nothing. (A process killed during the second pass cannot roll back: the entries it published
are whole and verified.)

Memory is bounded by what the bundle holds: members are streamed (one at a time in the second
pass), and the manifest is parsed one value at a time (:class:`_JsonStream`), each from a
bounded window, keeping only each valid entry's own text; a hostile manifest of countless tiny
values costs no more than its size.
"""

from __future__ import annotations

import codecs
import contextlib
import hashlib
import io
import json
import os
import re
import tarfile
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import IO, Any, NamedTuple

import xxhash

from .._version import __version__
from ..errors import BundleError, MissingDependency, NotRegularFile, WrongExt
from ..fsio import open_regular
from ..jsonio import load_json
from ..keys import META_EXT, split_entry_name
from ..problem import Problem
from ..schema.digests import check_signature, sign
from ..schema.document import check_written
from ..schema.format import FORMAT_VERSION, HMAC_FIELD, MAX_META_BYTES
from ..store.entry import Artifact
from ..store.root import Store
from ..table import EntryInfo
from ..toolchains import Judge

BUNDLE_FORMAT = "kernelcache-bundle"
BUNDLE_VERSION = 1
MANIFEST = "manifest.json"
MEMBER_DIR = "entries"
#: default limit on one artifact in a bundle (``import --max-member-size``)
MAX_MEMBER_BYTES = 256 << 20
#: a manifest may be this large, plus, for every entry member before it, MANIFEST_PER_ENTRY and
#: as many bytes as the member holds, up to MANIFEST_ENTRY_MAX (see manifest_limit); never more
#: than MAX_MANIFEST_BYTES
MANIFEST_BASE = 1 << 20
MANIFEST_PER_ENTRY = 16 << 10
#: the most characters one entry's document may take in a manifest (the window it is parsed in)
MANIFEST_ENTRY_MAX = MAX_META_BYTES + 1024
MAX_MANIFEST_BYTES = 64 << 20
#: the most characters a field name and any other value of a manifest may take
_NAME_MAX = 256
_VALUE_MAX = MANIFEST_BASE
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_OTHER_MAGIC = {
    b"\x1f\x8b": "gzip",
    b"BZh": "bzip2",
    b"\xfd7zXZ\x00": "xz",
    b"PK\x03\x04": "zip",
}
_CHUNK = 1 << 20

Progress = Callable[[int], object]


@dataclass(frozen=True)
class ExportResult:
    path: str
    entries: int
    bytes: int
    compression: str
    skipped: tuple[tuple[str, str], ...] = ()  # (key, reason)
    compatibility: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ImportResult:
    path: str
    entries: int  # in the bundle
    imported: int
    present: int
    bytes: int  # of the imported artifacts
    conflicts: tuple[tuple[str, str], ...] = ()  # (key, reason)
    compatibility: dict[str, Any] = field(default_factory=dict)
    dry_run: bool = False
    #: with a judge: entries this machine would look up, and the others counted by reason
    looked_up: int | None = None
    not_looked_up: tuple[tuple[str, int], ...] = ()


def _zstandard() -> Any:
    try:
        import zstandard
    except ImportError:
        raise MissingDependency(
            "zstd bundles need the zstandard package: pip install 'kernelcache[zstd]'"
        ) from None
    return zstandard


# -- export -------------------------------------------------------------------------------
def compatibility(docs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The compatibility block for a set of metadata documents."""
    producers: dict[str, set[str]] = {}
    targets: set[str] = set()
    exts: set[str] = set()
    for doc in docs:
        exts.add(doc["ext"])
        if isinstance(doc.get("target"), str):
            targets.add(doc["target"])
        producer = doc.get("producer")
        if isinstance(producer, dict):
            for name, version in producer.items():
                if isinstance(version, str):
                    producers.setdefault(str(name), set()).add(version)
    return {
        "entry_format": FORMAT_VERSION,
        "kernelcache": __version__,
        "producers": {k: sorted(v) for k, v in sorted(producers.items())},
        "targets": sorted(targets),
        "exts": sorted(exts),
    }


def resolve_compression(path: str, compression: str) -> str:
    """``auto`` means zstd for names ending in .zst, .zstd or .tzst, else none."""
    if compression not in ("auto", "none", "zstd"):
        raise BundleError(f"unknown compression {compression!r}; use auto, none or zstd")
    if compression == "auto":
        return "zstd" if path.endswith((".zst", ".zstd", ".tzst")) else "none"
    return compression


def export_bundle(
    root: str,
    entries: Sequence[EntryInfo],
    path: str,
    *,
    compression: str = "auto",
    level: int = 3,
    force: bool = False,
    progress: Progress | None = None,
    trust: str = "group",
    signing_key: bytes | None = None,
) -> ExportResult:
    """Write ``entries`` of ``root`` to the bundle ``path``.

    Each artifact is read and verified first (a corrupt, untrusted or vanished entry is
    skipped and listed in ``skipped``); reading never refreshes last-used stamps. With
    ``signing_key``, every entry of the manifest carries its HMAC (see
    :func:`kernelcache.schema.sign`). The bundle appears at ``path`` atomically, complete or not
    at all.

    Raises:
        BundleError: ``path`` exists (without ``force``) or cannot be written, or the manifest
            would exceed what an import accepts (:func:`manifest_limit`; export fewer entries
            per bundle).
        MissingDependency: zstd was asked for and ``zstandard`` is not installed.
    """
    method = resolve_compression(path, compression)
    zstd = _zstandard() if method == "zstd" else None
    if os.path.lexists(path) and not force:
        raise BundleError(f"{path} exists; pass --force to overwrite it")
    directory = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{uuid.uuid4().hex}.partial")
    reader = Store(root, readonly=True, trust=trust)
    docs: list[dict[str, Any]] = []
    sizes: list[int] = []
    skipped: list[tuple[str, str]] = []
    total = 0
    try:
        fd = os.open(
            tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666
        )
    except OSError as e:
        raise BundleError(f"cannot write {path}: {e.strerror}") from e
    try:
        with os.fdopen(fd, "wb") as raw:
            sink: IO[bytes] = raw
            writer = None
            if zstd is not None:
                writer = zstd.ZstdCompressor(level=level).stream_writer(raw, closefd=False)
                sink = writer
            with tarfile.open(fileobj=sink, mode="w|", format=tarfile.PAX_FORMAT) as tar:
                for entry in entries:
                    art = reader.read(entry.key)
                    if progress is not None:
                        progress(1)
                    if not isinstance(art, Artifact):
                        reason = "gone" if art is None else art.reason
                        skipped.append((entry.key, reason))
                        continue
                    doc = dict(art.meta)
                    if signing_key is not None:
                        doc[HMAC_FIELD] = sign(doc, hashlib.sha256(art.data).digest(), signing_key)
                    _add(tar, f"{MEMBER_DIR}/{art.key}.{art.ext}", art.data, doc.get("created"))
                    docs.append(doc)
                    sizes.append(len(art.data))
                    total += len(art.data)
                manifest = {
                    "format": BUNDLE_FORMAT,
                    "version": BUNDLE_VERSION,
                    "created": time.time(),
                    "compatibility": compatibility(docs),
                    "entries": docs,
                }
                body = json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()
                limit = manifest_limit(sizes)
                if len(body) > limit:
                    raise BundleError(
                        f"the manifest of {len(docs)} entries would be {len(body)} bytes, more "
                        f"than a bundle of them may hold ({limit}); export fewer entries "
                        "per bundle (--kernel, --target)"
                    )
                _add(tar, MANIFEST, body, manifest["created"])
            if writer is not None and zstd is not None:
                writer.flush(zstd.FLUSH_FRAME)
                writer.close()
        os.replace(tmp, path)
    except OSError as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise BundleError(f"cannot write {path}: {e.strerror or e}") from e
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return ExportResult(path, len(docs), total, method, tuple(skipped), compatibility(docs))


def _add(tar: tarfile.TarFile, name: str, data: bytes, mtime: object) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o644
    info.mtime = int(mtime) if isinstance(mtime, (int, float)) and mtime > 0 else 0
    info.uname = info.gname = ""
    tar.addfile(info, io.BytesIO(data))


# -- import -------------------------------------------------------------------------------
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
    for magic, name in _OTHER_MAGIC.items():
        if head.startswith(magic):
            raise BundleError(f"{name}-compressed bundles are not supported; use tar or tar+zstd")
    stream: Any = f
    errors: tuple[type[BaseException], ...] = (tarfile.TarError, EOFError, OSError)
    if head.startswith(_ZSTD_MAGIC):
        zstd = _zstandard()
        stream = zstd.ZstdDecompressor().stream_reader(f, closefd=False)
        errors += (zstd.ZstdError,)
    try:
        return tarfile.open(fileobj=stream, mode="r|"), stream, errors
    except errors as e:
        raise BundleError(f"not a tar archive ({e})") from None


def manifest_limit(sizes: Iterable[int]) -> int:
    """The largest manifest a bundle may have after entry members of ``sizes`` bytes: room for
    each entry's document, more the more its member holds (a document is at most
    :data:`MANIFEST_ENTRY_MAX`), so that what a manifest costs is bounded by what the bundle
    holds, never bought by empty members."""
    room = sum(min(MANIFEST_ENTRY_MAX, MANIFEST_PER_ENTRY + size) for size in sizes)
    return min(MAX_MANIFEST_BYTES, MANIFEST_BASE + room)


def _members(
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
                chunk = source.read(_CHUNK)
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
        raise BundleError("the bundle is truncated") from None
    except errors as e:
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
            chunk = self._source.read(_CHUNK)
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


class _Listed(NamedTuple):
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

    entries: dict[str, _Listed]
    fields: dict[str, Any]


def _read_manifest(source: IO[bytes], size: int) -> _Manifest:
    """Parse the manifest member ``source`` of ``size`` bytes one value at a time, checking
    each entry as it comes (:func:`_check_entry`) and keeping only its text.

    Raises:
        BundleError: the manifest is not a JSON object of bounded fields, or (once its format
            and version are known to be this one's) an entry is bad.
    """
    stream = _JsonStream(source)
    entries: dict[str, _Listed] = {}
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
            name, _ = stream.value(_NAME_MAX, "a field name")
            if not isinstance(name, str) or not stream.take(":"):
                raise BundleError("bad manifest: not JSON (expected a field name)")
            if name in fields:
                raise BundleError(f"bad manifest: field {name!r} appears twice")
            fields[name] = None
            if name != "entries":
                fields[name] = stream.value(_VALUE_MAX, f"field {name!r}")[0]
                continue
            if not stream.take("["):
                first_error = first_error or BundleError(
                    "bad manifest: 'entries' must be a list, 'compatibility' an object"
                )
                stream.value(_VALUE_MAX, "field 'entries'")
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


def _check_entry(number: int, meta: Any, text: str, seen: set[str]) -> _Listed:
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
    return _Listed(key, checked["ext"], checked["size"], checked["digest"], text)


def _open_bundle(path: str) -> IO[bytes]:
    """``path`` opened for reading, if it is a regular file (a FIFO or device is refused
    without blocking on it)."""
    try:
        return open_regular(path)
    except NotRegularFile:
        raise BundleError(f"{path} is not a regular file") from None
    except OSError as e:
        raise BundleError(f"cannot open {path}: {e.strerror}") from e


def _roll_back(store: Store, keys: Sequence[str]) -> int:
    """Delete the entries an import published; return how many could not be deleted."""
    left = 0
    for key in keys:
        try:
            if store.delete(key, wait=store.lock_timeout) is None:
                left += 1
        except (OSError, ValueError):
            left += 1
    return left


def import_bundle(
    store: Store,
    path: str,
    *,
    max_member_size: int = MAX_MEMBER_BYTES,
    dry_run: bool = False,
    progress: Progress | None = None,
    signing_key: bytes | None = None,
    judge: Judge | None = None,
) -> ImportResult:
    """Verify the bundle ``path`` completely, then publish its entries into ``store``.

    With ``dry_run`` only the verification runs (the same as for a real import: what it
    accepts, the import publishes). Entries whose key is already present (and valid, under
    the store's trust policy) are skipped; a key present with another extension is a conflict,
    left alone. With ``signing_key``, every entry must carry a valid signature. With ``judge``
    (see :mod:`kernelcache.toolchains`), the result counts the entries this machine's keys can
    name, and the others by reason.

    Raises:
        BundleError: the bundle is rejected, or changed while being imported; nothing was
            written (``imported`` counts entries that could not be removed again, normally 0).
        MissingDependency: a zstd bundle and no ``zstandard``.
        CacheError: the store cannot take an entry (read-only root, full disk, ...); the
            entries this import published before are removed again.
    """
    with _open_bundle(path) as f:
        members = {
            m.name: m
            for m in _members(
                f,
                max_member_size,
                keep_data=False,
                sha256=signing_key is not None,
                read_manifest=True,
            )
        }
        manifest = members.pop(MANIFEST, None)
        if manifest is None or manifest.manifest is None:
            raise BundleError(f"bad manifest: the bundle has no {MANIFEST}")
        listed, compat = manifest.manifest.entries, manifest.manifest.fields["compatibility"]
        lacking = sorted(listed.keys() - members.keys())
        if lacking:
            raise BundleError(f"bad manifest: it lists {lacking[0]!r}, which the bundle lacks")
        unlisted = sorted(members.keys() - listed.keys())
        if unlisted:
            raise BundleError(f"member {unlisted[0]!r} is not listed in the manifest")
        for name, member in sorted(members.items()):
            entry = listed[name]
            if member.size != entry.size or member.digest != entry.digest:
                raise BundleError(
                    f"member {name!r} does not match the manifest (size {member.size} vs "
                    f"{entry.size}, digest {member.digest} vs {entry.digest}): the bundle "
                    "is corrupt or was tampered with"
                )
            if signing_key is not None:
                assert member.sha256 is not None
                why = check_signature(load_json(entry.text), member.sha256, signing_key)
                if why is not None:
                    raise BundleError(
                        f"entry {entry.key} is refused: {why} (KERNELCACHE_SIGNING_KEY is "
                        "set: only bundles signed with it are imported)"
                    )
        checker = Store(store.root, readonly=True, trust=store.trust)
        present = 0
        conflicts: list[tuple[str, str]] = []
        todo = []
        for name, entry in sorted(listed.items()):
            existing = checker.read(entry.key)
            if isinstance(existing, Artifact):
                if existing.ext == entry.ext:
                    present += 1
                else:
                    conflicts.append((entry.key, f"holds a .{existing.ext} artifact"))
                continue
            todo.append(name)
        looked_up, reasons = _judged(listed.values(), judge)
        if dry_run or not todo:
            size = sum(listed[n].size for n in todo)
            return ImportResult(
                path,
                len(listed),
                len(todo),
                present,
                size,
                tuple(conflicts),
                compat,
                dry_run,
                looked_up,
                reasons,
            )
        wanted = set(todo)
        published: list[str] = []
        imported = 0
        size = 0
        try:
            for member in _members(
                f,
                max_member_size,
                keep_data=True,
                sha256=signing_key is not None,
                progress=progress,
            ):
                if member.name not in wanted:
                    continue
                entry = listed[member.name]
                original = members[member.name]
                if (
                    member.digest != entry.digest
                    or member.data is None
                    or member.sha256 != original.sha256
                ):
                    raise BundleError(
                        f"{path} changed while being imported (member {member.name!r})"
                    )
                try:
                    _, created = store.publish(
                        member.key, member.ext, member.data, entry.document(), as_written=True
                    )
                except WrongExt as e:
                    conflicts.append((member.key, str(e)))
                    continue
                if created:
                    published.append(member.key)
                imported += 1
                size += member.size
        except BaseException as e:
            left = _roll_back(store, published)
            if isinstance(e, BundleError):
                e.imported = left
            raise
    return ImportResult(
        path,
        len(listed),
        imported,
        present,
        size,
        tuple(conflicts),
        compat,
        False,
        looked_up,
        reasons,
    )


def _judged(
    entries: Iterable[_Listed], judge: Judge | None
) -> tuple[int | None, tuple[tuple[str, int], ...]]:
    """How many of ``entries`` ``judge`` says this machine would look up, and the others by
    reason, most frequent first (None and nothing without a judge). A companion of an entry
    of the bundle (its ``of`` names that entry's key) is looked up with it: it shares its
    verdict."""
    if judge is None:
        return None, ()
    entries = list(entries)
    keys = {entry.key for entry in entries}
    verdicts: dict[str, str | None] = {}
    companions: dict[str, str] = {}  # one document parsed at a time: a manifest may be large
    for entry in entries:
        doc = load_json(entry.text)
        of = doc.get("of")
        if isinstance(of, str) and of in keys:
            companions[entry.key] = of
        else:
            verdicts[entry.key] = judge(doc)
    reasons: Counter[str] = Counter()
    looked_up = 0
    for entry in entries:
        why = verdicts[entry.key] if entry.key in verdicts else verdicts[companions[entry.key]]
        if why is None:
            looked_up += 1
        else:
            reasons[why] += 1
    return looked_up, tuple(reasons.most_common())
