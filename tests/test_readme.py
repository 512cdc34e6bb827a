"""The README stays true: its commands are the ones CI runs, its tables match the code."""

from __future__ import annotations

import re

from conftest import REPO

import bridge  # noqa: F401  (declares the bridge's variables)
from kernelcache.config import variables

README = (REPO / "README.md").read_text()


def _commands() -> list[str]:
    block = re.search(r"```bash\n(.*?)```", README, re.S)
    assert block and README.index(block.group(0)) < 200, "the README must open with its commands"
    return [line for line in block.group(1).splitlines() if line and not line.startswith("#")]


def test_readme_opens_with_setup_and_test_commands():
    setup, test = _commands()
    assert "pip install" in setup and "kernelcache warm" in setup and "kernelcache stats" in setup
    assert test == "bash scripts/test.sh"


def test_ci_runs_exactly_the_readme_test_command():
    ci = (REPO / ".ci" / "run").read_text().splitlines()
    assert _commands()[1] in ci


def test_the_configuration_table_is_the_declared_variables():
    rows = [line for line in README.splitlines() if line.startswith("| `KERNELCACHE_")]
    documented = {row.split("`")[1]: row for row in rows}
    declared = variables()
    assert sorted(documented) == sorted(var.name for var in declared), "one row per variable"
    for var in declared:
        cells = [c.strip() for c in documented[var.name].strip("|").split("|")]
        assert cells == [f"`{var.name}`", var.meaning, var.shown_default], var.name


def test_documented_files_exist():
    for link in re.findall(r"\]\((docs/[^)#]+)\)", README):
        assert (REPO / link).is_file(), link


def test_layout_names_every_module():
    layout = README[README.index("## Layout") :]
    end = layout.find("\n## ", 1)
    layout = layout if end < 0 else layout[:end]
    for package in ("kernelcache", "bridge"):
        for path in sorted((REPO / package).rglob("*.py")):
            rel = path.relative_to(REPO / package)
            if rel.name in ("__init__.py", "__main__.py"):
                continue
            names = [f"`{rel.name}`", *(f"`{part}/`" for part in rel.parent.parts)]
            assert all(n in layout for n in names), (
                f"{package}/{rel} is not described in README.md's Layout section: add it there"
            )


def test_the_documented_format_and_stats_fields_are_the_real_ones():
    """The README's entry format is the one written, and its stats JSON table names each
    field once, every counter among them."""
    from kernelcache.schema import FORMAT_VERSION
    from kernelcache.stats.counters import COUNTERS

    assert f"`format` ({FORMAT_VERSION})" in README
    assert f"The format is {FORMAT_VERSION}" in README
    assert "format stays" not in README
    start = README.index("| `root`, `exists` |")
    table = README[start : README.index("\n\n", start)]
    rows = re.findall(r"^\| (`[^|]*`) \| ", table, re.M)
    names = [n for row in rows for n in re.findall(r"`([a-z_]+)`", row)]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
    (counters,) = [
        line for line in README.splitlines() if line.startswith("| `counters` | sums over")
    ]
    missing = [c for c in COUNTERS if f"`{c}`" not in counters]
    assert not missing, missing


def test_the_tests_set_up_their_own_environment():
    """The main job's set-up (step 1) and the tests' (step 2) do not share an environment, so
    the tests' pinned Triton never replaces step 1's (and a re-run of step 1 compiles
    nothing); CI lints in the tests' environment."""
    step1 = README.split("```bash", 1)[1].split("```", 1)[0]
    (main_env,) = set(re.findall(r"python3 -m venv (\S+)", step1))
    script = (REPO / "scripts" / "test.sh").read_text()
    (test_env,) = re.findall(r"venv=\$\{VENV:-([^}]+)\}", script)
    assert test_env != main_env, (main_env, test_env)
    ci = (REPO / ".ci" / "run").read_text()
    assert f"{test_env}/bin/ruff check" in ci and f"{test_env}/bin/mypy" in ci
