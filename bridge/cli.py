"""``kernelcache warm`` and ``kernelcache tune``: the bridge's subcommands of the ``kernelcache``
command.

Registered through the entry-point group ``kernelcache.commands``. Importing this module imports
neither jax nor triton: they are imported when the command runs, and their absence is a usage
error that names the package to install.
"""

from __future__ import annotations

import argparse

from kernelcache.cli import UsageError, add_command, root_of
from kernelcache.cli.output import EXIT_OK, EXIT_PROBLEMS, Output, envelope

#: top-level modules whose absence means the bridge's extra is not installed
_BRIDGE_DEPENDENCIES = {"bridge", "jax", "jaxlib", "triton", "google", "protobuf"}


def compile_target(text: str) -> str:
    """A target to compile for, as an argparse ``type``: a name, never a pattern (``ls``,
    ``prune`` and ``export`` take patterns; ``warm`` and ``tune`` need each target named)."""
    if any(c in text for c in "*?["):
        raise argparse.ArgumentTypeError(
            f"{text!r} is a pattern: name each target to compile for (e.g. --target cuda:90 "
            "--target hip:gfx942)"
        )
    return text


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``warm`` and ``tune`` to the ``kernelcache`` command, and make the bridge's
    directories of a root known to the other commands (importing :mod:`bridge.handoff`
    registers ``.handoff``; it imports neither jax nor triton)."""
    from . import handoff  # noqa: F401

    p = add_command(
        subparsers,
        "warm",
        "compile a recorded manifest for other targets (needs kernelcache[bridge])",
    )
    p.add_argument("manifest", metavar="MANIFEST")
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
        "repeatable), compile only the chosen config (pinned decisions count for every device)",
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
    p.add_argument("manifest", metavar="MANIFEST")
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
        type=compile_target,
        metavar="T",
        help="tune for these targets (repeatable; default: the recorded ones)",
    )
    p.add_argument(
        "--fill",
        action="append",
        metavar="[KERNEL:]PARAM=VALUE",
        help="fill an array parameter when measuring with random, zeros, ones or a number "
        "(default: random floats, zero integers)",
    )
    p.add_argument("--force", action="store_true", help="measure again where a decision exists")
    p.set_defaults(func=cmd_tune)


def _bridge_module(name: str):  # -> ModuleType
    """``bridge.<name>`` for ``kernelcache <name>``, or a usage error naming the package to
    install."""
    import importlib

    try:
        return importlib.import_module(f"bridge.{name}")
    except ImportError as e:
        missing = (e.name or "").split(".")[0]
        if missing and missing not in _BRIDGE_DEPENDENCIES:
            raise
        raise UsageError(
            f"kernelcache {name} needs the bridge and its dependencies (cannot import "
            f"{e.name or 'bridge.' + name}): pip install 'kernelcache[bridge]'"
        ) from None


def _assignments(values: list[str] | None, option: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for value in values or ():
        name, sep, setting = value.partition("=")
        if not sep or not name.strip() or not setting.strip():
            raise UsageError(f"{option} {value!r}: use NAME=VALUE")
        out[name.strip()] = setting.strip()
    return out


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
    tune = _bridge_module("tune")
    import kernelcache

    from . import tuning

    if fill:
        tuning.use(tuning.JaxMeasurer(fill))
    root = root_of(args)
    results = tune.tune(
        args.manifest,
        kernelcache.Cache(root=root),
        pins=pins,
        targets=list(args.target or ()),
        force=args.force,
    )
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


def cmd_warm(args: argparse.Namespace, out: Output) -> int:
    warm = _bridge_module("warm")
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
