"""``kernelcache export`` and ``kernelcache import``: entries to and from a bundle file, local or
in an object store (``--to``/``--from s3://bucket/path/FILE``)."""

from __future__ import annotations

import argparse
import os
import tempfile
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from ..errors import CacheError, ConfigError
from .common import (
    CHANGES,
    ROOT,
    SIGNS,
    Context,
    Subparsers,
    add_command,
    add_filters,
    level_arg,
    size_arg,
)
from .output import (
    EXIT_OK,
    EXIT_PROBLEMS,
    CommandFailed,
    NothingDone,
    Output,
    UsageError,
    envelope,
    human_size,
    interrupted_keeping,
    plural,
    printable,
)

if TYPE_CHECKING:
    from ..bundle.archive import ImportResult
    from ..toolchains import Judge


#: the variables ``export`` works by: the root, whose files it serves, the signing key
EXPORTS = (*ROOT, "KERNELCACHE_TRUST", *SIGNS)
#: ... and ``import``: those of a command that writes to a root, how it writes entries
IMPORTS = (*CHANGES, *SIGNS, "KERNELCACHE_COMPRESSION")


def register(subparsers: Subparsers) -> None:
    p = add_command(
        subparsers, "export", "write entries to a bundle (tar+zstd, or tar)", uses=EXPORTS
    )
    p.add_argument("file", metavar="FILE", nargs="?", help="the bundle to write (or --to)")
    p.add_argument(
        "--to",
        metavar="URL",
        help="write the bundle to an object store instead: s3://bucket/path/FILE, gs://...",
    )
    add_filters(p)
    p.add_argument(
        "--compression",
        choices=("auto", "none", "zstd"),
        default="auto",
        help="auto (the default): zstd, unless FILE ends in .tar (a plain tar, as it says)",
    )
    p.add_argument("--level", type=level_arg, default=3, help="zstd level, 1 to 22 (default 3)")
    p.add_argument("--force", action="store_true", help="overwrite FILE")
    p.set_defaults(func=cmd_export)

    p = add_command(
        subparsers,
        "import",
        "verify a bundle completely, then add its entries",
        uses=IMPORTS,
    )
    p.add_argument("file", metavar="FILE", nargs="?", help="the bundle to read (or --from)")
    p.add_argument(
        "--from",
        dest="source",
        metavar="URL",
        help="read the bundle from an object store instead: s3://bucket/path/FILE, gs://...",
    )
    p.add_argument(
        "--max-member-size",
        type=size_arg,
        default=256 << 20,
        metavar="SIZE",
        help="refuse artifacts larger than SIZE (default 256M; 0 means no limit)",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="verify only; write nothing; say how many entries this machine's toolchain would "
        "look up, and why not the others",
    )
    p.set_defaults(func=cmd_import)


def _one_place(args: argparse.Namespace, url: str | None, option: str) -> None:
    """Check, before any work, that the bundle is either FILE or ``option`` URL, and that the
    URL names an object of a store this machine can reach (obstore installed).

    Raises:
        UsageError: neither or both, or a URL that names no object.
        MissingDependency: a URL, and obstore is not installed.
    """
    if (args.file is None) == (url is None):
        raise UsageError(f"give either FILE or {option} URL")
    if url is not None:
        from ..optional import require
        from ..remote import redact
        from ..remote.objstore.location import parse_object_url

        try:
            where = parse_object_url(url)
        except ConfigError as e:
            raise UsageError(str(e)) from None
        if not where.path or where.path.endswith("/"):
            raise UsageError(
                f"{option} needs the bundle's object: {where.scheme}://bucket/path/FILE"
            )
        require("obstore", f"{option} {redact(url)}")


def cmd_export(args: argparse.Namespace, out: Output) -> int:
    _one_place(args, args.to, "--to")
    if args.to is None:
        return _export(args, out, args.file, None)
    from ..remote import redact
    from ..remote.objstore.files import upload_file

    name = urlsplit(args.to).path.rpartition("/")[2]
    with tempfile.TemporaryDirectory(prefix="kernelcache-export-") as tmp:
        local = os.path.join(tmp, name)

        def upload() -> None:
            try:
                upload_file(args.to, local, overwrite=args.force)
            except ConfigError as e:  # a bad option of the URL
                raise UsageError(str(e)) from None
            except OSError as e:  # the store refused it, or cannot be reached
                raise UsageError(str(e)) from None

        return _export(args, out, local, (redact(args.to), upload))


