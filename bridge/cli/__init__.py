"""``kernelcache warm``, ``kernelcache tune``, ``kernelcache explain``, ``kernelcache audit``,
``kernelcache run`` and ``kernelcache jax-cache``: the bridge's subcommands of the
``kernelcache`` command (their arguments here, the adapters that run them in :mod:`.adapters`),
the bridge's toolchain for ``kernelcache import --dry-run`` (:mod:`.toolchain`) and its report
for ``kernelcache doctor`` (:mod:`bridge.cli.jax_cache`).

Registered through the entry-point group ``kernelcache.commands``. Importing this module imports
neither jax nor triton: they are imported when the command runs, and their absence is a usage
error that names the package to install. Kernels named in a manifest are imported as
``python -m`` would: the current directory first on ``sys.path``.

The plugin also tells ``kernelcache show`` what an autotune decision holds (which config was
chosen, pinned or measured, the margin and each config's time): reading one needs neither
jax, triton nor numpy.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from typing import Any

from kernelcache.cli import Content, add_command, register_content, register_field_view

from ..settings import VARIABLES
from . import jax_cache as jax_cache_command
from .adapters import cmd_audit, cmd_explain, cmd_run, cmd_tune, cmd_warm

#: what every command that reads a manifest says of it
MANIFEST_HELP = "a manifest of recorded calls (KERNELCACHE_RECORD, or bridge.record)"


def compile_target(text: str) -> str:
    """A target to compile for, as an argparse ``type``: a name, never a pattern (``ls``,
    ``prune``, ``export`` and ``tune`` take patterns; ``warm`` needs each target named)."""
    if any(c in text for c in "*?["):
        raise argparse.ArgumentTypeError(
            f"{text!r} is a pattern: name each target to compile for (e.g. --target cuda:90 "
            "--target hip:gfx942)"
        )
    return text


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``warm``, ``tune`` and ``explain`` to the ``kernelcache`` command, register the
    bridge's toolchain and its doctor report, and make the bridge's directories of a root known
    to the other commands (importing :mod:`bridge.embed.handoff` registers ``.handoff``; it
    imports neither jax nor triton)."""
    from kernelcache.cli import register_report, register_toolchain

    from .. import masquerade
    from ..embed import handoff  # noqa: F401
    from ..entries.decisions import DECISION
    from . import rocm_report

    register_toolchain("bridge", _toolchain)
    register_report("jax_cache", jax_cache_command.jax_cache_report)
    register_report("jax_triton", masquerade.report)
    register_report("rocm", rocm_report.report)
    register_content(DECISION.ext, decision_content)
    register_field_view("reads", reads_view)

    p = add_command(
        subparsers,
        "warm",
        "compile a recorded manifest for other targets (needs kernelcache[bridge])",
        variables=VARIABLES,
    )
    p.add_argument("manifest", metavar="MANIFEST", help=MANIFEST_HELP)
    p.add_argument(
        "--target",
        action="append",
        required=True,
        type=compile_target,
        metavar="T",
        help="e.g. cuda:90 or hip:gfx942 (repeatable)",
    )
    p.add_argument(
        "-j",
        "--jobs",
        type=int,
        metavar="N",
        help="compile in N processes (default: one per available CPU)",
    )
    p.add_argument(
        "--allow-changed",
        action="store_true",
        help="compile the current source of kernels changed since recording instead of failing",
    )
    p.add_argument(
        "--device",
        action="append",
        metavar="KIND",
        help="of an autotuned call decided for this device kind (e.g. 'NVIDIA H200'; "
        "repeatable), compile only the chosen config; a decision pinned for every device "
        "counts without it; an undecided call compiles every config",
    )
    p.add_argument(
        "--all-configs",
        action="store_true",
        help="compile every config of autotuned calls, decided or not",
    )
    p.set_defaults(func=cmd_warm)

    p = add_command(
        subparsers,
        "tune",
        "autotune decisions for a recorded manifest: measure on this GPU, or --pin configs "
        "(needs kernelcache[bridge])",
        variables=VARIABLES,
    )
    p.add_argument("manifest", metavar="MANIFEST", help=MANIFEST_HELP)
    p.add_argument(
        "--pin",
        action="append",
        metavar="KERNEL=INDEX",
        help="decide config INDEX (0-based, the kernel's own order) for every device, without "
        "measuring (repeatable; KERNEL is module:name or name)",
    )
    p.add_argument(
        "--target",
        action="append",
        metavar="T",
        help="tune for these targets (repeatable; a pattern such as 'cuda:*' selects among the "
        "recorded ones; default: the recorded ones)",
    )
    p.add_argument(
        "--fill",
        action="append",
        metavar="[KERNEL:]PARAM=VALUE",
        help="fill an array parameter when measuring with random, zeros, ones or a number "
        "(default: random floats, zero integers)",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="measure again where a decision exists, and replace it (a pin always replaces "
        "the one pinned before; a remote tier keeps its value, with a warning)",
    )
    p.add_argument(
        "--gpus",
        type=_positive,
        default=1,
        metavar="N",
        help="spread the configs of each call over up to N local GPUs of its device kind "
        "(the final rounds run on the first; default 1)",
    )
    p.set_defaults(func=cmd_tune)

    p = add_command(
        subparsers,
        "explain",
        "for each call of a recorded manifest and target: hit (the entry a lowering uses, "
        "and what its reads find), or why not: the reads that find something else now, or the "
        "nearest entry of the same kernel and which components of the key differ (needs "
        "kernelcache[bridge])",
        variables=VARIABLES,
    )
    p.add_argument("manifest", metavar="MANIFEST", nargs="?", help=MANIFEST_HELP)
    p.add_argument(
        "--target",
        action="append",
        metavar="T",
        help="explain for these targets (repeatable; default: the recorded ones)",
    )
    p.add_argument(
        "--reads",
        action="store_true",
        help="list each read of the entry a lowering uses (and of each entry it passes): what "
        "it read, and whether it finds the same now (an environment variable by its name only)",
    )
    p.add_argument(
        "--lowerings",
        action="store_true",
        help="instead: the calls the cache holds lowered more than once, and the steps of "
        "their context (device, jaxlib, embedding, ...) that tell the lowerings apart",
    )
    p.set_defaults(func=cmd_explain)

    p = add_command(
        subparsers,
        "audit",
        "for each call of a recorded manifest and target: whether the cached entry under its "
        "key was compiled from the IR Triton's frontend gives today (a hole if not), and with "
        "--compile whether a compile today gives its machine code (needs kernelcache[bridge])",
        variables=VARIABLES,
    )
    p.add_argument("manifest", metavar="MANIFEST", help=MANIFEST_HELP)
    p.add_argument(
        "--target",
        action="append",
        metavar="T",
        help="audit for these targets (repeatable; default: the recorded ones)",
    )
    p.add_argument(
        "--strict",
        action="store_true",
        help="fail on a kernel or call that cannot be audited too (uncached, a problem), not only on a hole",
    )
    p.add_argument(
        "--compile",
        action="store_true",
        help="also compile each cached kernel built from today's IR (nothing is written) and "
        "compare its machine code with the entry's, byte for byte: one that differs fails",
    )
    p.set_defaults(func=cmd_audit)

    p = add_command(
        subparsers,
        "run",
        "run a command whose `import jax_triton` gives the bridge (its kernels, and its child "
        "processes', compile through the kernel cache): kernelcache run -- python train.py",
    )
    p.add_argument("argv", nargs=argparse.REMAINDER, metavar="-- COMMAND [ARG ...]")
    p.set_defaults(func=cmd_run)

    jax_cache_command.register(subparsers)


