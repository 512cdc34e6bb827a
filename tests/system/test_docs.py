"""The documentation (README.md and the MkDocs site in docs/) stays true: its tables are the
code's, its links resolve, its nav lists every page, the command reference is generated from
the command itself, and its shell and Python blocks run.

Code blocks: every ```bash, ```sh and ```python block of README.md and docs/*.md runs here, on
its own, in an empty temporary directory, with this environment's executables first on PATH
(as ``source .venv/bin/activate`` puts the README's) and a private, empty cache root as
``KERNELCACHE_DIR``: shell blocks with ``bash -eu -o pipefail``, Python blocks in a fresh
interpreter. A block that cannot run here (it needs a GPU, a server, cloud credentials, the
reader's own program, or is a fragment) is marked on the line right before its fence with
``<!-- not-run: REASON -->`` (invisible on the site and on GitHub); it is reported as skipped
with that reason. docs/development.md describes the convention.
"""

from __future__ import annotations

import importlib.util
import itertools
import os
import re
import subprocess
import sys
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest
from python_names import defined_names, undefined_names
from support import REPO, child_env

import bridge  # noqa: F401  (declares the bridge's variables)
from kernelcache.config import variables

DOCS = REPO / "docs"
#: the pages of the site
PAGES = sorted(DOCS.glob("*.md"))
#: every Markdown file of the documentation: the front page and the site's pages
TEXTS = [REPO / "README.md", *PAGES]

#: fence languages that run, and the interpreter each runs with
RUN = {"bash": "bash", "sh": "bash", "python": "python"}
#: fence languages that are shown, never run (a new language must be added to one of the two)
SHOWN = {"", "text", "dockerfile", "toml"}
NOT_RUN = re.compile(r"<!-- not-run: (.*?) -->")
FENCE = re.compile(r"^([ \t]*)```(\S*)\n(.*?)^\1```[ \t]*$", re.S | re.M)


def page(name: str) -> str:
    return (DOCS / name).read_text()


def rel(path: Path) -> str:
    return str(path.relative_to(REPO))


