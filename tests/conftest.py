"""Fixtures for every test: the session's own temporary and user directories, each test's own
kernelcache environment and default root, a cache root in a temporary directory, a directory
other users can reach, and the kernelcache logger's warnings.

Nothing a test runs writes outside temporary directories, and nothing is left in a temporary
directory it does not own: for the session, ``TMPDIR`` (what :mod:`tempfile` uses, here and in
every child process) is a directory under pytest's base temporary directory, and ``HOME``, the
XDG user directories (``XDG_CACHE_HOME``, ``XDG_CONFIG_HOME``, ``XDG_DATA_HOME``,
``XDG_STATE_HOME``) and Triton's ``TRITON_HOME`` are in it, so a default cache root
(platformdirs' user cache directory) is never the user's own. With pytest-xdist each worker has
its own, under its base directory. When the session ends, anything the suite's processes left in
those temporary directories (the session's own: never the machine's, where other programs make
what they make) that kernelcache or Triton would make there (``kc-*``, ``kernelcache-*``, a
``tmp*`` file or directory: Triton's files, a root's ``.stats/``) fails the session. Tests that
run processes as other users (who cannot enter pytest's directories) use :func:`shared_tmp`.

Helpers (plain functions and constants) are in tests/helpers/, which pytest puts on the path
(``pythonpath`` in pyproject.toml); fixtures of one part of the tree are in that part's
conftest.py."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import USER_DIRS

# The kernelcache command these tests run loads the bridge's command plugin, which declares the
# bridge's metadata fields (launch fields such as num_warps are covered); this process declares
# them too, so that entries the tests write are entries such a reader serves.
import bridge.entries.metadata  # noqa: F401

#: the system's temp directory, as the session found it (only :func:`shared_tmp` makes
#: directories there, and removes them)
SYSTEM_TEMP = Path(tempfile.gettempdir())
#: this session's name, shared by its xdist workers (which inherit the variable)
SESSION = os.environ.setdefault("KC_TESTS_SESSION", uuid.uuid4().hex[:12])
#: the prefix of the directories :func:`shared_tmp` makes in :data:`SYSTEM_TEMP`
SHARED_PREFIX = f"kernelcache-tests-{SESSION}-"
#: the name of the session's own temporary directory (``TMPDIR``), in each process's base
#: temporary directory (with xdist, each worker's is under the controller's)
SESSION_TEMP = "session-temp"
#: what the suite's processes leave in a temporary directory, by name (with :func:`left_in`)
LITTER = ("kc-", "kernelcache-", "tmp")


def left_in(temp: Path) -> set[str]:
    """Names in ``temp`` of what the suite's processes would leave there: ``kc-*`` and
    ``kernelcache-*``, and a ``tmp*`` file or directory (Triton's temporary files; a cache root
    made by :func:`tempfile.mkdtemp`)."""
    try:
        return {e.name for e in os.scandir(temp) if e.name.startswith(LITTER)}
    except FileNotFoundError:
        return set()


def session_temps(base: Path) -> list[Path]:
    """The session's temporary directories under pytest's base temporary directory ``base``:
    its own and, with xdist, each worker's."""
    return [base / SESSION_TEMP, *sorted(base.glob(f"*/{SESSION_TEMP}"))]


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Fail the session if its processes left anything in its own temporary directories (with
    xdist, the controller checks once every worker has finished). The machine's temp directory
    is never judged: other programs, other test runs included, make what they make there."""
    config = session.config
    if hasattr(config, "workerinput") or not hasattr(config, "_tmp_path_factory"):
        return
    base = config._tmp_path_factory.getbasetemp()
    left = sorted(str(t / n) for t in session_temps(base) for n in left_in(t))
    if not left:
        return
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    message = "left in the session's temporary directories by its processes: " + ", ".join(left)
    if reporter is not None:
        reporter.write("\n")
        reporter.write_sep("!", message, red=True)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(scope="session", autouse=True)
def _session_dirs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """This process's ``TMPDIR`` and user directories, under pytest's base temporary
    directory, for the session; the variables are restored afterwards."""
    temp = tmp_path_factory.mktemp(SESSION_TEMP, numbered=False)
    saved = {name: os.environ.get(name) for name in ("TMPDIR", *USER_DIRS)}
    os.environ["TMPDIR"] = str(temp)
    for name, sub in USER_DIRS.items():
        (temp / sub).mkdir(parents=True, exist_ok=True)
        os.environ[name] = str(temp / sub)
    tempfile.tempdir = None  # tempfile asks TMPDIR again
    yield temp
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    tempfile.tempdir = None


@pytest.fixture
def shared_tmp() -> Iterator[Path]:
    """A directory in the system's temp directory that every user can enter (mode 0755;
    pytest's are private to this user), removed after the test: for tests that run processes
    as other users. Give those processes :func:`support.other_users_env`, whose ``TMPDIR`` and
    ``HOME`` are its ``tmp/`` (sticky, writable by all), so nothing they make is left behind."""
    shared = Path(tempfile.mkdtemp(prefix=SHARED_PREFIX, dir=SYSTEM_TEMP))
    try:
        shared.chmod(0o755)
        (shared / "tmp").mkdir()
        (shared / "tmp").chmod(0o1777)
        yield shared
    finally:
        shutil.rmtree(shared, ignore_errors=True)


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
