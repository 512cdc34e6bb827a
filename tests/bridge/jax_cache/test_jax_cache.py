"""JAX's persistent compilation cache beside the kernel cache: ``bridge.enable_jax_cache`` keeps
what the user set, and ``kernelcache jax-cache`` shows and prunes the directory JAX wrote, in
JAX's own format, through the real command line."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from cli_support import answer_on_a_terminal, kc, kc_json
from support import run_py

pytest.importorskip("jax", reason="needs jax (pip install 'kernelcache[bridge]')")

COMPILE = """
import logging, sys
import jax, jax.numpy as jnp
logging.basicConfig(level=logging.WARNING)
import bridge
path = bridge.enable_jax_cache(sys.argv[1], min_compile_time_secs=0.5, max_size="50M")
bridge.enable_jax_cache(sys.argv[1], min_compile_time_secs=0.5, max_size="50M")  # says it once
print("dir", path)
print("min", jax.config.jax_persistent_cache_min_compile_time_secs)
print("max", jax.config.jax_compilation_cache_max_size)
for n in range(3):
    jax.jit(lambda x, n=n: x * (n + 2) + n).lower(jnp.ones(8 + n)).compile()
"""


def test_user_settings_are_kept_and_the_directory_pruned_in_jaxs_format(tmp_path):
    users, asked = tmp_path / "users-jax", tmp_path / "asked-jax"
    out = run_py(
        COMPILE,
        str(asked),
        JAX_COMPILATION_CACHE_DIR=str(users),
        JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
        JAX_PLATFORMS="cpu",
    )
    lines = dict(line.split(" ", 1) for line in out.stdout.splitlines())
    assert lines["dir"] == str(users) and not asked.exists()
    assert float(lines["min"]) == 0.0  # the user's, not the 0.5 asked
    assert int(lines["max"]) == 50 << 20  # a size read by kernelcache's one parser
    assert out.stderr.count("keeping the jax_compilation_cache_dir you set") == 1
    assert out.stderr.count("keeping the jax_persistent_cache_min_compile_time_secs") == 1
    written = sorted(p.name for p in users.iterdir())
    cache_files = [n for n in written if n.endswith("-cache")]
    assert len(cache_files) >= 3 and ".lockfile" in written
    assert all(n[: -len("-cache")] + "-atime" in written for n in cache_files)

    doc = kc_json(None, "jax-cache", "--dir", str(users))
    assert doc["entries"] == len(cache_files)
    assert doc["bytes"] == sum((users / n).stat().st_size for n in cache_files)
    # JAX's -atime files order the entries: make the first one the least recently used
    oldest = cache_files[0][: -len("-cache")]
    (users / f"{oldest}-atime").write_bytes(int((time.time() - 86400) * 1e9).to_bytes(8, "little"))
    doc = kc_json(None, "jax-cache", "--dir", str(users), "--max-age", "12h", "--dry-run")
    assert [e["key"] for e in doc["to_remove"]] == [oldest] and doc["removed"] == 0
    assert (users / f"{oldest}-cache").exists()
    doc = kc_json(None, "jax-cache", "--dir", str(users), "--max-age", "12h")
    assert doc["removed"] == 1
    assert not (users / f"{oldest}-cache").exists() and not (users / f"{oldest}-atime").exists()
    # a size cap keeps the most recently used; JAX's directory is found through its variable
    env = {"JAX_COMPILATION_CACHE_DIR": str(users)}
    assert kc_json(None, "jax-cache", "--max-size", "0", env=env)["removed"] == 0  # no cap
    # every entry left: refused without --yes (no terminal to ask on), nothing removed
    assert "would delete every entry" in kc(None, "jax-cache", "--max-size", "1B", env=env).stderr
    doc = kc_json(None, "jax-cache", "--max-size", "1B", "--yes", env=env)
    assert doc["removed"] == len(cache_files) - 1
    assert sorted(p.name for p in users.iterdir()) == [".lockfile"]


def test_the_default_directory_is_beside_the_kernel_cache(tmp_path):
    root = tmp_path / "kc"
    # a fresh set-up: no JAX cache yet is not an error, and says how one comes to be
    proc = kc(root, "jax-cache")
    assert proc.returncode == 0, proc.stderr
    assert f"{tmp_path / 'kc-jax'} (does not exist yet" in proc.stdout
    assert "bridge.enable_jax_cache()" in proc.stdout
    doc = kc_json(root, "jax-cache", "--max-size", "1G")
    assert doc["exists"] is False and doc["entries"] == 0 and doc["removed"] == 0
    proc = kc(root, "jax-cache", "--dir", str(tmp_path / "nope"))  # one named: a usage error
    assert proc.returncode == 2 and "does not exist" in proc.stderr
    assert "bridge.enable_jax_cache()" in proc.stderr
    (tmp_path / "kc-jax").mkdir()
    (tmp_path / "kc-jax" / "abc-cache").write_bytes(b"x" * 10)
    os.symlink("/etc/passwd", tmp_path / "kc-jax" / "evil-cache")  # never followed or counted
    doc = kc_json(root, "jax-cache")
    assert doc["dir"] == str(tmp_path / "kc-jax") and doc["entries"] == 1 and doc["bytes"] == 10
    assert doc["exists"] is True
    assert "Entries:    1 (10 B)" in kc(root, "jax-cache").stdout


def test_enable_jax_cache_reads_sizes(tmp_path):
    bridge = pytest.importorskip("bridge")
    with pytest.raises(ValueError, match="invalid size 'huge'"):
        bridge.enable_jax_cache(tmp_path, max_size="huge")
    assert Path(tmp_path).exists()


def _jax_entries(directory: Path, n: int, size: int = 2000) -> set[str]:
    """``n`` entries of JAX's cache (``<key>-cache`` files of ``size`` bytes); every file."""
    directory.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        (directory / f"k{i}-cache").write_bytes(b"x" * size)
    return {p.name for p in directory.iterdir()}


