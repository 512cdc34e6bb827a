"""This process as others sharing a root see it, and what it has already told its user.

* :data:`HOST`: the host name as it appears in file names and lock records written under a
  root (staging files, statistics logs, soft locks, hand-off directories, Redis lock tokens):
  letters, digits, ``-``, ``_`` and ``.``, anything else replaced by ``_``, at most 64
  characters. Every writer and reader uses this one label, so "is this mine / this host's?"
  has one answer.
* :func:`pid_alive`: whether a process of this host named in such a record (a lock holder, a
  hand-off directory's owner) is alive; a zombie counts as gone, and a pid no process can have
  as no live process.
* :func:`warn_once`: a warning logged the first time its key comes up in this process
  (thread-safe). Failures of the cache are warned about once, not on every kernel.
* :func:`printable`: text from others (names in a shared root, a server's error) made safe
  to print on the user's terminal or log.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Hashable


def host_label(name: str) -> str:
    """``name`` made safe for file names under a root (see :data:`HOST`)."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:64] or "_"


HOST = host_label(socket.gethostname())

#: the largest pid a process can have (Linux's PID_MAX_LIMIT)
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


_warned: set[Hashable] = set()
_lock = threading.Lock()


def warn_once(log: logging.Logger, key: Hashable, message: str, *args: object) -> bool:
    """Log ``message % args`` at WARNING the first time ``key`` is seen in this process.

    Returns whether it was logged now.
    """
    with _lock:
        if key in _warned:
            return False
        _warned.add(key)
    log.warning(message, *args)
    return True


def printable(text: str) -> str:
    """``text`` safe to print on a terminal: control characters (escape sequences, newlines,
    carriage returns, ...) are shown escaped, as ``\\x1b`` or ``\\n``. Names read from a
    shared root and what a server says are untrusted: they must not redraw the screen or
    forge output lines."""
    if text.isprintable():
        return text
    return "".join(
        c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text
    )
