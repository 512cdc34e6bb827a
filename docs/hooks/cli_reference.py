"""MkDocs hook: the command-line reference, rendered from the ``kernelcache`` command's own
parser when the site is built, so that it cannot drift from the code.

- A line ``<!-- cli-reference -->`` (docs/cli-reference.md) becomes every command and
  subcommand of :func:`kernelcache.cli.app.build_parser`, those that installed packages add
  through the entry-point group ``kernelcache.commands`` included (the bridge's ``warm``,
  ``tune``, ...): each one's description, usage, and options with their help, as ``--help``
  shows them; then the exit codes, from :data:`kernelcache.cli.output.EXIT_CODES`. What it
  rendered last is kept in the page itself, up to a line ``<!-- /cli-reference -->``, so that
  the page reads whole where no hook runs (on GitHub); the build renders it again, and
  ``python docs/hooks/cli_reference.py`` writes it again into the page (tests/system/test_docs.py
  fails while the page's copy differs from what the command gives).
- A line ``<!-- cli-usage: kernelcache COMMAND -->`` (any page) becomes that command's usage
  (``<!-- cli-usage: kernelcache -->``: the command's own).

A command plugin that cannot be loaded (its commands would be missing) or a marker that names
no command fails the build. tests/system/test_docs.py imports this module to check what it renders.
"""

from __future__ import annotations

import argparse
import html
import logging
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

#: where the whole reference goes (a line of its own), with the copy rendered last, if any
REFERENCE = re.compile(r"^<!-- cli-reference -->$(?:.*?^<!-- /cli-reference -->$)?", re.M | re.S)
#: the page that holds the reference
PAGE = Path(__file__).resolve().parent.parent / "cli-reference.md"
#: where one command's usage goes (a line of its own)
USAGE = re.compile(r"^<!-- cli-usage: (kernelcache(?: [a-z][a-z-]*)*) -->$", re.M)
#: the width usage lines are wrapped at
WIDTH = 100


class HookError(Exception):
    """What the hook cannot render (raised as MkDocs' PluginError during a build)."""


class _Warnings(logging.Handler):
    """Collects the warnings logged while it is attached."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def load_parser() -> argparse.ArgumentParser:
    """The command's parser, with every installed command plugin.

    Raises:
        HookError: a plugin could not be loaded (``build_parser`` skips it with a warning,
            which here would silently leave its commands out of the reference).
    """
    from kernelcache.cli import app

    warnings = _Warnings()
    app.logger.addHandler(warnings)
    try:
        parser = app.build_parser()
    finally:
        app.logger.removeHandler(warnings)
    if warnings.messages:
        raise HookError("; ".join(warnings.messages))
    return parser


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """``parser``'s subcommands by name, in the order ``--help`` lists them."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def walk(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """``parser`` and every command and subcommand under it, depth first, with their names."""
    yield path, parser
    for name, sub in subcommands(parser).items():
        yield from walk(sub, (*path, name))


def plugin_sources() -> dict[str, str]:
    """The command each installed plugin adds -> its entry point (``name = module:function``)."""
    from importlib.metadata import entry_points

    from kernelcache.cli.app import COMMANDS_GROUP

    sources = {}
    for ep in entry_points(group=COMMANDS_GROUP):
        scratch = argparse.ArgumentParser().add_subparsers()
        ep.load()(scratch)
        sources.update(dict.fromkeys(scratch.choices, f"{ep.name} = {ep.value}"))
    return sources


def usage(parser: argparse.ArgumentParser) -> str:
    """The usage line(s) of ``parser``, as ``--help`` wraps them at :data:`WIDTH` columns,
    without the ``usage:`` prefix."""
    formatter = parser.formatter_class(prog=parser.prog, width=WIDTH)
    formatter.add_usage(parser.usage, parser._actions, parser._mutually_exclusive_groups)
    text = formatter.format_help().strip("\n")
    prefix = "usage: "
    assert text.startswith(prefix), text
    lines = text[len(prefix) :].splitlines()
    return "\n".join([lines[0], *(line[len(prefix) :] for line in lines[1:])])


def markdown_text(text: str) -> str:
    """Help text as Markdown: what is between backticks stays code; elsewhere, characters
    Markdown would read as markup (``*`` in ``'cuda:*'``, ``_``, ``[``, ``<``) are shown as
    they are."""
    parts = text.split("`")
    if len(parts) % 2 == 0:  # an unmatched backtick: no code at all
        parts = [text.replace("`", "\\`")]
    out = []
    for i, part in enumerate(parts):
        if i % 2:
            out.append(f"`{part}`")
        else:
            out.append(re.sub(r"([\\*_\[\]#|])", r"\\\1", html.escape(part, quote=False)))
    return "".join(out)