def decision_content(data: bytes, meta: Mapping[str, Any]) -> Content:
    """What ``kernelcache show`` says a decision entry holds (see
    :func:`kernelcache.cli.register_content`)."""
    from ..entries.decisions import MAX_BYTES, parse

    found: Any = f"the decision is too large ({len(data):,} bytes)"
    if len(data) <= MAX_BYTES:
        try:
            doc = json.loads(data)
        except (ValueError, RecursionError):
            doc = None
        variants = doc.get("variants") if isinstance(doc, dict) else None
        if isinstance(variants, list) and all(isinstance(v, str) for v in variants):
            found = parse(data, variants)  # every field checked against the variants it names
        else:
            found = "the decision is not a JSON document that names its variants"
    if isinstance(found, str):
        return Content({"problem": found}, (f"not a usable decision: {found}",))
    first, *rest = found.describe()
    return Content(found.to_json(), (f"decision: {first}", *rest))


#: the rows of a read set ``show`` prints without ``-v``
SHOWN_READS = 5


def reads_view(value: Any, verbose: bool) -> tuple[str, list[str]] | None:
    """What ``kernelcache show`` prints of a read set (the ``reads`` field): how many rows and
    whether it is exact, then its first rows (every one with ``verbose``), each as ``[index]
    op operand (of row parent): what it found``; None for a value that is no read set (see
    :func:`kernelcache.cli.register_field_view`)."""
    from ..entries.metadata import FORMAT, problem

    if problem(value) is not None:
        return None
    doc = json.loads(value)
    if doc["format"] != FORMAT:
        return f"a read set of format {doc['format']}, an earlier version's: never used", []
    rows, partial = doc["rows"], doc.get("partial", [])
    state = f"partial ({len(partial)} reasons): the IR decides" if partial else "exact"
    shown = rows if verbose else rows[:SHOWN_READS]
    lines = [
        f"[{i}] {op} {json.dumps(arg)} (of {'the kernel' if up < 0 else f'[{up}]'}): {found}"
        for i, (up, op, arg, found) in enumerate(shown)
    ]
    lines += [f"partial: {why}" for why in (partial if verbose else partial[:1])]
    if len(rows) > len(shown):
        lines.append(f"... {len(rows) - len(shown):,} more rows (-v shows them)")
    return f"{len(rows):,} reads, {state}", lines


def _positive(text: str) -> int:
    """An argparse type: a whole number, 1 or more."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of 1 or more")
    return int(text)


def _toolchain():  # -> tuple[Judge, str]
    """The bridge's judge of entries for ``kernelcache import --dry-run`` (ImportError: the
    bridge's dependencies are missing). The target is ``$KERNELCACHE_TARGET``'s: finding the
    GPU would import jax, several times the memory an import is allowed."""
    from .toolchain import toolchain

    found = toolchain(find_gpu=False)
    return found.judge, found.describe()
