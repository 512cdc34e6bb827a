"""``kernelcache jax-cache``, and what ``kernelcache doctor`` reports of JAX's persistent
compilation cache.

The command shows JAX's cache directory and prunes it by size or age under JAX's own lock
(:mod:`bridge.jax_cache.directory` reads JAX's format). A prune that would remove every entry
asks first on a terminal and does nothing elsewhere without ``--yes``; it never removes from a
read-only root's directory (``KERNELCACHE_READONLY_DIRS``, or JAX's directory beside one).
Neither the command nor the report imports jax or triton: the report reads the environment a
job would start with.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from kernelcache.cli import (
    EXIT_OK,
    Output,
    UsageError,
    add_command,
    age_arg,
    confirm_everything,
    envelope,
    human_age,
    printable,
    root_of,
    size_arg,
)
from kernelcache.plugin import human_size

#: JAX's options of its persistent compilation cache that ``doctor`` shows: (option, shown as);
#: JAX reads each from the environment variable of its name in capitals
JAX_CACHE_OPTIONS = (
    ("jax_compilation_cache_dir", "dir"),
    ("jax_persistent_cache_min_compile_time_secs", "min compile time (s)"),
    ("jax_persistent_cache_min_entry_size_bytes", "min entry size (bytes)"),
    ("jax_compilation_cache_max_size", "max size (bytes)"),
    ("jax_enable_compilation_cache", "enabled"),
)


def jax_cache_report() -> tuple[dict[str, Any] | None, list[Any]]:
    """``doctor``'s view of JAX's persistent compilation cache as a job started with this
    environment begins with it (before its code calls ``bridge.enable_jax_cache()`` or
    ``jax.config.update``): each option's variable, or None where JAX's default applies. jax
    is not imported (it costs seconds); None and no check when it is not installed."""
    import importlib.util
    import os

    from kernelcache.cli import Check

    if importlib.util.find_spec("jax") is None:
        return None, []
    found = {option: os.environ.get(option.upper()) for option, _ in JAX_CACHE_OPTIONS}
    # what is set, as "label value"; JAX's defaults for the rest
    given = [(label, found[o]) for o, label in JAX_CACHE_OPTIONS if found[o] is not None]
    shown = ", ".join(f"{label} {value}" for label, value in given) + (
        ", JAX's defaults for the rest" if given else "JAX's defaults"
    )
    off = (found["jax_enable_compilation_cache"] or "").strip().lower() in ("0", "false")
    if not found["jax_compilation_cache_dir"] or off:
        why = "JAX_ENABLE_COMPILATION_CACHE is off" if off else "JAX_COMPILATION_CACHE_DIR is unset"
        detail = (
            f"off in this environment ({why}): unless the job turns it on "
            "(bridge.enable_jax_cache(), or JAX_COMPILATION_CACHE_DIR), every process compiles "
            "XLA again"
        )
        return found, [Check("jax cache", "warn", detail)]
    return found, [Check("jax cache", "ok", shown)]


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``jax-cache`` to the ``kernelcache`` command."""
    p = add_command(
        subparsers,
        "jax-cache",
        "show JAX's persistent compilation cache directory; prune it by size (least recently "
        "used first) or age",
        uses=("KERNELCACHE_DIR", "KERNELCACHE_READONLY_DIRS"),
    )
    p.add_argument(
        "--dir",
        metavar="DIR",
        help="JAX's cache directory (default: $JAX_COMPILATION_CACHE_DIR, else the one "
        "bridge.enable_jax_cache uses beside the kernel cache root: <root>-jax)",
    )
    p.add_argument(
        "--max-size",
        type=size_arg,
        metavar="SIZE",
        help="keep at most SIZE bytes, e.g. 20G (0 means no size cap, as everywhere)",
    )
    p.add_argument(
        "--max-age", type=age_arg, metavar="AGE", help="remove entries not used for AGE, e.g. 30d"
    )
    p.add_argument("--dry-run", action="store_true", help="say what would go, change nothing")
    p.add_argument(
        "-y",
        "--yes",
        action="store_true",
        help="do it even when the prune removes every entry (without it, such a prune asks on "
        "a terminal and does nothing elsewhere)",
    )
    p.set_defaults(func=cmd_jax_cache)


