"""``kernelcache doctor``: the diagnosis of a root and its environment (see
:mod:`kernelcache.doctor`).
"""

from __future__ import annotations

import argparse
import os

from .common import Context, Subparsers, add_command
from .output import EXIT_OK, EXIT_PROBLEMS, Output, envelope, human_size, printable


def register(subparsers: Subparsers) -> None:
    p = add_command(
        subparsers,
        "doctor",
        "the root, its filesystem, free space, permissions, locks, versions, environment",
        uses=(),  # (it checks every variable, each on its own line)
    )
    p.set_defaults(func=cmd_doctor)


def cmd_doctor(args: argparse.Namespace, out: Output) -> int:
    from ..doctor.diagnose import diagnose
    from ..errors import ConfigError

    context: Context = args.context
    try:
        root: str | None = context.root
    except ConfigError:
        root = None  # KERNELCACHE_DIR cannot be used: reported with every other setting
    report = diagnose(root)
    doc = {
        **envelope("doctor", root),
        **report.info,
        "checks": [c.to_json() for c in report.checks],
        "ok": report.ok,
    }

    def human() -> str:
        info = report.info
        fs = info.get("filesystem") or {}
        if root is None:
            lines = ["Cache root:   (none: KERNELCACHE_DIR cannot be used)"]
        else:
            state = "is not a directory" if os.path.lexists(root) else "does not exist yet"
            lines = [f"Cache root:   {root}" + ("" if info["exists"] else f" ({state})")]
        if fs:
            lines.append(f"Filesystem:   {fs['type']} ({fs['source']} on {fs['mount_point']})")
        if info.get("free_bytes") is not None:
            lines.append(
                f"Free space:   {human_size(info['free_bytes'])} of {human_size(info['total_bytes'])}"
                + (
                    f", {info['free_inodes']:,} inodes"
                    if info.get("free_inodes") is not None
                    else ""
                )
            )
        perm = info.get("permissions")
        if perm:
            lines.append(
                f"Permissions:  {perm['mode']} {perm['owner']}:{perm['group']}"
                f"{' setgid' if perm['setgid'] else ''}"
                f"{'' if perm['writable'] else ' (not writable)'}; umask {info['umask']}"
            )
        if info.get("lock_mode"):
            lines.append(
                f"Locks:        {info['lock_mode']} "
                f"(configured: {info.get('lock_mode_configured') or '?'})"
            )
        lines.append(f"kernelcache:  {info['kernelcache']} on Python {info['python']}")
        for name, version in info["versions"].items():
            lines.append(f"  {name + ':':13} {version or '-'}")
        lines.append("Checks:")
        for c in report.checks:
            lines.append(printable(f"  [{c.status:4}] {c.name}: {c.detail}"))
        return "\n".join(lines)

    out.emit(doc, human)
    return EXIT_OK if report.ok else EXIT_PROBLEMS
