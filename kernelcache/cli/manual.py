"""``kernelcache help [TOPIC]``: the manual (the pages of the documentation site, as Markdown)
where the command is installed, so that ``-h`` can point at a topic rather than at a file of the
source tree.

The pages are installed with the package, under ``share/doc/kernelcache`` of its installation
scheme (pyproject's ``data-files``), found through the installed distribution's file list; run
from a checkout (an editable install, or the source tree on ``sys.path``), they are its
``docs/``. A topic is a page's name without ``.md`` (``commands``, ``configuration``, ...).

Invariant: ``help TOPIC`` prints the page alone on standard output (the site's own markers,
lines that are one HTML comment, left out), so ``kernelcache help commands | less`` reads it.
"""

from __future__ import annotations

import argparse
import difflib
import re
from importlib import metadata
from pathlib import Path

from ..errors import UsageError
from .common import Subparsers, add_command
from .output import EXIT_OK, Output, envelope

#: where the pages are installed, under the installation scheme's data directory
INSTALLED = ("share", "doc", "kernelcache")
#: a line of a page that is only a marker of the site's (``<!-- cli-usage: ... -->``), and the
#: blank line after it
MARKER = re.compile(r"^<!--.*-->\n\n?", re.M)


def manual_dir() -> Path | None:
    """The folder that holds the manual's pages: the installed copy, else the checkout's
    ``docs/``; None when neither is there."""
    try:
        files = metadata.files("kernelcache") or []
    except metadata.PackageNotFoundError:
        files = []
    for file in files:
        if file.parts[-4:] == (*INSTALLED, "index.md"):
            return Path(str(file.locate())).resolve().parent
    checkout = Path(__file__).resolve().parents[2] / "docs"
    return checkout if (checkout / "index.md").is_file() else None


def topics(folder: Path) -> dict[str, str]:
    """Each topic of the manual in ``folder`` -> its title (the page's first heading)."""
    found = {}
    for page in sorted(folder.glob("*.md")):
        first = page.read_text(encoding="utf-8").lstrip().split("\n", 1)[0]
        found[page.stem] = first.lstrip("#").strip().replace("`", "")
    return found


def register(subparsers: Subparsers) -> None:
    p = add_command(
        subparsers,
        "help",
        "the manual, installed with the command: its topics, or one topic's page (Markdown)",
        uses=(),
    )
    p.add_argument("topic", nargs="?", metavar="TOPIC", help="e.g. commands, configuration")
    p.set_defaults(func=cmd_help)


def cmd_help(args: argparse.Namespace, out: Output) -> int:
    folder = manual_dir()
    if folder is None:
        raise UsageError(
            "the manual is not installed with this copy of kernelcache (`kernelcache COMMAND -h` "
            "describes each command)"
        )
    found = topics(folder)
    if args.topic is None:

        def human() -> str:
            width = max(map(len, found))
            lines = [f"The manual ({folder}): kernelcache help TOPIC", ""]
            return "\n".join(lines + [f"  {t:{width}}  {title}" for t, title in found.items()])

        doc = {**envelope("help", None), "manual": str(folder), "topics": found}
        out.emit(doc, human)
        return EXIT_OK
    if args.topic not in found:
        near = difflib.get_close_matches(args.topic, found, n=1)
        hint = f"did you mean {near[0]!r}? " if near else ""
        raise UsageError(
            f"no topic {args.topic!r} in the manual ({hint}`kernelcache help` lists them)"
        )
    page = folder / f"{args.topic}.md"
    text = MARKER.sub("", page.read_text(encoding="utf-8"))
    out.emit(
        {**envelope("help", None), "topic": args.topic, "path": str(page), "text": text},
        lambda: text,
    )
    return EXIT_OK
