"""Exporting entries of a root into a bundle. Each document is exported as the root holds it
(plus a signature, with a signing key): a bundle never widens what an entry's writer covered.
The bundle appears at its path atomically, complete or not at all.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import io
import json
import os
import tarfile
import time
import uuid
from collections.abc import Sequence
from typing import IO, Any

from .._version import __version__
from ..config import DEFAULTS
from ..errors import BundleError
from ..schema.document import FORMAT_VERSION, sign
from ..schema.fields import HMAC_FIELD
from ..store.entry import Artifact
from ..store.root import Store
from ..table import EntryInfo
from .archive import (
    BUNDLE_FORMAT,
    BUNDLE_VERSION,
    MANIFEST,
    MEMBER_DIR,
    ExportResult,
    Progress,
    zstandard_module,
)
from .preflight import manifest_limit


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
    """``auto`` means what the name says (``.tar``: a plain tar; ``.zst``, ``.zstd``, ``.tzst``:
    zstd), else zstd where zstandard is installed (a dependency of kernelcache's)."""
    if compression not in ("auto", "none", "zstd"):
        raise BundleError(f"unknown compression {compression!r}; use auto, none or zstd")
    if compression == "auto":
        if path.endswith(".tar"):
            return "none"
        named = path.endswith((".zst", ".zstd", ".tzst"))
        return "zstd" if named or importlib.util.find_spec("zstandard") else "none"
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
    trust: str = DEFAULTS.trust,
    signing_key: bytes | None = None,
) -> ExportResult:
    """Write ``entries`` of ``root`` to the bundle ``path``.

    Each artifact is read and verified first, as ``verify`` checks it (a corrupt, untrusted or
    vanished entry, or one that is not whole, is skipped and listed in ``skipped``: what an
    export writes, an import accepts); reading never refreshes last-used stamps. With
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
    zstd = zstandard_module() if method == "zstd" else None
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
                    art = reader.inspect(entry.key, whole=True)
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
