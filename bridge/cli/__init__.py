"""``kernelcache warm``, ``kernelcache tune``, ``kernelcache explain``, ``kernelcache audit``
and ``kernelcache jax-cache``: the bridge's subcommands of the ``kernelcache`` command (their arguments, and the
adapters that run them), the bridge's toolchain for ``kernelcache import --dry-run``
(:mod:`.toolchain`) and its report for ``kernelcache doctor`` (:mod:`bridge.jax_cache.command`).

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
import os
import sys
from collections.abc import Mapping
from typing import Any

from kernelcache.cli import (
    EXIT_OK,
    EXIT_PROBLEMS,
    Content,
    Output,
    UsageError,
    add_command,
    envelope,
    register_content,
    root_of,
)

from ..jax_cache import command as jax_cache_command

#: the modules the bridge's commands need: its extra's packages (``pip install
#: 'kernelcache[bridge]'``) and what they bring
BRIDGE_DEPENDENCIES = ("numpy", "jax", "jaxlib", "triton", "google.protobuf")


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
    to the other commands (importing :mod:`bridge.lowering.handoff` registers ``.handoff``; it
    imports neither jax nor triton)."""
    from kernelcache.doctor import register_report
    from kernelcache.toolchains import register_toolchain

    from .. import masquerade
    from ..entries.kinds import DECISION
    from ..lowering import handoff  # noqa: F401

    register_toolchain("bridge", _toolchain)
    register_report("jax_cache", jax_cache_command.jax_cache_report)
    register_report("jax_triton", masquerade.report)
    register_content(DECISION.ext, decision_content)

    p = add_command(
        subparsers,
        "warm",
        "compile a recorded manifest for other targets (needs kernelcache[bridge])",
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
        "for each call of a recorded manifest and target: hit, or the nearest entry of the "
        "same kernel and which components of the key differ (needs kernelcache[bridge])",
    )
    p.add_argument("manifest", metavar="MANIFEST", help=MANIFEST_HELP)
    p.add_argument(
        "--target",
        action="append",
        metavar="T",
        help="explain for these targets (repeatable; default: the recorded ones)",
    )
    p.set_defaults(func=cmd_explain)

    p = add_command(
        subparsers,
        "audit",
        "for each call of a recorded manifest and target: whether the cached entry under its "
        "key was compiled from the IR Triton's frontend gives today (a hole in the key if not), "
        "and which kernels are open (keyed by their IR) and why (needs kernelcache[bridge])",
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
        help="fail on an open kernel or a call that cannot be audited too, not only on a hole",
    )
    p.set_defaults(func=cmd_audit)

    p = add_command(
        subparsers,
        "run",
        "run a command whose `import jax_triton` gives the bridge (its kernels, and its child "
        "processes', compile through the kernel cache): kernelcache run -- python train.py",
    )
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="-- COMMAND [ARG ...]")
    p.set_defaults(func=cmd_run)

    jax_cache_command.register(subparsers)


