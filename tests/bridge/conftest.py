"""Fixtures of the bridge's tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def assembled(monkeypatch):
    """The bridge's lowerings built from kernel entries, one item each (a lowering replayed
    from a lowering or program entry adds none)."""
    from bridge.lowering import configs

    seen: list[int] = []
    real = configs.assemble
    monkeypatch.setattr(configs, "assemble", lambda *a, **k: seen.append(1) or real(*a, **k))
    return seen
