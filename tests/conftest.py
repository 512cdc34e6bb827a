"""Fixtures for every test: each test's own kernelcache environment and default root, a cache
root in a temporary directory, and the kernelcache logger's warnings.

Nothing a test runs writes outside temporary directories: the session's user directories
(``XDG_CACHE_HOME``, ``XDG_CONFIG_HOME``, ``XDG_DATA_HOME``, ``XDG_STATE_HOME``, and Triton's
``TRITON_HOME``) point into one made for the session, in this process and every child it
starts, so a default cache root (platformdirs' user cache directory) is never the user's own.

Helpers (plain functions and constants) are in tests/helpers/, which pytest puts on the path
(``pythonpath`` in pyproject.toml); fixtures of one part of the tree are in that part's
conftest.py."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path

import pytest

# The kernelcache command these tests run loads the bridge's command plugin, which declares the
# bridge's metadata fields (launch fields such as num_warps are covered); this process declares
# them too, so that entries the tests write are entries such a reader serves.
import bridge.entries.metadata  # noqa: F401

#: the session's stand-in for the user's own directories (removed when the session ends)
SESSION_HOME = Path(tempfile.mkdtemp(prefix="kernelcache-tests-home-"))
for _name, _sub in (
    ("XDG_CACHE_HOME", "cache"),
    ("XDG_CONFIG_HOME", "config"),
    ("XDG_DATA_HOME", "data"),
    ("XDG_STATE_HOME", "state"),
    ("TRITON_HOME", "triton"),
):
    os.environ[_name] = str(SESSION_HOME / _sub)


def pytest_sessionfinish(session, exitstatus):
    shutil.rmtree(SESSION_HOME, ignore_errors=True)


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