def _absent(module: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(module) is None
    except ModuleNotFoundError:  # its parent package is absent
        return True


def _bridge_module(command: str, name: str):  # -> ModuleType
    """The module ``name`` that runs ``kernelcache <command>``, with the current directory first on
    ``sys.path`` (kernels are imported as ``python -m`` would), or a usage error naming the
    package to install when the bridge's dependencies are missing."""
    import importlib

    def needs(what: str) -> UsageError:
        return UsageError(
            f"kernelcache {command} needs the bridge's dependencies (cannot import {what}): "
            "pip install 'kernelcache[bridge]'"
        )

    missing = [m for m in BRIDGE_DEPENDENCIES if _absent(m)]
    if missing:
        raise needs(", ".join(missing))
    try:
        module = importlib.import_module(name)
    except ImportError as e:
        if (e.name or "").partition(".")[0] == "bridge":
            raise  # a module of the bridge itself is missing: not the user's to fix
        raise needs(e.name or str(e)) from None
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    return module


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


def _assignments(values: list[str] | None, option: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for value in values or ():
        name, sep, setting = value.partition("=")
        if not sep or not name.strip() or not setting.strip():
            raise UsageError(f"{option} {value!r}: use NAME=VALUE")
        out[name.strip()] = setting.strip()
    return out


def _positive(text: str) -> int:
    """An argparse type: a whole number, 1 or more."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of 1 or more")
    return int(text)


def cmd_tune(args: argparse.Namespace, out: Output) -> int:
    pins: dict[str, int] | None = None
    if args.pin:
        pins = {}
        for name, index in _assignments(args.pin, "--pin").items():
            if not index.isdigit():
                raise UsageError(f"--pin {name}={index}: INDEX is a config number, 0 or more")
            pins[name] = int(index)
    fill: dict[str, str | float] = {}
    for name, value in _assignments(args.fill, "--fill").items():
        try:
            fill[name] = float(value)
        except ValueError:
            if value not in ("random", "zeros", "ones"):
                raise UsageError(
                    f"--fill {name}={value}: use random, zeros, ones or a number"
                ) from None
            fill[name] = value
    tune = _bridge_module("tune", "bridge.cli.tune")
    import kernelcache

    from ..errors import ManifestError, PinError, TargetError
    from ..tune import measure

    if fill:
        measure.use(measure.JaxMeasurer(fill))
    root = root_of(args)
    try:
        results = tune.tune(
            args.manifest,
            kernelcache.Cache(root=root),
            pins=pins,
            targets=list(args.target or ()),
            force=args.force,
            gpus=args.gpus,
        )
    except (TargetError, ManifestError, PinError) as e:
        raise UsageError(str(e)) from None
    unknown = sorted(
        set(pins or ())
        - {r.kernel for r in results}
        - {r.kernel.rpartition(":")[2] for r in results}
    )
    if unknown:
        raise UsageError(f"--pin names kernels the manifest does not record: {', '.join(unknown)}")
    out.emit(
        lambda: {**envelope("tune", root), "results": [r.to_json() for r in results]},
        lambda: "\n".join(r.line() for r in results) or "no autotuned call in the manifest",
    )
    return EXIT_PROBLEMS if any(r.status == "skipped" for r in results) else EXIT_OK


def _toolchain():  # -> tuple[Judge, str]
    """The bridge's judge of entries for ``kernelcache import --dry-run`` (ImportError: the
    bridge's dependencies are missing). The target is ``$KERNELCACHE_TARGET``'s: finding the
    GPU would import jax, several times the memory an import is allowed."""
    from .toolchain import toolchain

    found = toolchain(find_gpu=False)
    return found.judge, found.describe()


def cmd_explain(args: argparse.Namespace, out: Output) -> int:
    explain = _bridge_module("explain", "bridge.cli.explain")
    import kernelcache

    from ..errors import ManifestError, TargetError

    root = root_of(args)
    try:
        results = explain.explain(args.manifest, kernelcache.Cache(root=root), args.target or ())
    except (ManifestError, TargetError) as e:
        raise UsageError(str(e)) from None
    counts = {
        s: sum(r.status == s for r in results) for s in ("hit", "miss", "left-out", "problem")
    }

    def human() -> str:
        lines = [r.line() for r in results]
        lines.append(
            f"{counts['hit']} hit, {counts['miss']} missed, {counts['left-out']} left out "
            f"(known not to compile), {counts['problem']} could not be explained"
        )
        return "\n".join(lines)

    out.emit(
        lambda: {
            **envelope("explain", root),
            "manifest": args.manifest,
            **{k.replace("-", "_"): v for k, v in counts.items()},
            "results": [r.to_json() for r in results],
        },
        human,
    )
    return EXIT_OK if counts["hit"] == len(results) else EXIT_PROBLEMS


def cmd_audit(args: argparse.Namespace, out: Output) -> int:
    audit = _bridge_module("audit", "bridge.cli.audit")
    import kernelcache

    from ..errors import ManifestError, TargetError

    root = root_of(args)
    try:
        results = audit.audit(args.manifest, kernelcache.Cache(root=root), args.target or ())
    except (ManifestError, TargetError) as e:
        raise UsageError(str(e)) from None
    counts = {s: sum(r.status == s for r in results) for s in audit.STATUSES}

    def human() -> str:
        lines = [r.line() for r in results]
        lines.append(", ".join(f"{n} {s}" for s, n in counts.items()))
        return "\n".join(lines)

    out.emit(
        lambda: {
            **envelope("audit", root),
            "manifest": args.manifest,
            **counts,
            "results": [r.to_json() for r in results],
        },
        human,
    )
    failing = counts["hole"] + (counts["open"] + counts["problem"] if args.strict else 0)
    return EXIT_PROBLEMS if failing else EXIT_OK


def cmd_run(args: argparse.Namespace, out: Output) -> int:
    """``kernelcache run -- COMMAND ...``: the command in place of this process, with the
    masquerade's folder first on its ``PYTHONPATH`` (and ``--root``'s root as its
    ``KERNELCACHE_DIR``)."""
    from .. import masquerade

    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        raise UsageError("kernelcache run -- COMMAND [ARG ...]: name the command to run")
    try:
        masquerade.api_version()
    except masquerade.MasqueradeError as e:
        raise UsageError(str(e)) from None
    env = masquerade.environment(dict(os.environ))
    if getattr(args, "root", None):
        env["KERNELCACHE_DIR"] = str(root_of(args))
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvpe(command[0], command, env)
    except OSError as e:
        raise UsageError(f"kernelcache run: cannot run {command[0]!r}: {e.strerror}") from None
    return EXIT_OK  # pragma: no cover  (exec does not return)


def cmd_warm(args: argparse.Namespace, out: Output) -> int:
    warm = _bridge_module("warm", "bridge.warm")
    return warm.run(
        args.manifest,
        list(args.target),
        root=root_of(args),
        json=out.json,
        jobs=args.jobs,
        allow_changed=args.allow_changed,
        devices=list(args.device or ()),
        all_configs=args.all_configs,
    )
