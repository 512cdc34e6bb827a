"""zstd, as kernelcache compresses what it stores or sends: one frame, its content size in its
header, at one level; and the bounded inflation of a frame read from elsewhere.

A root whose ``compression`` setting is ``zstd`` (an option of the root's configuration,
``kernelcache -o compression=zstd``; off by default) writes each new artifact as such a frame
where that is smaller (:func:`packed`). Its metadata is the entry's as ever: size and digest of
the artifact itself. A reader tells a packed artifact from a plain one by its file's size: the
plain one is exactly the size the metadata says, a packed one smaller (:func:`unpacked`), so a
root holds both, and one whose setting changes keeps serving every entry. The cost: a hit
inflates, and the file is no longer the machine code a loader opens as is (``Artifact.data``
is; ``Artifact.path`` holds the frame), and a kernelcache before this one takes such entries
for corrupt: turn it on only where every reader of the root is this version or newer.

Invariants: nothing here raises for what it reads: a frame that does not say its size, says
another size than expected, is cut short or is followed by other bytes is a reason, never
inflated beyond the size asked for. Without zstandard (a dependency; a broken install), nothing
is packed and a packed artifact cannot be read (said as its reason).
"""

from __future__ import annotations

import threading
from typing import Any

from ..config import COMPRESSIONS
from ..errors import InvalidValue
from ..fsio import read_exact

#: the level everything is compressed at (zstd's default: fast; machine code to a fifth or a
#: third; higher levels gain a few percent for several times the time)
LEVEL = 3
#: the first bytes of every zstd frame
FRAME_MAGIC = b"\x28\xb5\x2f\xfd"


def zstd() -> Any:
    """The zstandard module, or None where it is missing."""
    try:
        import zstandard
    except ImportError:
        return None
    return zstandard


#: this thread's compressor and decompressor (each holds a zstd context: made once per thread,
#: as one is not safe in two threads at once; a new one per call cost a hit a third more)
_contexts = threading.local()


def _context(module: Any, kind: str) -> Any:
    made = getattr(_contexts, kind, None)
    if made is None:
        if kind == "deflate":
            made = module.ZstdCompressor(level=LEVEL, write_content_size=True)
        else:
            made = module.ZstdDecompressor()
        setattr(_contexts, kind, made)
    return made


def deflated(data: bytes) -> bytes | None:
    """``data`` as one zstd frame, where that is smaller; None otherwise (or no zstandard)."""
    module = zstd()
    if module is None:
        return None
    frame = _context(module, "deflate").compress(data)
    return frame if len(frame) < len(data) else None


def inflated(frame: bytes, most: int, exact: bool = False) -> bytes | str:
    """The bytes of the zstd ``frame``: at most ``most`` of them (with ``exact``, exactly
    ``most``), as its header says before anything is inflated; else what is wrong."""
    module = zstd()
    if module is None:
        return "it is zstd-compressed and zstandard is not installed here"
    try:
        size = module.frame_content_size(frame)
    except module.ZstdError:
        return "it is not a zstd frame"
    if size < 0 or size > most or (exact and size != most):
        wanted = f"{most:,} bytes" if exact else f"a size an entry may have (at most {most:,})"
        return f"its zstd frame says {size:,} bytes, not {wanted}"
    inflater = _context(module, "inflate").decompressobj()
    try:
        plain = inflater.decompress(frame)
    except module.ZstdError as e:
        return f"its zstd frame cannot be inflated: {e}"
    if not inflater.eof or inflater.unused_data or len(plain) != size:
        return "its zstd frame is cut short, or followed by other bytes"
    return bytes(plain)


def packed(data: bytes, method: str) -> bytes:
    """What a root whose setting is ``method`` writes for the artifact ``data``."""
    if method == "zstd":
        return deflated(data) or data
    return data


def unpacked(raw: bytes, size: int) -> bytes | str:
    """The artifact of ``size`` bytes whose file holds ``raw``, fewer bytes (a packed one), or
    why it cannot be."""
    if not raw.startswith(FRAME_MAGIC):
        return f"artifact has {len(raw)} bytes, metadata says {size}"
    found = inflated(raw, size, exact=True)
    return found if isinstance(found, bytes) else f"artifact is packed, but {found}"


def read_packed(fd: int, file_size: int, size: int) -> bytes | str | None:
    """The artifact of ``size`` bytes whose open file ``fd`` holds ``file_size`` bytes, other
    than ``size`` (a packed one); what is wrong where it is none; None where the file changed
    while being read."""
    if file_size > size:
        return f"artifact has {file_size} bytes, metadata says {size}"
    raw = read_exact(fd, file_size)
    return None if raw is None else unpacked(raw, size)


def check_method(method: str) -> str:
    """``method``, if the ``compression`` setting takes it.

    Raises:
        ValueError: it does not (the message lists what it takes).
    """
    if method not in COMPRESSIONS:
        raise InvalidValue(f"compression {method!r} is not one of {', '.join(COMPRESSIONS)}")
    return method
