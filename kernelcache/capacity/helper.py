"""The helper processes that run eviction passes beside the processes that put.

A process starts one helper per capped cache at its first pass (``python -c``
:data:`HELPER_CODE`, which runs :func:`kernelcache.capacity.size_cap.helper_main`), asks it
for passes through its standard input, one line each, and reads one report line per request.
A helper ends when its standard input closes: at the process's exit or death. Where no helper
can be started, or one failed, :data:`no_helpers_since` says why, and passes run in a thread.
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import os
import subprocess
import sys
import threading
import weakref
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)

#: what a helper process runs: ``helper_main`` with the cap's settings as JSON
HELPER_CODE = (
    "import sys\nfrom kernelcache.capacity.size_cap import helper_main\nhelper_main(sys.argv[1])"
)
#: why helper processes cannot be started here (passes then run in threads), once known
no_helpers_since: str | None = None
#: the helpers this process started (closed at exit)
_helpers: weakref.WeakSet[Helper] = weakref.WeakSet()
#: set at exit: helpers that end then are not failures
_exiting = False


class Helper:
    """The helper process of one cap in one process: asked for passes through its standard
    input, one line each; it answers each with a report line, handed to ``on_report`` (which
    says whether the line was a report, and may ask again). It ends when its standard input closes (this process
    exited, or was killed)."""

    def __init__(self, config: dict[str, Any], on_report: Callable[[bytes], bool]) -> None:
        here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, (here, env.get("PYTHONPATH"))))
        self.proc = subprocess.Popen(
            [sys.executable, "-c", HELPER_CODE, json.dumps(config)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,  # (read as it comes: a full pipe would stop the helper)
            env=env,
            cwd="/",
        )
        self.root: str = config["root"]
        self.on_report = on_report
        self.pid = os.getpid()
        self.alive = True
        #: set while no pass was asked for that has not been reported; the requests not yet
        #: reported (one may be asked while its report is taken up)
        self.idle = threading.Event()
        self.idle.set()
        self._unanswered = 0
        self._counting = threading.Lock()
        threading.Thread(target=self._watch, name="kernelcache-evict-helper", daemon=True).start()
        _helpers.add(self)

    def ask(self) -> bool:
        """Ask for the passes now due; whether the helper took the request."""
        stdin = self.proc.stdin
        assert stdin is not None
        self._count(+1)
        try:
            stdin.write(b"pass\n")
            stdin.flush()
        except (OSError, ValueError):  # it ended: the watcher says why
            self._count(-1)
            return False
        return True

    def _count(self, change: int) -> None:
        """Count a request asked (+1) or reported (-1); idle when none is left unreported."""
        with self._counting:
            self._unanswered = max(0, self._unanswered + change)
            if self._unanswered:
                self.idle.clear()
            else:
                self.idle.set()

    def _watch(self) -> None:
        """Read the helper's reports until it ends; then mark it gone, and say why."""
        stdout = self.proc.stdout
        assert stdout is not None
        said: collections.deque[bytes] = collections.deque(maxlen=8)  # what else it wrote
        for line in stdout:
            if self.on_report(line):
                self._count(-1)
            else:
                said.append(line[-300:])
        status = self.proc.wait()
        if status != 0 and not _exiting:  # (said before it is seen gone: no new helper then)
            tail = b"".join(said).decode(errors="replace").strip()[-300:]
            no_helpers(self.root, f"a helper ended with status {status}: {tail}")
        self.alive = False
        self.idle.set()

    def close(self) -> None:
        """Let the helper end (after the pass it runs, if any)."""
        with contextlib.suppress(OSError, ValueError):
            if self.proc.stdin is not None:
                self.proc.stdin.close()


def no_helpers(root: str, why: object) -> None:
    """Run passes in threads from now on: helper processes cannot be started, or failed."""
    global no_helpers_since
    no_helpers_since = str(why)
    logger.info(
        "kernelcache: eviction passes for %s run in a thread: no helper process (%s)", root, why
    )


def close_all() -> None:
    """At exit: let every helper this process started end (their ends are not failures)."""
    global _exiting
    _exiting = True
    for helper in list(_helpers):
        if helper.pid == os.getpid():
            helper.close()
