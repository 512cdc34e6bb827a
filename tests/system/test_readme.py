"""The README stays a true front page: it opens with the commands CI runs, sets up environments
that do not share a compiler, and stays short (the manual is docs/, see tests/system/test_docs.py)."""

from __future__ import annotations

import re

from support import REPO

README = (REPO / "README.md").read_text()
#: the most lines the front page may have
MAX_LINES = 230


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


def test_the_readme_is_a_front_page():
    lines = len(README.splitlines())
    assert lines <= MAX_LINES, f"README.md has {lines} lines: move the details into docs/"
    assert "source .venv/bin/activate" in README  # how its examples find `kernelcache`


def test_the_tests_set_up_their_own_environment():
    """The main job's set-up (step 1) and the tests' (step 2) do not share an environment, so
    the tests' pinned Triton never replaces step 1's (and a re-run of step 1 compiles
    nothing); CI lints, and builds the documentation strictly, in the tests' environment."""
    step1 = README.split("```bash", 1)[1].split("```", 1)[0]
    (main_env,) = set(re.findall(r"python3 -m venv (\S+)", step1))
    script = (REPO / "scripts" / "test.sh").read_text()
    (test_env,) = re.findall(r"venv=\$\{VENV:-([^}]+)\}", script)
    assert test_env != main_env, (main_env, test_env)
    ci = (REPO / ".ci" / "run").read_text()
    assert f"{test_env}/bin/ruff check" in ci and f"{test_env}/bin/mypy" in ci
    assert f"{test_env}/bin/mkdocs build --strict" in ci
