"""A census of open kernels: which kernels a pytest run specializes are open, and why.

A pytest plugin, not a test module (the project's test run collects only ``tests/``). It wraps
:func:`bridge.identity.specialize.specialize`, through which every lowering, warm plan and
explain keys a kernel, and records for each specialization made in the test process (xdist
workers included): the kernel (``module:qualname``), its language, the target, whether it is
open and why, whether it has no key at all (its frontend fails) and the test file it ran in. At
the end it writes them as JSON and prints a table: distinct kernels (by qualified name)
specialized, exact, open (with each distinct reason) and the open ones, kernel by kernel.

    PYTHONPATH=scripts .venv-test/bin/python -m pytest -p no:cacheprovider -n 0 \\
        -p open_census --census-out census.json tests/bridge/lowering/test_lowering.py ...

(``-p scripts.open_census`` works too from the repository root.)
"""

from __future__ import annotations

import functools
import json
import os
import sys
from collections import Counter, defaultdict
from typing import Any

import pytest

#: (kernel, language, target, why open or None, stored, test file) -> specializations
_seen: Counter[tuple[Any, ...]] = Counter()
FIELDS = ("kernel", "language", "target", "open", "stored", "test")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.getgroup("open census").addoption(
        "--census-out", default="open_census.json", help="where the census is written (JSON)"
    )


def pytest_configure(config: pytest.Config) -> None:
    from bridge.identity import specialize as module

    original = module.specialize
    if getattr(original, "census", False):
        return

    @functools.wraps(original)
    def specialize(parts: Any, *args: Any, **kwargs: Any) -> Any:
        spec = original(parts, *args, **kwargs)
        test = os.environ.get("PYTEST_CURRENT_TEST", "").split("::")[0]
        _seen[(parts.qualname, parts.language, str(spec.target), spec.open, spec.stored, test)] += 1
        return spec

    specialize.census = True  # type: ignore[attr-defined]
    # modules that imported the function by name before this ran (bridge.warm.planning, ...)
    for mod in list(sys.modules.values()):
        if getattr(mod, "specialize", None) is original:
            mod.specialize = specialize  # type: ignore[union-attr]
    module.specialize = specialize


def _rows() -> list[dict[str, Any]]:
    return [{**dict(zip(FIELDS, k, strict=True)), "count": n} for k, n in sorted(_seen.items())]


def pytest_sessionfinish(session: pytest.Session) -> None:
    config = session.config
    if hasattr(config, "workerinput"):  # an xdist worker: its controller writes
        config.workeroutput["open_census"] = _rows()  # type: ignore[attr-defined]
        return
    kernels = _kernels()
    with open(config.getoption("census_out"), "w") as f:
        json.dump({"kernels": kernels, "specializations": _rows()}, f, indent=1)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    for row in getattr(node, "workeroutput", {}).get("open_census", []):
        _seen[tuple(row[f] for f in FIELDS)] += row["count"]


def _kernels() -> dict[str, dict[str, Any]]:
    """Each kernel: its language, targets, test files, reasons it was open, whether keyless."""
    out: dict[str, dict[str, Any]] = defaultdict(
        lambda: {"language": None, "targets": set(), "tests": set(), "open": set(), "exact": 0}
    )
    for (kernel, language, target, why, stored, test), n in _seen.items():
        k = out[kernel]
        k["language"] = language
        k["targets"].add(target)
        k["tests"].add(test)
        if why is None:
            k["exact"] += n
        else:
            k["open"].add(why if stored else f"NO KEY: {why}")
    return {
        name: {f: sorted(v) if isinstance(v, set) else v for f, v in k.items()}
        for name, k in sorted(out.items())
    }


def _short(why: str, width: int = 150) -> str:
    return why if len(why) <= width else why[: width - 3] + "..."


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if hasattr(terminalreporter.config, "workerinput"):
        return
    kernels = _kernels()
    opened = {name: k for name, k in kernels.items() if k["open"]}
    reasons = Counter(_short(why) for k in opened.values() for why in k["open"])
    write = terminalreporter.write_line
    terminalreporter.section("open census")
    write(f"kernels specialized: {len(kernels)}")
    write(f"exact: {len(kernels) - len(opened)}")
    write(f"open: {len(opened)} (of them exact in other specializations: "
          f"{sum(1 for k in opened.values() if k['exact'])})")  # fmt: skip
    for why, n in reasons.most_common():
        write(f"  {n:4}  {why}")
    for name, k in opened.items():
        write(f"{name} [{k['language']}] in {', '.join(k['tests'])}")
        for why in k["open"]:
            write(f"    {_short(why, 300)}")
