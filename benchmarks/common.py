"""What the benchmark scripts share: an older bridge to compare against, and the summary they
print and write."""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def export(ref: str, into: Path) -> Path:
    """A directory holding the bridge of ``ref``: the directory itself, or the git ref's tree."""
    if Path(ref).is_dir():
        return Path(ref).resolve()
    tree = into / f"before-{hashlib.sha256(ref.encode()).hexdigest()[:8]}"
    tree.mkdir()
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", "--format=tar", ref],
        capture_output=True,
        check=True,
    )
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
    return tree


def emit_summary(summary: dict[str, Any], out: Path | None) -> None:
    """Print ``summary`` as the last line (one JSON document) and, with ``out``, write it there."""
    print(json.dumps(summary, sort_keys=True))
    if out:
        out.write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
