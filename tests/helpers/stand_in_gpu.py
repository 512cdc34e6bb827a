"""GPUs played by a table: a measurer (``bridge.tune.measure.use``) whose configs take the
seconds a table says, on named lanes, recording every launch (and, with ``log``, each timing
as two lines ``pid lane index begin|end seconds`` in a file shared by processes)."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence

from bridge.exceptions import Unlaunchable


class TableMeasurer:
    """``times[i]``: seconds per launch of config i (None: it cannot be launched)."""

    def __init__(
        self,
        times: Sequence[float | None],
        lanes: Sequence[str] = ("stand-in/gpu0",),
        *,
        kind: str = "Stand-in GPU",
        sleep: float = 0.0,
        log: str | None = None,
    ) -> None:
        self.times, self.lanes, self.kind = list(times), list(lanes), kind
        self.sleep, self.log = sleep, log
        self.benched: list[list[int]] = []
        self.runs: list[tuple[int, int, int]] = []  # (index, launches, lane)

    def device(self, target, platform):
        return self.kind

    def bench(self, call, opaque, indices, platform, gpus=1):
        self.benched.append(list(indices))
        return TableBench(self, self.lanes[:gpus])


class TableBench:
    def __init__(self, measurer: TableMeasurer, lanes: Sequence[str]) -> None:
        self.measurer, self.lanes = measurer, list(lanes)

    def run(self, index: int, launches: int, lane: int) -> float:
        m = self.measurer
        m.runs.append((index, launches, lane))
        self._log(index, lane, "begin")
        if m.sleep:
            time.sleep(m.sleep)
        self._log(index, lane, "end")
        seconds = m.times[index]
        if seconds is None:
            raise Unlaunchable(f"the stand-in cannot launch config {index}")
        return seconds * launches

    def _log(self, index: int, lane: int, what: str) -> None:
        if self.measurer.log:
            with open(self.measurer.log, "a") as f:
                f.write(f"{os.getpid()} {self.lanes[lane]} {index} {what} {time.time()}\n")


def read_log(path) -> list[tuple[int, str, int, str, float]]:
    """The lines of a ``log``: (pid, lane, index, "begin" or "end", seconds)."""
    found = []
    for line in open(path).read().splitlines():
        pid, lane, index, what, at = line.split()
        found.append((int(pid), lane, int(index), what, float(at)))
    return found
