"""Helpers every kind of test uses: the checkout's paths, valid keys, fresh child Python
processes that import this checkout (plain, in a private mount namespace, on a
pseudo-terminal), and what this machine lets a test do (``IS_ROOT``, ``CAN_UNSHARE``,
``CAN_DROP_PRIVILEGES``, ``CAN_SHARE``).

Plain functions and constants, importable by child processes too (``HELPERS`` is the folder
to put on their path); the fixtures are in the conftest.py files."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

# The kernelcache command these tests run loads the bridge's command plugin, which declares the
# bridge's metadata fields (launch fields such as num_warps are covered); a process that imports
# these helpers declares them too (the tests' conftest.py does as well), so that entries it writes
# are entries such a reader serves.
import bridge.entries.metadata  # noqa: F401
from kernelcache.keys import META_EXT, split_entry_name

#: this folder (tests/helpers): on a child process's path, it imports these modules
HELPERS = Path(__file__).resolve().parent
#: the checkout
REPO = HELPERS.parent.parent


def key_of(*parts: object) -> str:
    """A valid cache key derived from ``parts``."""
    return hashlib.sha256(repr(parts).encode()).hexdigest()


def child_env(**extra: str) -> dict[str, str]:
    """The environment for a child Python process that imports this checkout."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KERNELCACHE_")}
    path = env.get("PYTHONPATH")
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + path if path else "")
    env.update(extra)
    return env


#: the user directories a test session points into its own temporary directory (the
#: variable, and the directory under it)
USER_DIRS = {
    "HOME": "home",
    "XDG_CACHE_HOME": "home/.cache",
    "XDG_CONFIG_HOME": "home/.config",
    "XDG_DATA_HOME": "home/.local/share",
    "XDG_STATE_HOME": "home/.local/state",
    "TRITON_HOME": "home",
}


def other_users_env(shared: Path, **extra: str) -> dict[str, str]:
    """:func:`child_env` for a process run as another user, who cannot enter the session's
    temporary directories: its ``TMPDIR`` and user directories are under ``shared/tmp`` (the
    ``shared_tmp`` fixture's), so what it makes there is removed with the test's."""
    tmp = Path(shared) / "tmp"
    env = child_env(TMPDIR=str(tmp), **{name: str(tmp / sub) for name, sub in USER_DIRS.items()})
    env.update(extra)
    return env


#: what a process that lowers calls must not import before it needs it: the remote tiers and
#: the size cap (for a cache that has neither), the cache's builds and the store's writes and
#: removals (a miss, a corrupt entry), the summary of the counters' logs, the operator's
#: commands and what only they use (a root's table of entries), and the bridge's commands,
#: warming and tuning
NOT_FOR_A_HIT = (
    "kernelcache.remote",
    "kernelcache.capacity",
    "kernelcache.cache.builds",
    "kernelcache.store.writing",
    "kernelcache.store.locks",  # (the writers' locks: imported by the first write)
    "kernelcache.store.removal",
    "kernelcache.stats.summary",
    "kernelcache.table",
    "kernelcache.cli",
    "kernelcache.bundle",
    "kernelcache.maintenance",
    "kernelcache.doctor",
    "bridge.cli",
    "bridge.warm",
    "bridge.tune",
    "bridge.compile.compiler_process",
)


def not_for_a_hit(modules: list[str]) -> list[str]:
    """The modules of ``modules`` that :data:`NOT_FOR_A_HIT` names (or that are inside one)."""
    return sorted(m for m in modules if any(m == n or m.startswith(n + ".") for n in NOT_FOR_A_HIT))


def run_py(code: str, *args: str, timeout: float = 120, **env: str) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter; raise with its output if it fails."""
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        env=child_env(**env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return checked(proc)


def checked(proc: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    """``proc`` if it succeeded; else an AssertionError showing its output."""
    if proc.returncode != 0:
        raise AssertionError(
            f"child failed ({proc.returncode})\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"
        )
    return proc


def metadata_keys(root: str | os.PathLike[str]) -> list[str]:
    """The keys of the metadata files a listing of ``root`` shows (none if it does not exist)."""
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return []
    return [parts[0] for parts in map(split_entry_name, names) if parts and parts[1] == META_EXT]


IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


def _probe(*cmd: str) -> bool:
    try:
        return subprocess.run(cmd, capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


#: private mount namespaces (root, or unprivileged user namespaces): real read-only and full filesystems
CAN_UNSHARE = sys.platform == "linux" and _probe(
    "unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt"
)
#: running as root and able to drop to an unprivileged user for permission tests
CAN_DROP_PRIVILEGES = IS_ROOT and _probe(
    "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "true"
)


#: running as root with a private mount namespace and setpriv: real users that share a group
CAN_SHARE = IS_ROOT and _probe(
    "unshare", "-m", "sh", "-c", "setpriv --reuid=65534 --regid=65534 --clear-groups true"
)
#: the group of such a shared root
SHARE_GID = 4242


def run_in_namespace(setup: str, code: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run shell ``setup`` (mounts) then Python ``code`` inside a private mount namespace."""
    script = f'set -e\n{setup}\nexec {sys.executable} -c "$KC_CODE"'
    env = child_env(KC_CODE=textwrap.dedent(code))
    proc = subprocess.run(
        ["unshare", "-rm", "sh", "-c", script],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return checked(proc)


def run_on_a_terminal(
    argv: list[str], timeout: float = 240, stdout: Any = None, **env: str
) -> tuple[int, str]:
    """Run ``argv`` with stderr (and stdout, unless ``stdout`` is a file to write it to) on a
    pseudo-terminal (100 columns); returns (exit code, everything the terminal showed)."""
    import fcntl
    import pty
    import select
    import struct
    import termios

    primary, secondary = pty.openpty()
    fcntl.ioctl(secondary, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 100, 0, 0))
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=secondary if stdout is None else stdout,
        stderr=secondary,
        env=child_env(COLUMNS="100", **env),
        cwd=str(REPO),
    )
    os.close(secondary)
    chunks = []
    while True:
        ready, _, _ = select.select([primary], [], [], 0.5)
        if ready:
            try:
                data = os.read(primary, 65536)
            except OSError:  # EIO: the terminal's other side closed
                break
            if not data:
                break
            chunks.append(data)
        elif proc.poll() is not None:
            break
    os.close(primary)
    return proc.wait(timeout=timeout), b"".join(chunks).decode(errors="replace")
