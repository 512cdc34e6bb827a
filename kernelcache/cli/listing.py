"""``kernelcache ls`` and ``kernelcache show``: list entries, and show one by its key or a unique
prefix of it.

``ls`` lists kernels (entries without a ``kind``) unless ``--kind`` asks for others: what
a package keeps beside its kernels (PTX companions, memoized values, lowerings, decisions) is
counted under the list, never mixed into it.

Invariant: the key prefixes ``ls`` prints are prefixes ``show`` accepts: unique among the keys
of the root (an entry and its companions share their first 16 digits, so their prefixes are
longer), all of one width (:func:`shown_key_width`).

``show`` prints what an entry holds where the package that writes entries of its ``kind``
says how to read them: :func:`register_content` (the bridge describes its autotune
decisions). kernelcache itself reads no artifact's content.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import stat
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..fsio import load_json
from ..keys import KEY_PATTERN, META_EXT
from ..schema.document import displayable
from ..schema.fields import FIELDS
from ..store.entry import Artifact
from .common import Context, Subparsers, add_command, add_filters, count_arg
from .output import (
    EXIT_OK,
    EXIT_PROBLEMS,
    CommandFailed,
    Output,
    UsageError,
    envelope,
    finite,
    format_kernels,
    format_label,
    format_table,
    human_age,
    human_size,
    plural,
    printable,
)


@dataclass(frozen=True)
class Content:
    """What an entry holds, as the package that wrote it reads it: ``doc`` is ``show --json``'s
    ``content``, ``lines`` what ``show`` prints for people."""

    doc: dict[str, Any]
    lines: tuple[str, ...]


#: reads an entry's artifact bytes (verified) with its metadata; the bytes are untrusted input:
#: what cannot be read is said in the Content, never raised (ImportError: the package's own
#: dependencies are missing here)
Describe = Callable[[bytes, Mapping[str, Any]], Content]
_contents: dict[str, Describe] = {}


def register_content(kind: str, describe: Describe) -> None:
    """Let ``show`` say what entries of metadata ``kind`` hold (registering a kind again
    replaces its reader)."""
    _contents[kind] = describe


def _content(data: bytes, meta: Mapping[str, Any]) -> Content | None:
    """What the registered reader of the entry's kind says it holds; None: no reader."""
    describe = _contents.get(meta.get("kind"))  # type: ignore[arg-type]
    if describe is None:
        return None
    try:
        return describe(data, meta)
    except ImportError as e:
        why = f"its reader cannot be imported here ({e})"
        return Content({"problem": why}, (f"cannot be shown: {why}",))


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
    p = add_command(subparsers, "ls", "list entries and their metadata")
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
        help="list entries of this kind (repeatable): kernel (the default), a kind the list's "
        "summary names (ptx, identity, program, decision, ...), or all",
    )
    p.add_argument("--reverse", action="store_true", help="reverse the order")
    p.add_argument("--limit", type=count_arg, metavar="N", help="show at most N entries")
    p.set_defaults(func=cmd_ls)

    p = add_command(subparsers, "show", "one entry: metadata, path, verified status")
    p.add_argument("key", metavar="KEY", help="a key or a unique prefix of at least 6 hex digits")
    p.set_defaults(func=cmd_show)


def cmd_ls(args: argparse.Namespace, out: Output) -> int:
    from ..maintenance.prune import select, unmatched
    from ..maintenance.scan import scan

    context: Context = args.context
    root = context.existing_root()
    scanned = scan(root, last_used=True, trust=context.trust)
    matching = select(scanned.entries, args.kernel or (), args.target or ())
    missed = unmatched(scanned.table, args.kernel or (), args.target or ())
    kinds = set(args.kind or [KERNEL])
    entries = [e for e in matching if "all" in kinds or (e.kind or KERNEL) in kinds]
    hidden: dict[str, int] = {}
    for e in matching:
        if "all" not in kinds and (e.kind or KERNEL) not in kinds:
            hidden[e.kind or KERNEL] = hidden.get(e.kind or KERNEL, 0) + 1
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
            return ("(no kernels)" if kinds == {KERNEL} else "(no entries)") + problems()
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


def kind_arg(text: str) -> str:
    """A ``--kind`` value, as an argparse ``type``: ``kernel``, ``all``, or a kind's name."""
    value = text.strip()
    if not re.fullmatch(r"[a-z0-9_.-]{1,64}", value):
        raise argparse.ArgumentTypeError(
            f"invalid kind {text!r}: give kernel, all, or a kind `ls` names (ptx, identity, ...)"
        )
    return value