def test_a_prune_of_every_entry_asks_first(tmp_path):
    root = tmp_path / "kc"
    jax = tmp_path / "kc-jax"
    written = _jax_entries(jax, 7)
    proc = kc(root, "jax-cache", "--max-size", "1K")  # no terminal to ask on: refused
    said = " ".join(proc.stderr.split())
    assert proc.returncode == 2 and f"would delete every entry of JAX's cache {jax} (7," in said
    assert "pass --yes" in said
    assert {p.name for p in jax.iterdir()} == written
    code, shown = answer_on_a_terminal(root, "n", "jax-cache", "--max-size", "1K")
    assert "[y/N]" in shown and code == 2 and "not confirmed" in shown
    assert {p.name for p in jax.iterdir()} == written
    assert kc_json(root, "jax-cache", "--max-size", "2K")["removed"] == 6  # one kept: no question
    assert kc_json(root, "jax-cache", "--max-size", "1K", "--yes")["removed"] == 1


def test_jax_cache_never_prunes_a_read_only_roots_directory(tmp_path):
    root = tmp_path / "image"
    beside = tmp_path / "image-jax"
    written = _jax_entries(beside, 3)
    env = {"KERNELCACHE_READONLY_DIRS": str(root)}
    proc = kc(root, "jax-cache", "--max-age", "0s", "--yes", env=env)  # the directory beside it
    said = " ".join(proc.stderr.split())
    assert proc.returncode == 2 and f"belongs to the read-only root {root}" in said, said
    named = {"KERNELCACHE_READONLY_DIRS": str(beside)}  # a directory named read-only itself
    proc = kc(None, "jax-cache", "--dir", str(beside), "--max-size", "1K", "--yes", env=named)
    said = " ".join(proc.stderr.split())
    assert proc.returncode == 2 and f"{beside} is a read-only root" in said, said
    assert {p.name for p in beside.iterdir()} == written
    dry = kc_json(root, "jax-cache", "--max-age", "0s", "--dry-run", env=env)
    assert len(dry["to_remove"]) == 3 and {p.name for p in beside.iterdir()} == written
