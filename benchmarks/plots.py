"""The plots of the headline benchmarks (docs/benchmarks.md), made from the results the
benchmark scripts wrote (``benchmarks/results/``), as SVG files in ``docs/img/benchmarks/``:

- ``warm-start.svg``: a fresh process's lowering and whole run against jax-triton 0.3.1 and
  0.4.1, on an H200 (``warm_start.py``; the medians of the per-process lines of its log, as
  ``RESULTS.md`` computes them: the run stopped before its JSON summary);
- ``cold-job.svg``: a wave of 8 workers starting at once on a cold kernel cache
  (``job_start.py``), against the bridge before work stealing and both jax-triton releases;
- ``warm-lowering.svg``: the first lowering of a fresh process with every kernel cached,
  against JAX's own lowering of the same program (the floor; ``warm_lowering.py``);
- ``prune-100k.svg``: ``stats``, the prune plan and a real prune at 100,000 entries, against
  plain Python walks and ``unlink`` (``cli_scale.py``).

``python benchmarks/plots.py`` writes them again (``--out DIR``: elsewhere);
tests/system/test_benchmark_plots.py checks that the committed files are what this script
makes of the committed results. The output is byte-stable for one matplotlib release (the one
pyproject's test extra pins): no date, fixed element ids, text kept as text.

To plot a newer run, point :data:`SOURCES` at its file and write the plots again.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def _missing_matplotlib() -> str:
    """What to say where matplotlib is not installed: the release the committed plots were
    made with (the test extra's pin) and how to install it."""
    pinned = re.search(r'"(matplotlib==[\d.]+)', (HERE.parent / "pyproject.toml").read_text())
    wanted = pinned.group(1) if pinned else "matplotlib"
    return (
        f"benchmarks/plots.py draws with matplotlib, which is not installed here: pip install "
        f"'{wanted}' (the release the committed plots were made with; the test extra, "
        "pip install -e '.[test]', installs it too)"
    )


try:
    import matplotlib
except ModuleNotFoundError as e:  # said plainly, as a command does, not as a traceback
    if e.name != "matplotlib":
        raise
    raise SystemExit(_missing_matplotlib()) from None

matplotlib.use("svg")
import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)
from matplotlib.figure import Figure  # noqa: E402

RESULTS = HERE / "results"
OUT = HERE.parent / "docs" / "img" / "benchmarks"

#: each plot -> the result files it is made from (the runs the headline figures cite)
SOURCES: dict[str, tuple[str, ...]] = {
    "warm-start": ("warm_start-h200-two-peers.log",),
    "cold-job": ("job_start-h200-autotune.json",),
    "warm-lowering": ("warm_lowering-cpu311-run5.json", "warm_lowering-h200-run10.json"),
    "prune-100k": ("cli_scale-cpu2-tmpfs.json", "cli_scale-cpu2-ext4.json"),
}

#: the bridge's colour, and the others'
OURS, THEIRS, OLDER = "#2f6f9f", "#c9792b", "#9a9a9a"
STYLE = {
    "svg.fonttype": "none",  # text as text: no glyph outlines, readable and searchable
    "svg.hashsalt": "kernelcache-benchmarks",  # fixed ids: the same file each time
    "font.family": "DejaVu Sans",
    "font.size": 10,
    "axes.spines.top": False,
    "axes.spines.right": False,
}

#: a per-process line of warm_start.py's log
_WARM_LINE = re.compile(
    r"^\s+(small|large) (.+?)\s+import=([\d.]+) lower=([\d.]+) compile=([\d.]+) "
    r"first_call=([\d.]+)"
)


