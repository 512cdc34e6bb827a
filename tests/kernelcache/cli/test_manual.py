"""``kernelcache help``: the manual installed with the command, and ``-h`` that points at it
instead of at a file of the source tree."""

from __future__ import annotations

import subprocess
import sys

from cli_support import kc
from support import REPO, child_env

from kernelcache.cli import manual
from kernelcache.cli.app import build_parser

DOCS = REPO / "docs"


def _parsers():
    """Every command's parser (the bridge's included), as ``-h`` shows them."""
    todo = [build_parser()]
    while todo:
        parser = todo.pop()
        yield parser
        for action in parser._actions:
            choices = getattr(action, "choices", None)
            if isinstance(choices, dict):
                todo.extend(choices.values())


def test_no_help_names_a_file_of_the_source_tree():
    for parser in _parsers():
        text = parser.format_help()
        assert "docs/" not in text and ".md" not in text, (parser.prog, text)
    ls = next(p for p in _parsers() if p.prog == "kernelcache ls").format_help()
    assert "kernelcache help commands" in " ".join(ls.split())  # where the JSON fields are
    assert "kernelcache help" in build_parser().format_help()


def test_help_lists_the_topics_and_prints_one_page():
    proc = kc(None, "help")
    assert proc.returncode == 0, proc.stderr
    assert f"The manual ({DOCS}): kernelcache help TOPIC" in proc.stdout
    assert "  commands       The command line: kernelcache\n" in proc.stdout
    assert "  configuration  Configuration\n" in proc.stdout

    proc = kc(None, "help", "commands")
    assert proc.returncode == 0, proc.stderr
    page = (DOCS / "commands.md").read_text()
    assert proc.stdout.startswith("# The command line: `kernelcache`\n\nAfter the set-up")
    assert "## `kernelcache stats`" in proc.stdout and "<!--" not in proc.stdout
    assert len(proc.stdout) > 0.9 * len(page)


def test_an_unknown_topic_is_a_usage_error_naming_the_nearest():
    proc = kc(None, "help", "comands")
    assert proc.returncode == 2 and proc.stdout == ""
    assert "no topic 'comands' in the manual (did you mean 'commands'?" in proc.stderr


def test_the_installed_manual_is_found_through_the_distributions_files(tmp_path):
    """As pip installs a wheel: the pages under share/doc/kernelcache of the prefix, listed in
    the distribution's RECORD relative to site-packages."""
    site = tmp_path / "lib" / "site-packages"
    info = site / "kernelcache-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: kernelcache\nVersion: 0.1.0\n")
    pages = tmp_path / "share" / "doc" / "kernelcache"
    pages.mkdir(parents=True)
    (pages / "index.md").write_text("# kernelcache\n")
    (pages / "commands.md").write_text("# The command line\n\n<!-- cli-usage: kernelcache -->\n")
    record = [f"../../share/doc/kernelcache/{p.name},," for p in pages.iterdir()]
    (info / "RECORD").write_text("\n".join(record) + "\n")
    code = "from kernelcache.cli.app import main; main(['help', 'commands'])"
    env = child_env()
    env["PYTHONPATH"] = f"{site}:{env['PYTHONPATH']}"
    proc = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,  # (not the checkout, whose egg-info would be found first)
    )
    assert proc.returncode == 0 and proc.stdout == "# The command line\n", proc.stderr
    code = "from kernelcache.cli.manual import manual_dir; print(manual_dir())"
    proc = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,  # (not the checkout, whose egg-info would be found first)
    )
    assert proc.stdout == f"{pages}\n", proc.stderr


def test_every_page_is_installed_where_the_manual_is_looked_for():
    pyproject = (REPO / "pyproject.toml").read_text()
    installed = "/".join(manual.INSTALLED)
    assert f'[tool.setuptools.data-files]\n"{installed}" = ["docs/*.md"]\n' in pyproject
    assert set(manual.topics(DOCS)) == {p.stem for p in DOCS.glob("*.md")}