def options(parser: argparse.ArgumentParser, skip: set[tuple[str, ...]]) -> list[str]:
    """One Markdown list item per argument of ``parser`` (``--help``, and the options whose
    spellings are in ``skip``, left out): how it is written and its help, as ``--help`` shows
    them."""
    formatter = parser.formatter_class(prog=parser.prog, width=WIDTH)
    items = []
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            continue  # (commands are listed as commands)
        if action.help == argparse.SUPPRESS or tuple(action.option_strings) in skip:
            continue
        written = formatter._format_action_invocation(action)
        help_ = formatter._expand_help(action) if action.help else ""
        items.append(f"- `{written}`" + (f": {markdown_text(help_)}" if help_ else ""))
    return items


def anchor(path: tuple[str, ...]) -> str:
    """The heading id MkDocs gives ``## `kernelcache COMMAND```."""
    return "-".join(("kernelcache", *path))


def command_section(
    path: tuple[str, ...],
    parser: argparse.ArgumentParser,
    skip: set[tuple[str, ...]],
    source: str | None,
) -> str:
    """The reference of one command: heading, description, usage, options."""
    lines = [f"## `{' '.join(('kernelcache', *path))}`", ""]
    if parser.description:
        lines += [markdown_text(parser.description), ""]
    lines += ["```text", usage(parser), "```", ""]
    items = options(parser, skip)
    if items:
        lines += [*items, ""]
    subs = subcommands(parser)
    if subs:
        lines += ["Commands:", ""]
        for name, sub in subs.items():
            summary = markdown_text(sub.description or "")
            lines.append(f"- [`{name}`](#{anchor((*path, name))}): {summary}")
        lines.append("")
    if path:
        lines += ["The [global options](#kernelcache) are accepted here too.", ""]
    if parser.epilog:
        lines += [markdown_text(parser.epilog), ""]
    if source:
        lines += [
            f"Added by an installed package, through the entry point `{source}` of the group "
            "`kernelcache.commands`.",
            "",
        ]
    return "\n".join(lines)


def exit_codes() -> str:
    """The table of exit codes every command exits by."""
    from kernelcache.cli.output import EXIT_CODES

    rows = ["## Exit codes", "", "| code | meaning |", "|---|---|"]
    rows += [f"| `{code}` | {markdown_text(meaning)} |" for code, meaning in EXIT_CODES.items()]
    return "\n".join(rows) + "\n"


def reference(parser: argparse.ArgumentParser) -> str:
    """The whole reference: the command and its global options, each command and subcommand,
    the exit codes."""
    globals_ = {tuple(a.option_strings) for a in parser._actions if a.option_strings}
    sources = plugin_sources()
    sections = []
    for path, sub in walk(parser):
        skip = globals_ if path else set()  # the global options: listed once, at the top
        source = sources.get(path[0]) if len(path) == 1 else None
        sections.append(command_section(path, sub, skip, source))
    return "\n".join([*sections, exit_codes()])


def command(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    """The parser of the command ``name`` (``kernelcache``, ``kernelcache stats``, ...).

    Raises:
        HookError: there is no such command.
    """
    for path, sub in walk(parser):
        if " ".join(("kernelcache", *path)) == name:
            return sub
    raise HookError(f"<!-- cli-usage: {name} -->: there is no command {name!r}")


def render(markdown: str) -> str:
    """``markdown`` with every marker replaced by what it stands for."""
    if not REFERENCE.search(markdown) and not USAGE.search(markdown):
        return markdown
    parser = load_parser()
    markdown = REFERENCE.sub(
        lambda m: f"<!-- cli-reference -->\n{reference(parser)}\n<!-- /cli-reference -->", markdown
    )
    return USAGE.sub(lambda m: f"```text\n{usage(command(parser, m.group(1)))}\n```", markdown)


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    """MkDocs' event for each page's Markdown, before it is converted."""
    from mkdocs.exceptions import PluginError

    try:
        return render(markdown)
    except HookError as e:
        raise PluginError(f"cli_reference hook, {kwargs['page'].file.src_path}: {e}") from e


def write_page(page: Path = PAGE) -> bool:
    """Render ``page``'s reference into the page itself; whether it changed."""
    text = page.read_text()
    rendered = render(text)
    if rendered != text:
        page.write_text(rendered)
    return rendered != text


if __name__ == "__main__":
    changed = write_page()
    sys.stdout.write(f"{PAGE}: {'written again' if changed else 'already current'}\n")
