"""``kernelcache ls``: list entries (``show``, one entry, is :mod:`.showing`).

``ls`` lists kernels (entries without a ``kind``) unless ``--kind`` asks for others: what
a package keeps beside its kernels (PTX companions, memoized values, lowerings, decisions) is
counted under the list, never mixed into it. ``--kind`` takes the words ``ls`` prints for
entries: a kind its summary names (``kernel`` or ``kernels``, ``identity``, ``ptx``, ...), an
extension of its EXT column (``cubin``, ``ident``, ...), or ``all``; any other word is an error
that names them.

Invariant: the key prefixes ``ls`` prints are prefixes ``show`` accepts: unique among the keys
of the root (an entry and its companions share their first 16 digits, so their prefixes are
longer), all of one width (:func:`shown_key_width`).
"""

from __future__ import annotations

import argparse
import os
import re
import time
from collections.abc import Callable, Sequence
from typing import Any

from ..table import EntryInfo, EntryTable
from .common import ROOT, Context, Subparsers, add_command, add_filters, count_arg
from .output import (
    EXIT_OK,
    Output,
    UsageError,
    envelope,
    format_kernels,
    format_label,
    format_table,
    human_age,
    human_size,
    plural,
    printable,
)

#: the fewest digits of a key ``ls`` shows
KEY_DIGITS = 16


def shown_key_width(shown: Sequence[str], every: Sequence[str]) -> int:
    """How many digits of each key in ``shown`` ``ls`` prints so that each is a prefix of that
    key alone among ``every`` key of the root: at least :data:`KEY_DIGITS`, one width for all
    (the keys sorted once; each compared with its neighbours)."""
    ordered = sorted(set(every) | set(shown))
    wanted = set(shown)
    width = KEY_DIGITS
    for i, key in enumerate(ordered):
        if key not in wanted:
            continue
        for j in (i - 1, i + 1):
            if 0 <= j < len(ordered):
                other = ordered[j]
                common = next(
                    (n for n, (a, b) in enumerate(zip(key, other, strict=False)) if a != b),
                    min(len(key), len(other)),
                )
                width = max(width, common + 1)
    return width


SORTS: dict[str, tuple[Callable[[Any], Any], bool]] = {
    "name": (lambda e: (e.kernel or "", e.target or "", e.key), False),
    "size": (lambda e: (e.size, e.key), True),  # largest artifact first
    "age": (lambda e: (e.created or 0.0, e.key), False),  # oldest first
    "last-used": (lambda e: (e.last_used or 0.0, e.key), False),  # least recently used first
}


def register(subparsers: Subparsers) -> None:
    p = add_command(subparsers, "ls", "list entries and their metadata", uses=ROOT)
    add_filters(p)
    p.add_argument(
        "--sort",
        choices=tuple(SORTS),
        default="name",
        help="name (kernel, target, key); size (largest first); age (oldest first); last-used (least recent first)",
    )
    p.add_argument(
        "--kind",
        action="append",
        type=kind_arg,
        metavar="KIND",
        help="list entries of this kind (repeatable): kernel (the default; also kernels), a "
        "kind the list's summary names (ptx, identity, decision, ...), an extension its EXT "
        "column shows (cubin, ident, program, ...), or all; another word is an error that "
        "lists the kinds of the root",
    )
    p.add_argument("--reverse", action="store_true", help="reverse the order")
    p.add_argument("--limit", type=count_arg, metavar="N", help="show at most N entries")
    p.set_defaults(func=cmd_ls)


