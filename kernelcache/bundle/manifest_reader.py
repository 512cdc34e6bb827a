"""A bundle's manifest, read and checked one value at a time: its header (this format and
version, this entry format) and each entry it lists (:class:`Listed`), checked as the
publishing pass will check it.

Invariants: memory is bounded by what the bundle holds: the manifest is parsed one value at a
time (:class:`_JsonStream`), each from a bounded window (a value longer than its window is
refused), keeping only each valid entry's own text; a hostile manifest of countless tiny values
costs no more than its size. A manifest that is refused raises
:class:`~kernelcache.errors.BundleError` naming what is wrong, and nothing of it is kept.
"""

from __future__ import annotations

import codecs
import json
import re
from dataclasses import dataclass
from typing import IO, Any, NamedTuple

from .._version import __version__
from ..errors import BundleError
from ..fsio import load_json
from ..keys import META_EXT, split_entry_name
from ..problem import Problem
from ..schema.document import FORMAT_VERSION, check_written
from .archive import (
    BUNDLE_FORMAT,
    BUNDLE_VERSION,
    CHUNK,
    MANIFEST,
    MANIFEST_ENTRY_MAX,
    MEMBER_DIR,
    NAME_MAX,
    VALUE_MAX,
)

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
class Manifest:
    """A parsed manifest: its entries by member name, and its other fields (with
    ``entries`` mapped to None)."""

    entries: dict[str, Listed]
    fields: dict[str, Any]


def parse_manifest(source: IO[bytes], size: int) -> Manifest:
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
    return Manifest(entries, fields)


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
