"""This process as others sharing a root see it, and what it has already told its user.

* :data:`HOST`: the host name as it appears in file names and lock records written under a
  root (staging files, statistics logs, soft locks, hand-off directories, Redis lock tokens):
  letters, digits, ``-``, ``_`` and ``.``, anything else replaced by ``_``, at most 64
  characters. Every writer and reader uses this one label, so "is this mine / this host's?"
  has one answer.
* :func:`warn_once`: a warning logged the first time its key comes up in this process
  (thread-safe). Failures of the cache are warned about once, not on every kernel.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Hashable


def host_label(name: str) -> str:
    """``name`` made safe for file names under a root (see :data:`HOST`)."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:64] or "_"


HOST = host_label(socket.gethostname())

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
