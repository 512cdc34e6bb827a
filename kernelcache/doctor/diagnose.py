"""``kernelcache doctor``: what an operator needs to know about a root and its environment.

Everything here only looks: the one thing written is a hidden probe file in the root, removed
at once (and the lock probe of :class:`~kernelcache.store.locks.Locker` where ``.locks/`` exists).
Each remote tier is asked once whether it answers. Versions of optional packages come from
their installed metadata: kernelcache imports neither jax nor triton here (a package may add
its own findings with :func:`register_report`: the bridge's imports jax when installed).
"""

from __future__ import annotations

import os
import platform
import stat
import sys
from typing import Any

from .._version import __version__
from ..config import environment_in_effect, parse_variable, variable
from ..stats.summary import lock_waits
from ..store.layout import LOCK_DIR, UNREADABLE_HINT, readable
from ..store.locks.locker import Locker
from .checks import (
    LOW_FREE_BYTES,
    LOW_FREE_FRACTION,
    NETWORK_FILESYSTEMS,
    filelock_check,
    filesystem,
    group_name,
    lock_waits_detail,
    probe_root,
    readonly_checks,
    remote_checks,
    root_file_checks,
    setting_checks,
    shared_dir_checks,
    shown,
    umask_text,
    user_name,
    versions,
)
from .report import CONTRIBUTIONS, Check, Report


def diagnose(root: str | None) -> Report:
    """Inspect ``root`` (None: it cannot be told, the environment names no usable root) and
    every setting; never raises for what it finds."""
    info: dict[str, Any] = {
        "kernelcache": __version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "versions": versions(),
        "environment": {k: shown(k, v) for k, v in environment_in_effect().items()},
    }
    checks, values = setting_checks()
    checks.append(filelock_check(info["versions"].get("filelock")))
    # each setting that can be used is checked further, whatever the others hold
    checks += readonly_checks(values.get("readonly_roots", ()))
    checks += remote_checks(values.get("remote") or "")
    for name, contribute in sorted(CONTRIBUTIONS.items()):
        found, more = contribute()
        info[name] = found
        checks += more
    info["lock_mode_configured"] = values.get("lock_mode")
    info["trust"] = values.get("trust")
    if root is None:
        checks.append(
            Check("root", "fail", "no cache root: KERNELCACHE_DIR cannot be used; pass --root")
        )
        info.update(
            filesystem=None,
            exists=False,
            umask=umask_text(),
            free_bytes=None,
            total_bytes=None,
            free_inodes=None,
            permissions=None,
            lock_mode=None,
        )
        return Report(root, info, tuple(checks))
    fs = filesystem(root)
    info["filesystem"] = fs
    if fs is None:
        checks.append(Check("filesystem", "warn", "cannot tell (no /proc/mounts)"))
    elif fs["type"].startswith(NETWORK_FILESYSTEMS) or fs["type"].startswith("fuse"):
        checks.append(
            Check(
                "filesystem",
                "warn",
                f"{fs['type']} at {fs['mount_point']}: a shared or network filesystem; every "
                "host must use the same lock mode (KERNELCACHE_LOCK_MODE)",
            )
        )
    elif fs["type"] == "tmpfs":
        checks.append(Check("filesystem", "warn", "tmpfs: the cache is lost at reboot"))
    else:
        checks.append(Check("filesystem", "ok", f"{fs['type']} at {fs['mount_point']}"))
    info["umask"] = umask_text()
    try:
        st = os.stat(root)
        problem = None if stat.S_ISDIR(st.st_mode) else ("fail", "is not a directory")
    except PermissionError as e:
        problem = ("fail", f"cannot be reached: {e.strerror} ({UNREADABLE_HINT})")
    except OSError:
        what = "is not a directory" if os.path.lexists(root) else "does not exist yet"
        problem = ("fail" if os.path.lexists(root) else "warn", what)
    info["exists"] = problem is None or problem[1].startswith("cannot be reached")
    if problem is not None:
        checks.append(Check("root", problem[0], f"{root} {problem[1]}"))
        info.update(free_bytes=None, total_bytes=None, free_inodes=None, permissions=None)
        info["lock_mode"] = None
        return Report(root, info, tuple(checks))
    if not readable(root):
        checks.append(
            Check(
                "readable",
                "fail",
                f"cannot list or read {root}: Permission denied ({UNREADABLE_HINT})",
            )
        )
    vfs = os.statvfs(root)
    free, total = vfs.f_bavail * vfs.f_frsize, vfs.f_blocks * vfs.f_frsize
    info.update(
        free_bytes=free, total_bytes=total, free_inodes=vfs.f_favail if vfs.f_files else None
    )
    if free < LOW_FREE_BYTES or (total and free / total < LOW_FREE_FRACTION):
        checks.append(
            Check("free space", "warn", f"only {free / 2**30:.2f} GiB free; prune the cache")
        )
    else:
        checks.append(
            Check("free space", "ok", f"{free / 2**30:.1f} GiB of {total / 2**30:.1f} GiB free")
        )
    if vfs.f_files and vfs.f_favail < 10_000:
        checks.append(Check("inodes", "warn", f"only {vfs.f_favail} inodes free"))
    mode = stat.S_IMODE(st.st_mode)
    permissions = {
        "mode": oct(mode),
        "owner": user_name(st.st_uid),
        "group": group_name(st.st_gid),
        "setgid": bool(mode & stat.S_ISGID),
        "group_writable": bool(mode & stat.S_IWGRP),
    }
    info["permissions"] = permissions
    probe_error, probed_mode = probe_root(root)
    permissions["writable"] = probe_error is None
    if probe_error is None:
        checks.append(Check("writable", "ok", "files can be created and removed"))
    else:
        remedy = (
            "use it as a read-only root via KERNELCACHE_READONLY_DIRS, or fix its permissions"
            if readable(root)
            else "fix its permissions"
        )
        checks.append(
            Check("writable", "fail", f"cannot write under {root}: {probe_error} ({remedy})")
        )
    if permissions["group_writable"] and not permissions["setgid"]:
        checks.append(
            Check(
                "sharing",
                "warn",
                "group-writable without the set-group-ID bit: new files get each user's own "
                f"group; run chmod g+s {root}",
            )
        )
    elif permissions["group_writable"] and int(info["umask"], 8) & 0o020:
        checks.append(
            Check(
                "sharing",
                "warn",
                f"umask {info['umask']} removes group write: files you create will not be "
                "writable by the group; use umask 002",
            )
        )
    if os.path.isdir(os.path.join(root, LOCK_DIR)):
        lock_mode: str | None = Locker(root, mode="auto").mode  # what the cache itself decides
    else:
        lock_mode = probed_mode
    info["lock_mode"] = lock_mode
    configured = values.get("lock_mode", "auto")
    if lock_mode == "soft" and configured == "flock":
        checks.append(
            Check("locks", "fail", "flock does not work here but KERNELCACHE_LOCK_MODE=flock")
        )
    elif lock_mode == "soft":
        checks.append(Check("locks", "warn", "flock does not work here: soft lock files"))
    elif lock_mode == "flock":
        checks.append(Check("locks", "ok", "flock works"))
    checks += shared_dir_checks(root)
    trust = values.get("trust") or parse_variable(variable("KERNELCACHE_TRUST"), {})
    checks += root_file_checks(root, trust)
    waits = lock_waits(root)
    if waits:
        checks.append(Check("lock waits", "warn", lock_waits_detail(waits)))
    return Report(root, info, tuple(checks))
