"""The adapters that run the bridge's commands (``cmd_warm``, ``cmd_tune``, ``cmd_explain``,
``cmd_audit``, ``cmd_run``): from the parsed arguments to the module that does the work, and
from what it returns to the output and the exit code. Their arguments are declared by
:func:`bridge.cli.register`, which adds the commands.

Invariants: importing this module imports neither jax, triton nor numpy. The module that runs a
command is imported when the command runs, through :func:`_bridge_module`, which first checks
the bridge's dependencies (:data:`BRIDGE_DEPENDENCIES`), makes their absence a usage error that
names the package to install, and puts the current directory first on ``sys.path``, so that the
kernels a manifest names import as ``python -m`` would import them. A user's mistake (a bad
``--pin`` or ``--fill``, a manifest, target or pin the command refuses) is a
:class:`~kernelcache.cli.UsageError`, never a traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING

from kernelcache.cli import (
    EXIT_OK,
    EXIT_PROBLEMS,
    Output,
    UsageError,
    envelope,
    fail,
    root_of,
)

if TYPE_CHECKING:
    from kernelcache import Cache

#: how ``kernelcache run`` ends when its command cannot be run, as a shell's does: no such
#: command, or one found that cannot be run (not executable, not a program)
EXIT_NOT_FOUND = 127
EXIT_NOT_EXECUTABLE = 126
#: the modules the bridge's commands need: its extra's packages (``pip install
#: 'kernelcache[bridge]'``) and what they bring
BRIDGE_DEPENDENCIES = ("numpy", "jax", "jaxlib", "triton", "google.protobuf")


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
    tune = _bridge_module("tune", "bridge.cli.tune")
    import kernelcache

    from ..exceptions import ManifestError, PinError, TargetError
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


def cmd_explain(args: argparse.Namespace, out: Output) -> int:
    explain = _bridge_module("explain", "bridge.cli.explain")
    import kernelcache

    from ..exceptions import ManifestError, TargetError

    root = root_of(args)
    if args.lowerings:
        if args.manifest is not None or args.target or args.reads:
            raise UsageError("--lowerings takes no MANIFEST, no --target and no --reads")
        return _explain_lowerings(kernelcache.Cache(root=root), root, out)
    if args.manifest is None:
        raise UsageError("give a MANIFEST of recorded calls to explain, or --lowerings")
    try:
        results = explain.explain(args.manifest, kernelcache.Cache(root=root), args.target or ())
    except (ManifestError, TargetError) as e:
        raise UsageError(str(e)) from None
    counts = {
        s: sum(r.status == s for r in results) for s in ("hit", "miss", "left-out", "problem")
    }

    def human() -> str:
        lines = [r.line(reads=args.reads) for r in results]
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


def _explain_lowerings(cache: Cache, root: str, out: Output) -> int:
    """``explain --lowerings``: the calls stored as lowerings apart (:mod:`.splits`)."""
    splits = _bridge_module("explain", "bridge.cli.splits")
    found = splits.splits(cache)

    def human() -> str:
        lines = [s.line() for s in found.splits]
        lines.append(
            f"{len(found.splits)} call(s) lowered apart, among {found.entries} lowering entries "
            f"({found.unrecorded} record no steps: written by an earlier version)"
        )
        return "\n".join(lines)

    out.emit(
        lambda: {
            **envelope("explain", root),
            "entries": found.entries,
            "unrecorded": found.unrecorded,
            "splits": [s.to_json() for s in found.splits],
        },
        human,
    )
    return EXIT_PROBLEMS if found.splits else EXIT_OK


def cmd_audit(args: argparse.Namespace, out: Output) -> int:
    audit = _bridge_module("audit", "bridge.cli.audit")
    import kernelcache

    from ..exceptions import ManifestError, TargetError

    root = root_of(args)
    try:
        results = audit.audit(
            args.manifest, kernelcache.Cache(root=root), args.target or (), recompile=args.compile
        )
    except (ManifestError, TargetError) as e:
        raise UsageError(str(e)) from None
    counts = {s: sum(r.status == s for r in results) for s in audit.STATUSES}

    def human() -> str:
        lines = [r.line() for r in results]
        lines.append(", ".join(f"{n} {s}" for s, n in counts.items()))
        unchecked = sum(counts[s] for s in audit.UNCHECKED)
        if unchecked and not args.strict:
            lines.append(
                f"{unchecked} could not be checked ({', '.join(audit.UNCHECKED)}): "
                "--strict makes that a failure"
            )
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
    failing = counts["hole"] + counts["differs"]
    failing += sum(counts[s] for s in audit.UNCHECKED) if args.strict else 0
    return EXIT_PROBLEMS if failing else EXIT_OK


def cmd_run(args: argparse.Namespace, out: Output) -> int:
    """``kernelcache run -- COMMAND ...``: the command in place of this process, with the
    masquerade's folder first on its ``PYTHONPATH`` (and ``--root``'s root as its
    ``KERNELCACHE_DIR``). A command that cannot be run ends it as a shell would:
    :data:`EXIT_NOT_FOUND`, or :data:`EXIT_NOT_EXECUTABLE`."""
    from .. import masquerade

    command = list(args.argv)
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
    problem = masquerade.interpreter_problem(command, env)
    if problem is not None:  # said first, then run: its own error follows
        sys.stderr.write(f"kernelcache run: warning: {problem}\n")
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvpe(command[0], command, env)
    except FileNotFoundError:
        return fail(f"{command[0]}: command not found", EXIT_NOT_FOUND, "run", out.json)
    except OSError as e:  # found, and not a program this user may run (or not one at all)
        said = f"{command[0]}: cannot run it: {e.strerror}"
        return fail(said, EXIT_NOT_EXECUTABLE, "run", out.json)
    return EXIT_OK  # pragma: no cover  (exec does not return)


def cmd_warm(args: argparse.Namespace, out: Output) -> int:
    warm = _bridge_module("warm", "bridge.cli.warm")
    return warm.run(
        args.manifest,
        list(args.target),
        root=root_of(args),
        json=out.json,
        disabled=args.context.settings.disable,
        jobs=args.jobs,
        allow_changed=args.allow_changed,
        devices=list(args.device or ()),
        all_configs=args.all_configs,
    )
