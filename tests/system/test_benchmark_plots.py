"""The plots of docs/benchmarks.md are what benchmarks/plots.py makes of the committed results:
made again, byte for byte, and showing the numbers of the files they name."""

from __future__ import annotations

import importlib.metadata
import json
import re
import subprocess
import sys

import pytest
from support import REPO, child_env

PLOTS = REPO / "docs" / "img" / "benchmarks"
RESULTS = REPO / "benchmarks" / "results"


def _pinned() -> str:
    """The matplotlib release the test extra pins (the committed plots were made with it)."""
    found = re.search(r'"matplotlib==([\d.]+)', (REPO / "pyproject.toml").read_text())
    assert found, "pyproject's test extra pins matplotlib"
    return found.group(1)


def _installed() -> str | None:
    try:
        return importlib.metadata.version("matplotlib")
    except importlib.metadata.PackageNotFoundError:
        return None


pytestmark = pytest.mark.skipif(
    _installed() != _pinned(),
    reason=f"the plots are made with matplotlib {_pinned()} (the test extra's), not installed here",
)


def test_the_committed_plots_are_made_again_byte_for_byte(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "plots.py"), "--out", str(tmp_path)],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    made = {p.name: p.read_bytes() for p in tmp_path.glob("*.svg")}
    committed = {p.name: p.read_bytes() for p in PLOTS.glob("*.svg")}
    assert (
        set(made)
        == set(committed)
        == {
            "warm-start.svg",
            "cold-job.svg",
            "warm-lowering.svg",
            "prune-100k.svg",
        }
    )
    for name, data in made.items():
        assert data == committed[name], (
            f"docs/img/benchmarks/{name} is not what benchmarks/plots.py makes of the results: "
            "run `python benchmarks/plots.py` and commit the plots"
        )


def _text(name: str) -> str:
    return (PLOTS / name).read_text()


def test_the_plots_show_the_numbers_of_their_results():
    job = json.loads((RESULTS / "job_start-h200-autotune.json").read_text())["waves"]
    for wave in ("bridge cold", "before cold", "jax-triton-0.3.1 cold", "jax-triton-0.4.1 cold"):
        assert f">{job[wave]['wall_s']:.1f} s<" in _text("cold-job.svg"), wave
    for name in ("warm_lowering-cpu311-run5.json", "warm_lowering-h200-run10.json"):
        run = json.loads((RESULTS / name).read_text())
        for model in ("small", "large"):
            for impl in ("now", "floor"):
                ms = run["results"][impl][model]["median_ms"]
                assert f">{ms:.1f} ms<" in _text("warm-lowering.svg"), (name, model, impl)
            assert f"({run['over_floor']['now'][model]:.2f}x)" in _text("warm-lowering.svg")
    for name in ("cli_scale-cpu2-tmpfs.json", "cli_scale-cpu2-ext4.json"):
        run = json.loads((RESULTS / name).read_text())
        for step in ("stats", "prune_plan", "prune_real"):
            for seconds in (run["seconds"][step], run["peer_seconds"][step]):
                assert f">{seconds:.1f} s<" in _text("prune-100k.svg"), (name, step)
    # the headline's warm lowering (RESULTS.md's medians of the run's per-process lines)
    for seconds in ("0.037", "2.893", "2.688", "0.076", "4.890", "6.261"):
        assert f">{seconds} s<" in _text("warm-start.svg"), seconds


def test_the_benchmarks_page_shows_every_plot():
    page = (REPO / "docs" / "benchmarks.md").read_text()
    for plot in PLOTS.glob("*.svg"):
        assert f"](img/benchmarks/{plot.name})" in page, plot.name