def _json(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((RESULTS / name).read_text())
    return data


def warm_start_medians(log: str) -> dict[tuple[str, str], dict[str, float]]:
    """(model, state) -> the median of each phase over its processes, and ``total`` (their
    sum), from the per-process lines of a warm_start.py log."""
    samples: dict[tuple[str, str], list[list[float]]] = {}
    for line in log.splitlines():
        m = _WARM_LINE.match(line)
        if m:
            samples.setdefault((m[1], m[2]), []).append([float(m[i]) for i in range(3, 7)])
    medians = {}
    for key, rows in samples.items():
        columns = zip(*rows, strict=True)
        phases = dict(
            zip(
                ("import", "lower", "compile", "first_call"),
                map(statistics.median, columns),
                strict=True,
            )
        )
        medians[key] = {**phases, "total": sum(phases.values())}
    return medians


def _bars(ax: Any, labels: list[str], values: list[float], colors: list[str], fmt: str) -> None:
    """Horizontal bars, top to bottom, each labelled with its value."""
    ys = list(range(len(values)))[::-1]
    ax.barh(ys, values, color=colors, height=0.6)
    ax.set_yticks(ys, labels)
    for y, v in zip(ys, values, strict=True):
        ax.annotate(fmt.format(v), (v, y), xytext=(4, 0), textcoords="offset points", va="center")
    ax.margins(x=0.18)


def plot_warm_start() -> Figure:
    medians = warm_start_medians((RESULTS / SOURCES["warm-start"][0]).read_text())
    states = [
        ("bridge, kc warm, jax warm", "bridge (kernel cache warm)", OURS),
        ("jax-triton-0.3.1, JAX cache warm", "jax-triton 0.3.1", THEIRS),
        ("jax-triton-0.4.1, JAX cache warm", "jax-triton 0.4.1", THEIRS),
    ]
    fig, axes = plt.subplots(2, 2, figsize=(9, 4.4), sharey="row")
    for row, model in enumerate(("small", "large")):
        for col, (phase, title) in enumerate((("lower", "lowering"), ("total", "whole process"))):
            ax = axes[row][col]
            values = [medians[(model, state)][phase] for state, _, _ in states]
            _bars(ax, [name for _, name, _ in states], values, [c for *_, c in states], "{:.3f} s")
            variants = "5 variants" if model == "small" else "21 variants"
            ax.set_title(f"{model} model ({variants}): {title}, s", fontsize=10)
    fig.suptitle("A fresh process, JAX's cache warm: the bridge against jax-triton (H200)")
    fig.tight_layout()
    return fig


def plot_cold_job() -> Figure:
    waves = _json(SOURCES["cold-job"][0])["waves"]
    rows = [
        ("bridge cold", "bridge (work stealing)", OURS),
        ("before cold", "bridge before work stealing", OLDER),
        ("jax-triton-0.3.1 cold", "jax-triton 0.3.1", THEIRS),
        ("jax-triton-0.4.1 cold", "jax-triton 0.4.1", THEIRS),
    ]
    fig, axes = plt.subplots(1, 2, figsize=(9, 2.8), sharey=True)
    for ax, (field, title) in zip(
        axes,
        (("wall_s", "the wave's wall time, s"), ("lower", "lowering, median worker, s")),
        strict=True,
    ):
        values = [
            waves[w]["wall_s"] if field == "wall_s" else waves[w]["phases_median_s"]["lower"]
            for w, _, _ in rows
        ]
        _bars(ax, [name for _, name, _ in rows], values, [c for *_, c in rows], "{:.1f} s")
        ax.set_title(title, fontsize=10)
    fig.suptitle("8 workers start at once on a cold kernel cache (H200, 24 autotuned variants)")
    fig.tight_layout()
    return fig


def plot_warm_lowering() -> Figure:
    machines = [
        (SOURCES["warm-lowering"][0], "2-core CPU machine, Python 3.11"),
        (SOURCES["warm-lowering"][1], "H200's host, Python 3.12"),
    ]
    fig, axes = plt.subplots(1, 2, figsize=(9, 2.8))
    for ax, (name, title) in zip(axes, machines, strict=True):
        run = _json(name)
        labels, values, colors = [], [], []
        for model in ("small", "large"):
            now = run["results"]["now"][model]["median_ms"]
            floor = run["results"]["floor"][model]["median_ms"]
            labels += [f"{model}: bridge ({now / floor:.2f}x)", f"{model}: JAX's own (floor)"]
            values += [now, floor]
            colors += [OURS, OLDER]
        _bars(ax, labels, values, colors, "{:.1f} ms")
        ax.set_title(title, fontsize=10)
    fig.suptitle("Warm lowering, every kernel cached, against the same program's plain FFI calls")
    fig.tight_layout()
    return fig


def plot_prune() -> Figure:
    files = [
        (SOURCES["prune-100k"][0], "tmpfs"),
        (SOURCES["prune-100k"][1], "ext4"),
    ]
    steps = [
        ("stats", "stats"),
        ("prune_plan", "prune plan"),
        ("prune_real", "prune half"),
    ]
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.2), sharey=True)
    for ax, (name, title) in zip(axes, files, strict=True):
        run = _json(name)
        labels, values, colors = [], [], []
        for field, step in steps:
            labels += [f"{step}: kernelcache", f"{step}: a plain walk"]
            values += [run["seconds"][field], run["peer_seconds"][field]]
            colors += [OURS, OLDER]
        _bars(ax, labels, values, colors, "{:.1f} s")
        ax.set_title(f"{title}, seconds", fontsize=10)
    entries = _json(files[0][0])["entries"]
    fig.suptitle(
        f"The command line on {entries:,} entries (2 CPUs), against a plain walk\n"
        "(parse and stat every entry; unlink without locks)"
    )
    fig.tight_layout()
    return fig


#: each plot's name -> what draws it
PLOTS: dict[str, Callable[[], Figure]] = {
    "warm-start": plot_warm_start,
    "cold-job": plot_cold_job,
    "warm-lowering": plot_warm_lowering,
    "prune-100k": plot_prune,
}


def write(out: Path) -> list[Path]:
    """Write every plot into ``out``; the files written."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    with plt.rc_context(STYLE):
        for name, draw in PLOTS.items():
            fig = draw()
            path = out / f"{name}.svg"
            fig.savefig(path, format="svg", metadata={"Date": None})
            plt.close(fig)
            written.append(path)
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=OUT, help=f"where to write (default {OUT})")
    args = parser.parse_args()
    for path in write(args.out):
        print(path)


if __name__ == "__main__":
    main()