def _export(
    args: argparse.Namespace,
    out: Output,
    file: str,
    upload: tuple[str, Callable[[], None]] | None,
) -> int:
    """Export to ``file``, then (``upload``: the URL shown, and how) copy it to a store."""
    from ..bundle.export import export_bundle
    from ..errors import BundleError
    from ..maintenance.prune import select, unmatched
    from ..maintenance.scan import scan

    context: Context = args.context
    root = context.existing_root()
    cfg = context.settings
    scanned = scan(root, trust=cfg.trust)
    entries = select(scanned.entries, args.kernel or (), args.target or ())
    missed = unmatched(scanned.table, args.kernel or (), args.target or ())
    entries.sort(key=lambda e: e.key)
    before = _identity(file)
    try:
        with out.progress("exporting", len(entries)) as tick:
            result = export_bundle(
                root,
                entries,
                file,
                compression=args.compression,
                level=args.level,
                force=args.force or upload is not None,
                progress=tick,
                trust=cfg.trust,
                signing_key=cfg.signing_secret(),
            )
    except BundleError as e:  # the bundle is written whole or not at all: nothing was done
        raise NothingDone(str(e)) from None
    except KeyboardInterrupt:  # whole or not at all: which one, said
        shown = upload[0] if upload else file
        if upload is None and before != _identity(file):
            raise interrupted_keeping(f"the bundle {file} was written whole") from None
        was = "is as it was" if before is not None else "was not made"
        raise interrupted_keeping(f"no bundle was written ({shown} {was})") from None
    # entries the scan found unusable (bad metadata, older format) are skipped too
    unusable = [
        (i.key, f"{i.kind}: {i.detail}")
        for i in scanned.issues
        if i.kind in ("corrupt", "outdated") and i.key is not None
    ]
    if unusable:
        result = replace(result, skipped=(*unusable, *result.skipped))
    doc = {
        **envelope("export", root),
        "file": upload[0] if upload else os.path.abspath(result.path),
        "entries": result.entries,
        "bytes": result.bytes,
        "compression": result.compression,
        "skipped": [{"key": k, "reason": r} for k, r in result.skipped],
        "compatibility": result.compatibility,
        "unmatched": missed,
    }

    def human() -> str:
        where = (
            f"{upload[0] if upload else result.path}"
            f" ({'zstd' if result.compression == 'zstd' else 'uncompressed tar'})"
        )
        if not result.entries:  # an empty bundle: say why
            filters = [
                *(f"--kernel {k}" for k in args.kernel or ()),
                *(f"--target {t}" for t in args.target or ()),
            ]
            if result.skipped:
                why = "every entry it matched was skipped (below)"
            elif missed:
                why = "; ".join(f"no entry matches {f}" for f in missed)
            elif filters:
                why = f"no entry matches {' and '.join(filters)} together"
            else:
                why = f"{root} holds no entries"
            lines = [printable(f"Nothing was exported: {why}; {where} holds an empty bundle.")]
        else:
            lines = [
                f"Exported {plural(result.entries, 'entry')} ({human_size(result.bytes)}) to {where}."
            ]
            lines += [f"No entry matches {printable(f)}." for f in missed]
        for key, reason in result.skipped:
            lines.append(f"  skipped {key}: {printable(reason)}")
        return "\n".join(lines)

    if upload is not None:
        try:
            upload[1]()
        except KeyboardInterrupt:
            raise interrupted_keeping(
                f"interrupted while uploading: an object store keeps {upload[0]} whole or not "
                "at all, as it was before or as exported"
            ) from None
    out.emit(doc, human)
    return EXIT_PROBLEMS if result.skipped else EXIT_OK