def cmd_ls(args: argparse.Namespace, out: Output) -> int:
    from ..maintenance.prune import select, unmatched
    from ..maintenance.scan import scan

    context: Context = args.context
    root = context.existing_root(missing_ok=True)  # before the first job: nothing to list
    scanned = scan(root, last_used=True, trust=context.trust)
    kinds = set(args.kind or [KERNEL])
    _check_kinds(kinds, scanned.table, root)
    matching = select(scanned.entries, args.kernel or (), args.target or ())
    missed = unmatched(scanned.table, args.kernel or (), args.target or ())
    entries: list[EntryInfo] = []
    hidden: dict[str, int] = {}
    for e in matching:
        kind = e.kind or KERNEL
        if "all" in kinds or kind in kinds or e.ext in kinds:
            entries.append(e)
        else:
            hidden[kind] = hidden.get(kind, 0) + 1
    sort_key, descending = SORTS[args.sort]
    entries.sort(key=sort_key, reverse=descending != args.reverse)
    matched = len(entries)
    if args.limit is not None:
        entries = entries[: args.limit]
    now = time.time()
    # entries whose metadata cannot be served are not listed; name them (verify says more)
    unusable = [i for i in scanned.issues if i.kind in ("corrupt", "outdated")]

    def problems() -> str:
        text = "".join(f"\nNo entry matches {printable(f)}." for f in missed)
        if hidden:
            others = ", ".join(
                plural(n, KERNEL) if k == KERNEL else f"{n:,} {printable(k)}"
                for k, n in sorted(hidden.items())
            )
            text += (
                f"\nNot shown: {plural(sum(hidden.values()), 'other entry')} ({others}): "
                "--kind KIND lists them, --kind all every entry."
            )
        if not unusable:
            return text
        first = unusable[0]
        more = f" (and {len(unusable) - 1:,} more)" if len(unusable) > 1 else ""
        return (
            text
            + f"\nNot listed: {first.path}: {first.detail}{more}; run kernelcache verify"
            + (" --repair" if first.kind == "corrupt" else "")
        )

    def human() -> str:
        if not entries:
            yet = "" if scanned.exists else f": {printable(root)} does not exist yet"
            none = "(no kernels" if kinds == {KERNEL} else "(no entries"
            return f"{none}{yet})" + problems()
        rows = [["KEY", "EXT", "SIZE", "KERNEL", "TARGET", "LAST USED", "CREATED"]]
        every = [*scanned.table.key, *(i.key for i in scanned.issues if i.key)]
        width = shown_key_width([e.key for e in entries], every)
        for e in entries:
            rows.append(
                [
                    e.key[:width],
                    e.ext,
                    human_size(e.size),
                    format_kernels(e.kernel),
                    format_label(e.target),
                    human_age(now - e.last_used if e.last_used else None),
                    human_age(now - e.created if e.created else None),
                ]
            )
        total = sum(e.nbytes for e in entries)
        table = format_table(rows, right=(2,))
        shown = plural(len(entries), "kernel" if kinds == {KERNEL} else "entry")
        if matched > len(entries):  # --limit cut the list
            noun = "kernel" if kinds == {KERNEL} else "entry"
            shown = f"{len(entries):,} of {plural(matched, noun)} (--limit)"
        return table + f"\n{shown}, {human_size(total)}" + problems()

    doc = {
        **envelope("ls", root),
        "exists": scanned.exists,
        "count": len(entries),
        "matched": matched,
        "bytes": sum(e.nbytes for e in entries),
        "entries": [{**e.to_json(), "path": os.path.join(root, e.filename)} for e in entries],
        "problems": [i.to_json() for i in unusable],
        "unmatched": missed,
        "kinds": sorted(kinds),
        "hidden": dict(sorted(hidden.items())),
    }
    out.emit(doc, human)
    return EXIT_OK


#: what ``--kind`` calls entries without a ``kind`` (a package's compiled kernels)
KERNEL = "kernel"


#: what ``--kind`` takes for every entry
ALL = "all"


def kind_arg(text: str) -> str:
    """A ``--kind`` value, as an argparse ``type``: ``kernel`` (``kernels``, as the summary says
    it, is the same), ``all``, or a kind's name or extension (checked against the root's by
    :func:`_check_kinds`)."""
    value = text.strip()
    if not re.fullmatch(r"[a-z0-9_.-]{1,64}", value):
        raise argparse.ArgumentTypeError(
            f"invalid kind {text!r}: give kernel, all, or a kind `ls` names (ptx, identity, ...)"
        )
    return KERNEL if value == KERNEL + "s" else value


def _check_kinds(asked: set[str], table: EntryTable, root: str) -> None:
    """Refuse a ``--kind`` word that names no kind of the entries of ``table`` (the root's)
    and none of their extensions: ``kernel`` and ``all`` always name one.

    Raises:
        UsageError: naming the word and the kinds and extensions ``--kind`` takes here.
    """
    kinds = {k or KERNEL for k in set(table.kind)} | {KERNEL}
    exts = set(table.ext)
    unknown = sorted(asked - kinds - exts - {ALL})
    if not unknown:
        return
    words = ", ".join(sorted(kinds))
    by_ext = f"; their extensions: {', '.join(sorted(exts))}" if exts else ""
    raise UsageError(
        f"unknown kind {unknown[0]!r} for --kind: the entries under {root} are of the kinds "
        f"{words}{by_ext}; give one of these, or all"
    )