def _why_every(args: argparse.Namespace, entries: list[Any]) -> str:
    """What makes a prune remove every entry of JAX's cache, said after its refusal: the cap is
    below the entry used last, or every entry is older than ``--max-age``."""
    last = entries[-1]  # (the most recently used)
    if args.max_size and last.size > args.max_size:
        return (
            f" (--max-size {human_size(args.max_size)} is less than the entry used last, "
            f"{human_size(last.size)}: give a larger SIZE to keep the recent ones)"
        )
    return (
        " (--max-age selects every entry: the one used last was used "
        f"{human_age(time.time() - last.last_used)}; give a longer AGE to keep it)"
    )


def cmd_jax_cache(args: argparse.Namespace, out: Output) -> int:
    """``kernelcache jax-cache``: JAX's cache directory, and a prune of it under JAX's lock
    (see :mod:`.directory`; needs neither jax nor triton)."""
    import os

    from ..jax_cache.directory import plan_jax_prune, prune_jax_cache, scan_jax_cache
    from ..jax_cache.enable import default_dir

    given = args.dir or os.environ.get("JAX_COMPILATION_CACHE_DIR")
    directory = os.path.abspath(os.path.expanduser(given) if given else default_dir(root_of(args)))
    fills = (
        "a job fills it once it calls bridge.enable_jax_cache() (or runs with "
        "JAX_COMPILATION_CACHE_DIR set)"
    )
    if given and not os.path.isdir(directory):
        raise UsageError(
            f"JAX's cache directory {directory} does not exist (check --dir or "
            f"JAX_COMPILATION_CACHE_DIR; {fills})"
        )
    exists = os.path.isdir(directory)  # the default one: none yet on a fresh set-up
    max_size = args.max_size or None  # one meaning of a size cap everywhere: 0 is no cap
    pruning = max_size is not None or args.max_age is not None
    if pruning and not args.dry_run:
        args.context.refuse_readonly(directory, "jax-cache", beside=default_dir)
    entries, stray = scan_jax_cache(directory) if exists else ([], [])
    doomed = plan_jax_prune(entries, max_size=max_size, max_age=args.max_age) if pruning else []
    if not pruning:
        stray = []  # showing only
    removed = freed = 0
    if (doomed or stray) and not args.dry_run:
        if doomed and len(doomed) == len(entries) and not args.yes:
            size = human_size(sum(e.size for e in doomed))
            every = f"every entry of JAX's cache {printable(directory)} ({len(doomed):,}, {size})"
            confirm_everything("jax-cache prune", every, _why_every(args, entries))
        try:
            with out.progress("pruning", len(doomed)) as tick:
                removed, freed = prune_jax_cache(directory, doomed, stray, progress=tick)
        except (TimeoutError, OSError) as e:
            raise UsageError(f"nothing was removed: {e}") from None
    now = time.time()
    total = sum(e.size for e in entries)
    doc = {
        **envelope("jax-cache", directory),
        "dir": directory,
        "exists": exists,
        "entries": len(entries),
        "bytes": total,
        "oldest_used": entries[0].last_used if entries else None,
        "newest_used": entries[-1].last_used if entries else None,
        "dry_run": args.dry_run,
        "to_remove": [{"key": e.key, "size": e.size, "last_used": e.last_used} for e in doomed],
        "removed": removed,
        "freed_bytes": freed,
    }

    def human() -> str:
        if not exists:
            return f"JAX cache:  {printable(directory)} (does not exist yet: {fills})"
        lines = [
            f"JAX cache:  {printable(directory)}",
            f"Entries:    {len(entries):,} ({human_size(total)})",
        ]
        if entries:
            lines.append(
                f"Last used:  {human_age(now - entries[-1].last_used)} (newest), "
                f"{human_age(now - entries[0].last_used)} (oldest)"
            )
        if pruning:
            size = human_size(sum(e.size for e in doomed))
            if args.dry_run:
                lines.append(f"Would remove {len(doomed):,} entries ({size}).")
                lines.append("Dry run: nothing was changed.")
            else:
                lines.append(f"Removed {removed:,} entries ({human_size(freed)}).")
        return "\n".join(lines)

    out.emit(doc, human)
    return EXIT_OK