def _identity(path: str) -> tuple[int, int, int] | None:
    """What tells the file at ``path`` from another one put there: device, inode and change
    time; None where there is none."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_ctime_ns


def _toolchain() -> tuple[Judge | None, str]:
    """The judge of the toolchain registered here (see :mod:`kernelcache.toolchains`) and what
    it is; without one, None and why not."""
    from ..toolchains import registered

    found = registered()
    if not found:
        return None, (
            "no package that computes keys is installed here (pip install "
            "'kernelcache[bridge]'): which entries this machine would look up is not known"
        )
    name, factory = sorted(found.items())[0]
    try:
        judge, what = factory()
    except ImportError as e:
        return None, (
            f"{name} cannot be imported here ({e}): which entries this machine would look up "
            "is not known"
        )
    return judge, f"{name}: {what}"


def _lookup_lines(total: int, result: ImportResult, toolchain: str) -> list[str]:
    if result.looked_up is None:
        return [printable(f"Lookups: {toolchain}.")]
    lines = [
        printable(
            f"This machine ({toolchain}) would look up {result.looked_up:,} of {total:,} entries"
            + ("; not the others:" if result.not_looked_up else ".")
        )
    ]
    for reason, count in result.not_looked_up:
        lines.append(printable(f"  {count:,} {reason}"))
    return lines


def cmd_import(args: argparse.Namespace, out: Output) -> int:
    _one_place(args, args.source, "--from")
    if args.source is None:
        if not os.path.lexists(args.file):  # as a missing manifest is for warm and explain
            raise UsageError(f"the bundle {args.file} does not exist (check the path)")
        return _import(args, out, args.file, args.file)
    from ..remote import redact
    from ..remote.objstore.files import download_file

    name = urlsplit(args.source).path.rpartition("/")[2]
    with tempfile.TemporaryDirectory(prefix="kernelcache-import-") as tmp:
        local = os.path.join(tmp, name)
        try:
            download_file(args.source, local)
        except ConfigError as e:  # a bad option of the URL
            raise UsageError(str(e)) from None
        except OSError as e:  # no such bundle, or the store cannot be reached
            raise UsageError(str(e)) from None
        return _import(args, out, local, redact(args.source))


def _import(args: argparse.Namespace, out: Output, file: str, shown: str) -> int:
    """Import the bundle ``file`` (``shown`` as the file or URL it came from)."""
    from ..bundle.importing import import_bundle
    from ..errors import BundleError

    context: Context = args.context
    root = context.root
    cfg = context.settings
    if not args.dry_run:
        context.require_writable()
    store = context.store(lock_timeout=None)
    judge, toolchain = _toolchain() if args.dry_run else (None, "")
    try:
        with out.progress("importing", None, changes=not args.dry_run) as tick:
            result = import_bundle(
                store,
                file,
                max_member_size=args.max_member_size,
                dry_run=args.dry_run,
                progress=tick,
                signing_key=cfg.signing_secret(),
                judge=judge,
                planned=tick.set_total,
            )
    except KeyboardInterrupt as e:  # all or nothing: what it published was removed again
        if args.dry_run:
            raise
        published, left = getattr(e, "rolled_back", (0, 0))  # (none yet: still verifying)
        if left:
            raise interrupted_keeping(
                f"{left:,} of the {published:,} entries it published could not be removed "
                "again (each is whole and verified); the others were"
            ) from None
        removed = f" (the {plural(published, 'entry')} it published were removed again)"
        raise interrupted_keeping("nothing was imported" + (removed if published else "")) from None
    except BundleError as e:
        if not e.imported:  # refused whole: nothing was done (exit 2)
            raise NothingDone(f"import of {shown} rejected: {e}; nothing was imported") from None
        raise CommandFailed(
            f"import of {shown} rejected: {e}; {e.imported} verified entries it published "
            "could not be removed again"
        ) from None
    except CacheError as e:  # the root cannot take it: no space, not writable
        raise UsageError(f"{e}; nothing was imported") from None
    doc = {
        **envelope("import", root),
        "file": shown if args.source else os.path.abspath(file),
        "dry_run": result.dry_run,
        "entries": result.entries,
        "imported": result.imported,
        "present": result.present,
        "bytes": result.bytes,
        "conflicts": [{"key": k, "reason": r} for k, r in result.conflicts],
        "compatibility": result.compatibility,
    }
    if args.dry_run:
        doc["lookup"] = {
            "toolchain": toolchain,
            "looked_up": result.looked_up,
            "not_looked_up": [{"reason": r, "entries": n} for r, n in result.not_looked_up],
        }

    def human() -> str:
        verb = "Would import" if result.dry_run else "Imported"
        lines = [
            f"Verified {plural(result.entries, 'entry')} of {shown}.",
            f"{verb} {plural(result.imported, 'entry')} ({human_size(result.bytes)}); "
            f"{result.present:,} already present.",
        ]
        compat = result.compatibility
        if compat.get("targets"):
            lines.append(printable(f"Targets: {', '.join(map(str, compat['targets']))}"))
        producers = compat.get("producers") or {}
        if producers:
            lines.append(
                printable(
                    "Producers: "
                    + "; ".join(
                        f"{k} {', '.join(map(str, v))}"
                        for k, v in producers.items()
                        if isinstance(v, list)
                    )
                )
            )
        for key, reason in result.conflicts:
            lines.append(f"  conflict {key}: {printable(reason)}")
        if args.dry_run:
            lines.extend(_lookup_lines(result.entries, result, toolchain))
        return "\n".join(lines)

    out.emit(doc, human)
    return EXIT_PROBLEMS if result.conflicts else EXIT_OK
