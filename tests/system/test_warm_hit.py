"""A warm hit's walk, measured by scripts/warm_hit.py: a fresh process lowering one call the
cache already holds runs code in at most ``BOUND`` project modules, compiles nothing (the
script fails when the second process wrote a kernel binary), and has imported none of what only
a miss, the operator's commands or a remote tier need."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

from support import REPO, child_env, not_for_a_hit

SCRIPT = REPO / "scripts" / "warm_hit.py"


def _bound() -> int:
    spec = importlib.util.spec_from_file_location("warm_hit", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.BOUND


def test_a_warm_hit_runs_code_in_at_most_the_bound_of_project_modules(tmp_path):
    out = tmp_path / "warm_hit.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--json", str(out)],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    measured = json.loads(out.read_text())
    assert 0 < measured["count"] <= _bound(), measured["modules"]
    assert "bridge.api" in measured["modules"], "the probe did not see the call"
    assert not_for_a_hit(measured["loaded"]) == [], "a warm hit imported what only a miss needs"
