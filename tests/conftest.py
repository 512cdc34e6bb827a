"""Fixtures for every test: each test's own kernelcache environment and default root, a cache
root in a temporary directory, and the kernelcache logger's warnings.

Helpers (plain functions and constants) are in tests/helpers/, which pytest puts on the path
(``pythonpath`` in pyproject.toml); fixtures of one part of the tree are in that part's
conftest.py."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

# The kernelcache command these tests run loads the bridge's command plugin, which declares the
# bridge's metadata fields (launch fields such as num_warps are covered); this process declares
# them too, so that entries the tests write are entries such a reader serves.
import bridge.entries.metadata  # noqa: F401


@pytest.fixture(autouse=True)
def _isolated_env(monkeypatch, tmp_path_factory):
    """Tests never see the caller's kernelcache variables, and get a private default root."""
    for name in list(os.environ):
        if name.startswith("KERNELCACHE_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("KERNELCACHE_DIR", str(tmp_path_factory.mktemp("default-root")))


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "cache"


@pytest.fixture
def caplog_warnings(caplog):
    caplog.set_level(logging.WARNING, logger="kernelcache")
    return caplog
