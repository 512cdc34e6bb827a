"""Whether the process holding a lock is alive on this host (a zombie counts as gone)."""

from __future__ import annotations

import os

MAX_PID = 1 << 22


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists on this host (a pid read from a file is
    untrusted: anything but a plausible pid is no live process)."""
    if type(pid) is not int or not 0 < pid <= MAX_PID:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return not _exited(pid)


def _exited(pid: int) -> bool:
    """Whether the process ``pid`` has exited and waits to be reaped (a zombie): it holds no
    lock and will never refresh one. False where /proc cannot tell."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read(4096).rpartition(b")")[2].split()[:1]
    except OSError:
        return False
    return state in ([b"Z"], [b"X"])
