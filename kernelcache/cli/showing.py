"""``kernelcache show``: one entry, named by its key, a unique prefix of it, ``<key>.<ext>`` or
the path of its file under the root, with its companions (the other entries of its key group).

A prefix of a kernel's key group (its first 16 digits, as ``explain`` names the nearest entry)
names the kernel: its companions share the prefix and do not make it ambiguous; a prefix of
several kernels is ambiguous, and the error names each with a prefix ``show`` accepts.

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
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..fsio import load_json
from ..keys import KEY_PATTERN, META_EXT, group_of, split_entry_name
from ..schema.document import displayable
from ..schema.fields import FIELDS
from ..store.entry import Artifact
from .common import ROOT, Context, Subparsers, add_command
from .listing import KERNEL, shown_key_width
from .output import (
    EXIT_OK,
    EXIT_PROBLEMS,
    CommandFailed,
    Output,
    UsageError,
    envelope,
    finite,
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


#: what ``show`` prints of one metadata field's value for people, where the package that
#: declared the field says how to read it: ``view(value, verbose)`` -> a summary (after the
#: field's name) and lines under it (every one with ``verbose``, else the first
#: :data:`SHOWN_ROWS`); None for a value it cannot read (shown as any other). The value is
#: untrusted input: a view never raises.
FieldView = Callable[[Any, bool], "tuple[str, list[str]] | None"]
_field_views: dict[str, FieldView] = {}
#: the rows of a long value shown without ``-v``, and the characters of a long text
SHOWN_ROWS = 5
SHOWN_CHARS = 100


def register_field_view(name: str, view: FieldView) -> None:
    """Let ``show`` summarize metadata field ``name`` (registering it again replaces it)."""
    _field_views[name] = view


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


def register(subparsers: Subparsers) -> None:
    p = add_command(subparsers, "show", "one entry: metadata, path, verified status", uses=ROOT)
    p.add_argument(
        "key",
        metavar="KEY",
        help="a key or a unique prefix of at least 6 hex digits (a kernel's: the kernel, with "
        "its companions), KEY.EXT, or the path of an entry's file under the root",
    )
    p.set_defaults(func=cmd_show)


@dataclass(frozen=True)
class _Asked:
    """What ``show`` was given, checked before the root is looked at: a key or a prefix of one,
    the extension of a file of the entry (``<key>.<ext>``, or a path's) or None, and the
    directory a path names (None: no path)."""

    key: str
    ext: str | None
    directory: str | None


def _asked(text: str) -> _Asked:
    """The argument of ``show``, parsed: a key or a prefix of at least 6 hex digits, ``KEY.EXT``,
    or the path of an entry's file (``<root>/<key>.<ext>``, as ``ls --json`` and ``verify``
    print it).

    Raises:
        UsageError: it is none of these.
    """
    given = text.strip()
    directory, _, name = given.rpartition(os.sep)
    if directory or given.startswith(os.sep):
        parts = split_entry_name(name)
        if parts is None:
            raise UsageError(
                f"invalid entry path {text!r}: the file of an entry is <key>.<ext> under the "
                "root (a key is 32-128 hex digits)"
            )
        return _Asked(parts[0], parts[1], os.path.expanduser(directory or os.sep))
    key, dot, ext = given.lower().partition(".")
    if not re.fullmatch(r"[0-9a-f]{6,128}", key) or (
        dot and not re.fullmatch(r"[a-z0-9]{1,16}", ext)
    ):
        raise UsageError(
            f"invalid key {given.lower()!r}: give a key (32-128 hex digits) or a prefix of at "
            "least 6, KEY.EXT, or the path of an entry's file"
        )
    return _Asked(key, ext if dot else None, None)


def _resolve_key(root: str, asked: _Asked) -> tuple[str, list[str]]:
    """The full key ``asked`` names, and the names of every entry file of the root (one
    listing). A prefix names the key it is a prefix of, where it is of one key alone, or of
    one key group (a kernel and its companions, :func:`~kernelcache.keys.group_of`) with one
    kernel in it (an entry without a ``kind``): that kernel. With an extension, only keys
    with a file of it count.

    Raises:
        UsageError: a path outside the root; a prefix of several keys (they are named).
        CommandFailed: no such entry.
    """
    if asked.directory is not None and os.path.realpath(asked.directory) != os.path.realpath(root):
        raise UsageError(
            f"{os.path.join(asked.directory, f'{asked.key}.{asked.ext}')} is not in the cache "
            f"root {root}: give the path of an entry under it, or its key (check --root)"
        )
    try:
        names = os.listdir(root)
    except OSError:
        names = []
    text = asked.key
    metas = {n[: -len(META_EXT) - 1] for n in names if n.endswith("." + META_EXT)}
    if asked.ext is not None and asked.ext != META_EXT:
        with_ext = {n.partition(".")[0] for n in names if n.endswith("." + asked.ext)}
        metas &= with_ext
    if text in metas:  # a whole key (the prefix of a longer one, too)
        return text, names
    found = sorted(k for k in metas if k.startswith(text))
    what = text if asked.ext is None else f"{text}.{asked.ext}"
    if len(found) > 1:
        kernel = _only_kernel(root, found)
        if kernel is not None:
            return kernel, names
        exts: dict[str, list[str]] = {}
        candidates = set(found)
        for n in names:
            key, _, ext = n.partition(".")
            if key in candidates and ext != META_EXT:
                exts.setdefault(key, []).append(ext)
        width = shown_key_width(found, found)
        shown = [f"{k[:width]} ({', '.join(sorted(exts.get(k, ['?'])))})" for k in found[:5]]
        raise UsageError(
            f"key prefix {what!r} is ambiguous: {', '.join(shown)}"
            + (f" and {len(found) - 5:,} more" if len(found) > 5 else "")
            + "; give one of these (kernelcache ls prints prefixes show accepts)"
        )
    if not found:
        noun = "key" if KEY_PATTERN.fullmatch(text) and asked.ext is None else "key prefix"
        raise CommandFailed(f"no entry with {noun} {what!r} under {root}")
    return found[0], names


def _only_kernel(root: str, keys: list[str]) -> str | None:
    """The one kernel among ``keys`` where all are of one key group and every other one is
    a companion (an entry with a ``kind``); else None. Reads the metadata of ``keys`` only
    where they are of one group (a kernel's companions are few)."""
    if len({group_of(k) for k in keys}) > 1:
        return None
    kernels = [k for k in keys if (_raw_metadata(root, k) or {}).get("kind") is None]
    return kernels[0] if len(kernels) == 1 else None


def _companions(root: str, key: str, names: list[str]) -> list[dict[str, Any]]:
    """The other entries of ``key``'s group (a kernel's PTX, what is stored beside it; a
    companion's kernel), as ``show --json`` lists them, from ``names`` (the root's files)."""
    group = group_of(key)
    mine = [n for n in names if n.startswith(group)]
    found = []
    for name in sorted(mine):
        parts = split_entry_name(name)
        if parts is None or parts[0] == key or parts[1] == META_EXT:
            continue
        other, ext = parts
        if f"{other}.{META_EXT}" not in mine:
            continue
        meta = _raw_metadata(root, other) or {}
        path = os.path.join(root, name)
        try:
            size: int | None = os.stat(path, follow_symlinks=False).st_size
        except OSError:
            size = None
        kind = meta.get("kind")
        found.append(
            {
                "key": other,
                "ext": ext,
                "kind": kind if isinstance(kind, str) else None,
                "size": size,
                "path": path,
            }
        )
    return found


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
    asked = _asked(args.key)  # a malformed key is refused before the root is looked at
    context: Context = args.context
    root = context.existing_root()
    key, names = _resolve_key(root, asked)
    companions = _companions(root, key, names)
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
    verbose = args.verbose > 0
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
        "companions": companions,
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
        lines.append("metadata:" + ("" if verbose else " (-v: every value whole; --json: as is)"))
        for k, v in sorted((meta or {}).items()):
            lines.extend(_field_lines(k, v, verbose))
        if content is not None:
            lines.append("content:")
            lines += [f"  {printable(line)}" for line in content.lines]
        if companions:
            lines.append("companions (its key group: kept and pruned with it):")
            rows = [
                [
                    c["key"],
                    c["ext"],
                    c["kind"] or KERNEL,
                    "?" if c["size"] is None else human_size(c["size"]),
                ]
                for c in companions
            ]
            lines += [
                "  " + printable(line) for line in format_table(rows, right=(3,)).splitlines()
            ]
        return "\n".join(lines)

    out.emit(doc, human)
    return EXIT_OK if ok else EXIT_PROBLEMS


def _field_lines(name: str, value: Any, verbose: bool) -> list[str]:
    """The lines ``show`` prints of one metadata field: a registered view's summary and first
    rows; a mapping one item a line; a long list counted, with its first rows; a long text
    cut (``verbose``: every row and character)."""
    label = f"  {printable(name)}:"
    view = _field_views.get(name)
    viewed = view(value, verbose) if view is not None else None
    if viewed is not None:
        summary, rows = viewed
        return [f"{label} {printable(summary)}", *(f"    {printable(r)}" for r in rows)]
    if isinstance(value, dict):
        items = [f"    {printable(str(k))}: {_cut(_text(v), verbose)}" for k, v in value.items()]
        return [f"{label} {plural(len(value), 'item')}", *items]
    if isinstance(value, list) and (verbose or len(_text(value)) > SHOWN_CHARS):
        shown = value if verbose else value[:SHOWN_ROWS]
        rows = [f"    - {_cut(_text(v), verbose)}" for v in shown]
        more = len(value) - len(shown)
        rows += [f"    ... {more:,} more (-v shows them)"] if more else []
        return [f"{label} {plural(len(value), 'item')}", *rows]
    return [f"{label} {_cut(_text(value), verbose)}"]


def _text(value: Any) -> str:
    """A metadata value as one line of text (JSON for lists and mappings)."""
    return json.dumps(finite(value)) if isinstance(value, (dict, list)) else str(finite(value))


def _cut(text: str, verbose: bool) -> str:
    """``text`` shown: whole with ``verbose`` or when short, else its start and its length."""
    if verbose or len(text) <= SHOWN_CHARS:
        return printable(text)
    return f"{printable(text[:SHOWN_CHARS])}... ({len(text):,} characters; -v shows it whole)"
