"""``kernelcache jax-cache`` refusing a prune of every entry says what makes it remove every
entry: the cap asked for is below the entry used last, or every entry is older than the age
asked for; never a hint about a cap that was not asked for."""

from __future__ import annotations

import os
import time
from pathlib import Path

from cli_support import kc


def _entries(directory: Path, n: int, size: int, age: float) -> set[str]:
    """``n`` entries of JAX's cache (``<key>-cache`` files of ``size`` bytes, last used
    ``age`` seconds ago); every file."""
    directory.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        path = directory / f"k{i}-cache"
        path.write_bytes(b"x" * size)
        os.utime(path, (time.time() - age, time.time() - age))
    return {p.name for p in directory.iterdir()}


def _refused(tmp_path: Path, age: float, *args: str) -> str:
    """What ``jax-cache ARGS`` says refusing to prune every one of 3 entries of 2,000 bytes last
    used ``age`` seconds ago, having removed none."""
    written = _entries(tmp_path / "kc-jax", 3, 2000, age)
    proc = kc(tmp_path / "kc", "jax-cache", *args)
    assert proc.returncode == 2, proc.stderr
    assert {p.name for p in (tmp_path / "kc-jax").iterdir()} == written
    return " ".join(proc.stderr.split())


def test_a_cap_below_the_entry_used_last_is_said_as_such(tmp_path):
    said = _refused(tmp_path, 60, "--max-size", "1K")
    assert (
        "(--max-size 1.0 KiB is less than the entry used last, 2.0 KiB: give a larger SIZE" in said
    )
    assert "--max-size 0" not in said


def test_an_age_every_entry_is_older_than_is_said_as_such(tmp_path):
    said = _refused(tmp_path, 2 * 86400, "--max-age", "1d")
    assert (
        "(--max-age selects every entry: the one used last was used 2d ago; give a longer" in said
    )
    assert "--max-size" not in said