def _key_text(text: str) -> str:
    """The key argument, normalized; checked before anything is looked up.

    Raises:
        UsageError: it is neither a key nor a prefix of at least 6 hex digits.
    """
    text = text.strip().lower()
    if not re.fullmatch(r"[0-9a-f]{6,128}", text):
        raise UsageError(
            f"invalid key {text!r}: give a key (32-128 hex digits) or a prefix of at least 6"
        )
    return text


def _resolve_key(root: str, text: str) -> str:
    """A full key, or a unique prefix (at least 6 hex digits) of one."""
    text = _key_text(text)
    if KEY_PATTERN.fullmatch(text):
        return text
    try:
        names = os.listdir(root)
    except OSError:
        names = []
    found = sorted(
        {n.split(".", 1)[0] for n in names if n.startswith(text) and n.endswith("." + META_EXT)}
    )
    if len(found) > 1:
        exts: dict[str, list[str]] = {}
        candidates = set(found)
        for n in names:
            key, _, ext = n.partition(".")
            if key in candidates and ext != META_EXT:
                exts.setdefault(key, []).append(ext)
        width = shown_key_width(found, found)
        shown = [f"{k[:width]} ({', '.join(sorted(exts.get(k, ['?'])))})" for k in found[:5]]
        raise UsageError(
            f"key prefix {text!r} is ambiguous: {', '.join(shown)}"
            + (f" and {len(found) - 5:,} more" if len(found) > 5 else "")
            + "; give one of these (kernelcache ls prints prefixes show accepts)"
        )
    if not found:
        raise CommandFailed(f"no entry with key prefix {text!r} under {root}")
    return found[0]


def _raw_metadata(root: str, key: str) -> dict[str, Any] | None:
    from ..fsio import READ_FLAGS

    try:
        fd = os.open(os.path.join(root, f"{key}.{META_EXT}"), READ_FLAGS)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            return None  # a FIFO or device planted there: never read
        raw = f.read(1 << 20)
    try:
        doc = load_json(raw)
    except ValueError:
        return None
    return displayable(doc) if isinstance(doc, dict) else None


def cmd_show(args: argparse.Namespace, out: Output) -> int:
    _key_text(args.key)  # a malformed key is refused before the root is looked at
    context: Context = args.context
    root = context.existing_root()
    key = _resolve_key(root, args.key)
    result = context.store(readonly=True, lock_timeout=None).read(key)
    if result is None:
        raise CommandFailed(f"no entry {key} under {root}")
    meta = dict(result.meta) if isinstance(result, Artifact) else _raw_metadata(root, key)
    ext = result.ext if isinstance(result, Artifact) else (meta or {}).get("ext")
    path = os.path.join(root, f"{key}.{ext}") if isinstance(ext, str) else None
    try:
        last_used: float | None = os.stat(
            os.path.join(root, f"{key}.{META_EXT}"), follow_symlinks=False
        ).st_mtime
    except OSError:
        last_used = None
    ok = isinstance(result, Artifact)
    content = _content(result.data, result.meta) if isinstance(result, Artifact) else None
    doc = {
        **envelope("show", root),
        "key": key,
        "ext": ext,
        "path": path,
        "size": len(result.data) if isinstance(result, Artifact) else None,
        "last_used": last_used,
        "status": "ok" if ok else "corrupt",
        "problem": None if ok else result.reason,  # type: ignore[union-attr]
        "metadata": meta,
        "content": None if content is None else content.doc,
    }

    def human() -> str:
        lines = [f"key:        {key}", f"path:       {printable(str(path))}"]
        if ok:
            lines.append(f"size:       {doc['size']:,} bytes ({human_size(doc['size'])})")
            lines.append("status:     ok (size and digest verified)")
        else:
            problem = printable(str(doc["problem"]))
            lines.append(f"status:     CORRUPT: {problem} (kernelcache verify --repair)")
        if last_used is not None:
            lines.append(
                f"last used:  {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(last_used))}"
                f" ({human_age(time.time() - last_used)})"
            )
        created = (meta or {}).get("created")
        if isinstance(created, (int, float)) and FIELDS["created"](created) is None:
            lines.append(
                f"created:    {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(created))}"
                f" ({human_age(time.time() - created)})"
            )
        lines.append("metadata:")
        for k, v in sorted((meta or {}).items()):
            shown = json.dumps(finite(v)) if isinstance(v, (dict, list)) else str(finite(v))
            lines.append(f"  {printable(k)}: {printable(shown)}")
        if content is not None:
            lines.append("content:")
            lines += [f"  {printable(line)}" for line in content.lines]
        return "\n".join(lines)

    out.emit(doc, human)
    return EXIT_OK if ok else EXIT_PROBLEMS
