"""Bundles made by hand, for the tests of what an import lets in: any manifest, any members
(the manifest's header is a valid one unless a test gives its fields)."""

from __future__ import annotations

import io
import json
import tarfile
import time
from pathlib import Path
from typing import Any

from kernelcache.schema import FORMAT_VERSION


def write_bundle(path: Path, blobs: list[bytes], **manifest_fields: Any) -> Path:
    """A bundle at ``path``: a member per entry of the manifest (its ``entries``, holding
    ``blobs`` in order), then the manifest (other fields: a valid header unless given)."""
    manifest = {
        "format": "kernelcache-bundle",
        "version": 1,
        "created": time.time(),
        "compatibility": {"entry_format": FORMAT_VERSION, "kernelcache": "0", "producers": {}},
        **manifest_fields,
    }
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for doc, data in zip(manifest["entries"], blobs, strict=True):
            info = tarfile.TarInfo(f"entries/{doc['key']}.{doc['ext']}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        body = json.dumps(manifest).encode()
        info = tarfile.TarInfo("manifest.json")
        info.size = len(body)
        tar.addfile(info, io.BytesIO(body))
    return path
