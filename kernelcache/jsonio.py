"""JSON from outside the process (files in a shared root, bundles, manifests, remote values)."""

from __future__ import annotations

import json
from typing import Any

from .errors import UnreadableFile


def load_json(raw: bytes | str) -> Any:
    """``json.loads`` whose every failure is a ValueError.

    Deeply nested input makes ``json.loads`` raise RecursionError; planted in a cache root it
    must read as unreadable data, never crash the reader.
    """
    try:
        return json.loads(raw)
    except RecursionError:
        raise UnreadableFile("JSON nested too deeply") from None
