"""Child processes shared by the instances of a test run once per target
(:data:`identity_targets.TARGETS`): a child lowers for every target in one process start
(its code reads the targets as JSON from ``KC_TARGETS`` and prints one document keyed by
target), and the instance of the test for another target is answered from the same runs.

A test's instances make the same calls in the same order (only their target differs), so the
n-th run an instance asks for is the n-th run of the first instance that asked: the arguments
must be the same, and the roots and sources the runs use are in a folder the instances share
(:attr:`TestRuns.dir`), never in an instance's own ``tmp_path``."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from bridge_helpers import run_child
from identity_targets import TARGETS


class TestRuns:
    """The runs of one test (all its instances but for the target): :meth:`child`, and the
    folder :attr:`dir` they share."""

    __test__ = False  # (not a test class, whatever its name)

    def __init__(self, folder: Path) -> None:
        self.dir = folder
        self.dir.mkdir(parents=True, exist_ok=True)
        self._runs: list[tuple[str, Any]] = []
        self._asked = 0

    def begin(self) -> TestRuns:
        """Start an instance: its first :meth:`child` is the first run again."""
        self._asked = 0
        return self

    def child(
        self, code: str, *argv: str, targets: tuple[str, ...] = TARGETS, **env: str
    ) -> dict[str, Any]:
        """Run ``code`` (:func:`bridge_helpers.run_child`) with ``targets`` (every one unless
        told) in ``KC_TARGETS``, or give what the same call of an earlier instance gave: its
        document, by target."""
        call = json.dumps([code, list(argv), list(targets), sorted(env.items())])
        n, self._asked = self._asked, self._asked + 1
        if n < len(self._runs):
            made, found = self._runs[n]
            assert made == call, "an instance of the test asked for other runs than the first"
            return found
        found = run_child(code, *argv, KC_TARGETS=json.dumps(list(targets)), **env)
        assert sorted(found) == sorted(targets), f"the child did not lower for each target: {found}"
        self._runs.append((call, found))
        return found


class SharedRuns:
    """The runs of a module's tests (a module-scoped fixture holds one), by test."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self._tests: dict[str, TestRuns] = {}

    def of(self, name: str, params: dict[str, Any]) -> TestRuns:
        """The runs of test ``name`` given ``params`` (its parameters but the target)."""
        key = json.dumps([name, sorted((k, repr(v)) for k, v in params.items())])
        if key not in self._tests:
            tag = hashlib.sha256(key.encode()).hexdigest()[:8]
            self._tests[key] = TestRuns(self.base / f"{name[:40]}-{tag}")
        return self._tests[key].begin()


def runs_of(shared: SharedRuns, request: Any) -> TestRuns:
    """The runs of the test ``request`` is for (a pytest ``FixtureRequest``), shared by its
    instances for each target."""
    spec = getattr(request.node, "callspec", None)
    params = {k: v for k, v in (spec.params if spec else {}).items() if k != "target"}
    return shared.of(request.node.originalname, params)