def load_hook() -> ModuleType:
    """docs/hooks/cli_reference.py, the MkDocs hook that renders the command reference."""
    path = DOCS / "hooks" / "cli_reference.py"
    spec = importlib.util.spec_from_file_location("cli_reference", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# -- tables that are the code's ----------------------------------------------------------------
def test_the_configuration_table_is_the_declared_variables():
    text = page("configuration.md")
    rows = [line for line in text.splitlines() if line.startswith("| `KERNELCACHE_")]
    documented = {row.split("`")[1]: row for row in rows}
    declared = variables()
    assert len(rows) == len(documented), "one row per variable"
    assert sorted(documented) == sorted(var.name for var in declared), "one row per variable"
    for var in declared:
        cells = [c.strip() for c in documented[var.name].strip("|").split("|")]
        assert cells == [f"`{var.name}`", var.meaning, var.shown_default], var.name


def test_layout_names_every_module():
    layout = page("layout.md")
    for package in ("kernelcache", "bridge"):
        for path in sorted((REPO / package).rglob("*.py")):
            rel_ = path.relative_to(REPO / package)
            if rel_.name in ("__init__.py", "__main__.py"):
                continue
            names = [f"`{rel_.name}`", *(f"`{part}/`" for part in rel_.parent.parts)]
            assert all(n in layout for n in names), (
                f"{package}/{rel_} is not described in docs/layout.md: add it there"
            )


def test_the_documented_format_and_stats_fields_are_the_real_ones():
    """The entry format on docs/on-disk.md is the one written, and the stats JSON table of
    docs/commands.md names each field once, every counter among them."""
    from kernelcache.schema import FORMAT_VERSION
    from kernelcache.stats.counters import COUNTERS

    on_disk = page("on-disk.md")
    assert f"`format` ({FORMAT_VERSION})" in on_disk
    assert f"The format is {FORMAT_VERSION}" in on_disk
    for path in TEXTS:
        assert "format stays" not in path.read_text(), rel(path)
    commands = page("commands.md")
    start = commands.index("| `root`, `exists` |")
    table = commands[start : commands.index("\n\n", start)]
    rows = re.findall(r"^\| (`[^|]*`) \| ", table, re.M)
    names = [n for row in rows for n in re.findall(r"`([a-z_]+)`", row)]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
    (counters,) = [
        line for line in commands.splitlines() if line.startswith("| `counters` | sums over")
    ]
    missing = [c for c in COUNTERS if f"`{c}`" not in counters]
    assert not missing, missing


# -- the site: nav and links -------------------------------------------------------------------
def test_the_nav_lists_every_page_once():
    config = (REPO / "mkdocs.yml").read_text()
    assert re.search(r"^docs_dir: docs$", config, re.M)
    nav = config[config.index("\nnav:\n") :]
    listed = re.findall(r"^\s+- (?:[^\n]*: )?([\w./-]+\.md)\s*$", nav, re.M)
    assert len(listed) == len(set(listed)), sorted(p for p in listed if listed.count(p) > 1)
    pages = [str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")]
    assert sorted(listed) == sorted(pages), "mkdocs.yml's nav must list every page of docs/"


def _prose(text: str) -> str:
    """``text`` without its fenced blocks and code spans (where brackets are code, not links)."""
    text = FENCE.sub("", text)
    return re.sub(r"`[^`\n]*`", "", text)


def _slug(heading: str) -> str:
    """The id Python-Markdown's toc extension (MkDocs') gives a heading."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.replace("`", ""))
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def _anchors(path: Path) -> set[str]:
    """The ids of the headings of ``path`` as the site renders it (the command reference's
    generated headings included)."""
    text = path.read_text()
    if path == DOCS / "cli-reference.md" or "<!-- cli-" in text:
        text = load_hook().render(text)
    seen: dict[str, int] = {}
    for heading in re.findall(r"^#{1,6} (.+?)\s*$", FENCE.sub("", text), re.M):
        slug = _slug(heading)
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        if count:
            seen[f"{slug}_{count}"] = 1
    return set(seen)


def _links() -> list[tuple[Path, str]]:
    out = []
    for path in TEXTS:
        for target in re.findall(r"\]\(([^)\s]+)\)", _prose(path.read_text())):
            if not re.match(r"[a-z][a-z+]*:", target):  # http:, https:, mailto: are not checked
                out.append((path, target))
    return out


@pytest.mark.parametrize("source, target", _links(), ids=lambda v: getattr(v, "name", v))
def test_every_relative_link_resolves(source, target):
    file, _, anchor = target.partition("#")
    path = (source.parent / file).resolve() if file else source
    assert path.exists(), f"{rel(source)}: {target}: no such file"
    if anchor:
        assert path.suffix == ".md", (
            f"{rel(source)}: {target}: an anchor into a file that is not a page"
        )
        assert anchor in _anchors(path), f"{rel(source)}: {target}: no such heading in {rel(path)}"


def test_the_site_links_to_pages_not_to_files_outside_it():
    """A page links to other pages of docs/ (what MkDocs can check and serve), never to a
    file outside the site; files of the repository are named as code."""
    for path in PAGES:
        for target in re.findall(r"\]\(([^)\s#]+)[^)\s]*\)", _prose(path.read_text())):
            if not re.match(r"[a-z][a-z+]*:", target):
                resolved = (path.parent / target).resolve()
                assert resolved.is_relative_to(DOCS), f"{rel(path)}: {target}"


# -- the command reference ---------------------------------------------------------------------
def test_the_reference_renders_every_command_and_option():
    import argparse

    hook = load_hook()
    parser = hook.load_parser()
    text = hook.render(page("cli-reference.md"))
    globals_ = {tuple(a.option_strings) for a in parser._actions if a.option_strings}
    for path, sub in hook.walk(parser):
        assert f"\n## `{' '.join(('kernelcache', *path))}`\n" in text, path
        assert hook.usage(sub) in text, path
        for action in sub._actions:
            if path and tuple(action.option_strings) in globals_:
                continue  # the global options, listed once, at the top
            if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            written = sub.formatter_class(prog=sub.prog)._format_action_invocation(action)
            assert f"- `{written}`" in text, (path, written)
    # the commands installed packages add (the bridge's) are there too
    plugins = hook.plugin_sources()
    assert {"warm", "tune", "explain", "audit"} <= set(plugins)
    for name, source in plugins.items():
        assert f"\n## `kernelcache {name}`\n" in text and source in text, name


def test_the_reference_ends_with_the_exit_codes():
    from kernelcache.cli.output import EXIT_CODES

    hook = load_hook()
    text = hook.render(page("cli-reference.md"))
    table = text[text.index("\n## Exit codes\n") :]
    for code, meaning in EXIT_CODES.items():
        assert f"| `{code}` | {hook.markdown_text(meaning)} |" in table, code


def test_the_reference_page_is_generated_and_reads_whole_without_the_hook():
    """The page holds the reference the hook renders (read on GitHub, where no hook runs, it
    is not empty), and only that: its sections are generated, never written by hand."""
    text = page("cli-reference.md")
    assert text.count("<!-- cli-reference -->") == 1 and text.count("<!-- /cli-reference -->") == 1
    assert "\n## `kernelcache stats`\n" in text and "\n## Exit codes\n" in text
    assert load_hook().render(text) == text, (
        "docs/cli-reference.md is not what the command gives: run python docs/hooks/cli_reference.py"
    )
    outside = text.split("<!-- cli-reference -->")[0] + text.split("<!-- /cli-reference -->")[1]
    assert not re.search(r"^## ", outside, re.M), "the reference's sections are generated"


def test_the_command_line_page_shows_every_commands_usage():
    """docs/commands.md has a section for each command, with its usage from the parser."""
    hook = load_hook()
    parser = hook.load_parser()
    commands = [" ".join(("kernelcache", *path)) for path, _ in hook.walk(parser)]
    markers = hook.USAGE.findall(page("commands.md"))
    assert sorted(markers) == sorted(commands)
    assert "```\nkernelcache " not in page("commands.md"), "usage is generated: a marker"


def test_a_marker_for_no_command_fails_the_build():
    hook = load_hook()
    with pytest.raises(hook.HookError, match="no command 'kernelcache stast'"):
        hook.render("<!-- cli-usage: kernelcache stast -->")


def test_a_plugin_that_cannot_load_fails_the_build(monkeypatch):
    """build_parser skips a broken plugin with a warning; the reference would then lack its
    commands, so the hook refuses to render."""
    from kernelcache.cli import app

    def broken(subparsers):
        app.logger.warning("kernelcache: skipping the command plugin warm (x:y): boom")

    monkeypatch.setattr(app, "_load_plugins", broken)
    hook = load_hook()
    with pytest.raises(hook.HookError, match="boom"):
        hook.render(page("cli-reference.md"))


@pytest.mark.skipif(
    importlib.util.find_spec("mkdocs") is None,
    reason="mkdocs is not installed (the test extra installs it)",
)
def test_the_site_builds_strictly(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=REPO,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    reference = (tmp_path / "cli-reference" / "index.html").read_text()
    assert 'id="kernelcache-warm"' in reference and 'id="exit-codes"' in reference


# -- code blocks -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Block:
    path: Path
    line: int
    language: str
    indent: str
    code: str
    not_run: str | None  # the marker's reason


def _blocks() -> list[Block]:
    blocks = []
    for path in TEXTS:
        text = path.read_text()
        for m in FENCE.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            before = text[: max(m.start() - 1, 0)].rsplit("\n", 1)[-1]  # the line before
            marker = NOT_RUN.fullmatch(before.strip())
            reason = marker.group(1) if marker else None
            blocks.append(Block(path, line, m.group(2), m.group(1), m.group(3), reason))
    return blocks


BLOCKS = _blocks()


def _id(block: Block) -> str:
    return f"{rel(block.path)}:{block.line}"


def test_blocks_are_of_known_languages_and_start_their_line():
    """A fence indented (in a list) is not a code block to MkDocs' Markdown; a block of a
    language neither run nor listed as shown would escape the test below."""
    for block in BLOCKS:
        assert block.indent == "", f"{_id(block)}: a fence must start its line"
        assert block.language in RUN or block.language in SHOWN, (
            f"{_id(block)}: ```{block.language}: add it to RUN or SHOWN in tests/system/test_docs.py"
        )


def test_lists_and_tables_start_after_a_blank_line():
    """MkDocs' Markdown reads a list or a table that directly follows a paragraph line as more
    of the paragraph (GitHub does not), so the site would show it as run-on text."""
    for path in PAGES:
        lines = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), path.read_text()).split("\n")
        for i, (prev, line) in enumerate(itertools.pairwise(lines), start=2):
            starts = re.match(r"([-*] |\d+\. |\|)", line)
            continues = (
                not prev.strip() or prev.startswith(" ") or re.match(r"([-*] |\d+\. |\|)", prev)
            )
            assert not starts or continues, f"{rel(path)}:{i}: a blank line is needed before it"


def test_nested_lists_are_indented_by_four_spaces():
    """MkDocs' Markdown nests a list item only four spaces deeper (GitHub: two suffice); one
    indented otherwise is shown as an item of the outer list."""
    for path in PAGES:
        text = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), path.read_text())
        for m in re.finditer(r"^( +)(?:[-*]|\d+\.) ", text, re.M):
            line = text.count("\n", 0, m.start()) + 1
            assert len(m.group(1)) % 4 == 0, f"{rel(path)}:{line}: indent a nested item by 4"


def test_every_not_run_marker_precedes_a_block_that_would_run():
    for path in TEXTS:
        text = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), path.read_text())
        for m in NOT_RUN.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            assert m.group(1).strip(), f"{rel(path)}:{line}: say why the block does not run"
            assert any(
                b.path == path and b.line == line + 1 and b.language in RUN for b in BLOCKS
            ), (
                f"{rel(path)}:{line}: a not-run marker belongs on the line before a bash or python block"
            )


def test_a_python_block_that_does_not_run_says_what_it_stands_in_for():
    """Every Python block runs, or parses and names (in its not-run reason) each name it uses
    that neither it nor another block of its page defines: a reader knows what to supply,
    and a block that lacks nothing but values is written to run."""
    for block in BLOCKS:
        if block.language != "python" or not block.not_run:
            continue
        others = set().union(
            *(
                defined_names(b.code)
                for b in BLOCKS
                if b.path == block.path and b.language == "python" and b is not block
            )
        )
        said = set(re.findall(r"\w+", block.not_run))
        unexplained = sorted(undefined_names(block.code) - others - said)
        assert not unexplained, f"{_id(block)}: say what {', '.join(unexplained)} stand for"


def test_the_sites_front_page_gets_a_reader_to_a_story_that_runs():
    """The front page of the site (where the README is not) sets up as the README does and
    runs a first story, tested like every block: a program compiles a kernel once, a second
    process compiles nothing, the command line shows it. What the site builds is not tracked."""
    start = page("index.md").split("## Start here", 1)[1].split("\n## ", 1)[0]
    blocks = [b for b in BLOCKS if b.path == DOCS / "index.md" and b.code in start]
    setup, story = blocks
    assert "pip install" in setup.code and setup.not_run
    assert story.not_run is None and story.language in RUN
    assert "python add.py" in story.code and "kernelcache ls" in story.code
    ignored = (REPO / ".gitignore").read_text().split()
    assert "/site/" in ignored, "mkdocs build's default output must not be tracked"


def test_the_python_page_opens_with_a_block_that_runs():
    """The manual's first Python example (the API at a glance) is run, not only shown."""
    first = next(b for b in BLOCKS if b.path == DOCS / "python.md" and b.language == "python")
    assert first.not_run is None, f"{_id(first)} is marked not-run: {first.not_run}"


def test_the_python_pages_first_example_runs_again_and_leaves_the_users_cache_alone(tmp_path):
    """The API at a glance runs a second time as it ran the first (a reader runs it again), and
    with no kernelcache variable set it writes nothing under the user's home: its fake kernels
    never land in the user's own cache."""
    first = next(b for b in BLOCKS if b.path == DOCS / "python.md" and b.language == "python")
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    script = tmp_path / "example.py"
    script.write_text(first.code)
    env = child_env(HOME=str(home))
    for name in ("XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME"):
        env.pop(name, None)  # the user cache directory is the one under HOME
    for run in ("first", "second"):
        proc = subprocess.run(
            [sys.executable, str(script)],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            stdin=subprocess.DEVNULL,
        )
        assert proc.returncode == 0, f"{_id(first)}, {run} run:\n{proc.stdout}\n{proc.stderr}"
    assert sorted(home.rglob("*")) == [], "the example wrote under the user's home"


@pytest.mark.parametrize(
    "block",
    [
        pytest.param(
            b,
            id=_id(b),
            marks=[pytest.mark.skip(reason=f"not-run: {b.not_run}")] if b.not_run else [],
        )
        for b in BLOCKS
        if b.language in RUN
    ],
)
def test_the_code_block_runs(block, tmp_path):
    work, root = tmp_path / "work", tmp_path / "root"
    work.mkdir()
    root.mkdir()
    env = child_env(KERNELCACHE_DIR=str(root))
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    if RUN[block.language] == "python":
        script = work.parent / "block.py"
        script.write_text(block.code)
        cmd = [sys.executable, str(script)]
    else:
        cmd = ["bash", "-eu", "-o", "pipefail", "-c", block.code]
    proc = subprocess.run(
        cmd,
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, (
        f"{_id(block)} failed ({proc.returncode}); mark it <!-- not-run: REASON --> only if it "
        f"cannot run here\n--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-3000:]}"
    )
