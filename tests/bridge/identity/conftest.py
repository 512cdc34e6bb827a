"""Fixtures of the identity tests: the child processes a test's instances for each target
share (:mod:`target_runs`): ``runs`` is the current test's."""

from __future__ import annotations

import pytest
from target_runs import SharedRuns, TestRuns, runs_of


@pytest.fixture(scope="module")
def shared_runs(tmp_path_factory: pytest.TempPathFactory) -> SharedRuns:
    return SharedRuns(tmp_path_factory.mktemp("runs"))


@pytest.fixture
def runs(shared_runs: SharedRuns, request: pytest.FixtureRequest) -> TestRuns:
    return runs_of(shared_runs, request)
