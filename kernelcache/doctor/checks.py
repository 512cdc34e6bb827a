"""The checks ``kernelcache doctor`` runs, one function each: the file system of a root, installed
versions, the settings, read-only roots, remote tiers, filelock. Each only looks; none raises
for what it finds.
"""

from __future__ import annotations

import contextlib
import fcntl
import grp
import importlib.metadata
import os
import pwd
import stat
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from ..config import (
    VARIABLES,
    ConfigError,
    origins,
    parse_variable,
    unknown_variables,
    variable,
    variables,
)
from ..errors import MissingDependency
from ..keys import META_EXT, split_entry_name
from ..optional import require
from ..process import HOST, pid_alive, printable
from ..signing_key import check_signing_key, read_key_file
from ..store.layout import create_exclusive, read_settings, shared_directories
from ..store.removal import remove_own_file
from .report import Check

#: packages whose installed versions are reported (never imported)
PACKAGES = (
    "jax",
    "jaxlib",
    "triton",
    "xxhash",
    "platformdirs",
    "filelock",
    "zstandard",
    "redis",
    "obstore",
)
#: the oldest filelock whose descriptor locks the cache uses (see kernelcache/store/locks/)
MIN_FILELOCK = (3, 30)
NETWORK_FILESYSTEMS = ("nfs", "nfs4", "cifs", "smb3", "smbfs", "lustre", "gpfs", "beegfs", "ceph")
LOW_FREE_BYTES = 1 << 30
LOW_FREE_FRACTION = 0.05
#: the lock waits noted in the statistics logs that doctor shows (the latest)
SHOWN_LOCK_WAITS = 3


def _unescape(field_: str) -> str:
    """/proc/mounts escapes space, tab, newline and backslash as octal."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field_ = field_.replace(code, char)
    return field_


def filesystem(path: str, mounts: str = "/proc/mounts") -> dict[str, str] | None:
    """The mount holding ``path`` (its nearest existing ancestor): type, mount point, source."""
    probe = os.path.realpath(path)
    while not os.path.exists(probe) and probe != os.path.dirname(probe):
        probe = os.path.dirname(probe)
    best: dict[str, str] | None = None
    try:
        with open(mounts, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.split()
        if len(parts) < 3:
            continue
        source, point, fstype = _unescape(parts[0]), _unescape(parts[1]), parts[2]
        inside = probe == point or probe.startswith(point.rstrip("/") + "/") or point == "/"
        if inside and (best is None or len(point) >= len(best["mount_point"])):
            best = {"type": fstype, "mount_point": point, "source": source}
    return best


def versions() -> dict[str, str | None]:
    """Installed versions of kernelcache's optional and runtime packages (None: absent)."""
    found: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    return found


def user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def group_name(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


def probe_root(root: str) -> tuple[str | None, str | None]:
    """Create, flock and remove a hidden file in ``root``: (why it cannot be written or None,
    "flock"/"soft"/None for whether flock works on it).

    The probe creates no directory: run by root on another user's cache, doctor must not leave
    root-owned ``.tmp/`` or ``.locks/`` directories that the cache's users could not write.
    """
    name = f".kernelcache-doctor-{os.getpid()}-{uuid.uuid4().hex}.tmp"
    try:
        dfd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as e:
        return e.strerror or str(e), None
    try:
        fd = create_exclusive(name, dfd)
    except OSError as e:
        os.close(dfd)
        return e.strerror or str(e), None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            mode: str | None = "flock"
        except OSError:
            mode = "soft"
        os.close(fd)
        remove_own_file(dfd, name)
    except OSError as e:
        return e.strerror or str(e), None
    finally:
        os.close(dfd)
    return None, mode


def shown(name: str, raw: str) -> str:
    """A variable's value as doctor shows it: a secret as ``***``, remote URLs without their
    passwords."""
    if variable(name).secret:
        return "***"
    if name == "KERNELCACHE_REMOTE":
        from ..remote import redact, split_urls

        return " ".join(redact(url) for url in split_urls(raw))
    return raw


def _check_deeper(name: str, value: Any, env: Mapping[str, str]) -> None:
    """Checks beyond a variable's own parser: the remote URL as its tier reads it, the
    signing key file as the cache reads it (and not beside a key given directly), the roots
    as the cache uses them (a relative path, a ``$VAR`` no shell expanded).

    Raises:
        ConfigError: the value cannot be used (the message never shows a secret).
    """
    if name == "KERNELCACHE_REMOTE" and value:
        from ..remote import check_url

        check_url(value)
    if name == "KERNELCACHE_DIR" and value:
        from ..store.layout import path_problem

        problem = path_problem(value)
        if problem is not None:
            raise ConfigError(problem)
    if name == "KERNELCACHE_READONLY_DIRS" and value:
        from ..cache import readonly_problem

        bad = [os.fspath(r) for r in value if readonly_problem(r) is not None]
        if bad:
            raise ConfigError(
                f"{', '.join(bad)} cannot be used as read-only roots (see the read-only checks)"
            )
    if name == "KERNELCACHE_SIGNING_KEY" and value:
        check_signing_key(value, name)
    if name == "KERNELCACHE_SIGNING_KEY_FILE" and value:
        if env.get("KERNELCACHE_SIGNING_KEY", "").strip():
            raise ConfigError("set KERNELCACHE_SIGNING_KEY or this, not both")
        read_key_file(value)


def setting_checks(
    environ: Mapping[str, str] | None = None,
) -> tuple[list[Check], dict[str, Any]]:
    """One check per declared variable (:func:`kernelcache.config.variables`): its value (or
    default) and whether it can be used, and a warning for each ``KERNELCACHE_*`` name no
    package declares (with the declared name nearest to it). Returns the checks and the
    values of kernelcache's variables that can be used, by their settings' field (a bad
    variable leaves the others usable)."""
    env = os.environ if environ is None else environ
    checks: list[Check] = []
    values: dict[str, Any] = {}
    for var in variables():
        raw = env.get(var.name)
        given = raw is not None and raw.strip() != ""
        try:
            value = parse_variable(var, env)  # (its message names the variable and value)
        except ConfigError as e:
            checks.append(Check(var.name, "fail", f"{e} (fix or unset it)"))
            continue
        if var in VARIABLES:
            values[var.field] = value
        try:
            _check_deeper(var.name, value, env)
        except ConfigError as e:
            message = str(e)
            message = message if message.startswith(var.name) else f"{var.name}: {message}"
            checks.append(Check(var.name, "fail", f"{message} (fix or unset it)"))
            continue
        if given:
            detail = shown(var.name, raw or "").strip()
        else:
            detail = f"{var.shown_default} (not set: the default)"
        checks.append(Check(var.name, "ok", detail))
    for name, near in unknown_variables(env):
        hint = f"did you mean {near}? " if near else ""
        checks.append(
            Check(
                name,
                "warn",
                f"no such variable: ignored ({hint}`kernelcache doctor --json` lists the "
                "variables under checks)",
            )
        )
    return checks, values


def root_file_checks(root: str, trust: str) -> list[Check]:
    """The root's own configuration file (``kernelcache -M``/``-o``): a check per value it
    sets that can be used or not (one the environment overrides said so), and one per line
    or problem that keeps it, or the whole file, from being used."""
    found = read_settings(root, trust)
    if not found.exists:
        return []
    checks = [Check(found.path, "warn", problem) for problem in found.problems]
    given = found.as_settings()
    for var, _value, origin in origins(file=given):
        if var.name not in given:
            continue
        name = f"{var.key} ({found.path})"
        try:
            parse_variable(var, environ={}, file=given)
        except ConfigError as e:
            checks.append(Check(name, "fail", f"{e} (fix it with kernelcache -o {var.key}=...)"))
            continue
        over = f": overridden by the environment's {var.name}" if origin == "environment" else ""
        checks.append(Check(name, "ok", f"{printable(given[var.name][1])}{over}"))
    if not checks:
        checks.append(Check(found.path, "ok", "sets nothing"))
    return checks


def readonly_checks(roots: Sequence[os.PathLike[str] | str]) -> list[Check]:
    """One check per read-only root: an absolute path to a directory that holds entries."""
    from ..cache import readonly_problem

    checks = []
    for root in roots:
        name = f"read-only {os.fspath(root)}"
        problem = readonly_problem(root)
        if problem is not None:
            checks.append(Check(name, "fail", f"KERNELCACHE_READONLY_DIRS: {problem}"))
            continue
        try:
            with os.scandir(root) as it:
                entries = sum(
                    1 for e in it if (split_entry_name(e.name) or ("", ""))[1] == META_EXT
                )
        except OSError as e:
            checks.append(
                Check(name, "fail", f"cannot list it: {e.strerror} (fix its permissions)")
            )
            continue
        if entries:
            checks.append(Check(name, "ok", f"entries: {entries:,}"))
        else:
            checks.append(
                Check(
                    name,
                    "warn",
                    "holds no entries: nothing is served from it (warm it, or "
                    "check that it is the layer you meant)",
                )
            )
    return checks


def remote_checks(spec: str) -> list[Check]:
    """Whether each tier of ``spec`` (``$KERNELCACHE_REMOTE``) answers: one bounded request each
    (a Redis PING within the URL's timeout). A URL that cannot be used is its variable's check."""
    from ..remote import check_url, client_of, probe, redact, split_urls

    checks = []
    for url in split_urls(spec):
        try:
            check_url(url)
        except ConfigError:
            continue  # (reported by the variable's own check)
        try:
            module = client_of(url)
            if module is not None:
                require(module, "this tier")
        except MissingDependency as e:
            checks.append(Check(f"remote {redact(url).split('?', 1)[0]}", "fail", str(e)))
            continue
        found = probe(url)
        name = f"remote {found['tier']}"
        ms = found["seconds"] * 1000
        if found["up"]:
            checks.append(Check(name, "ok", f"answers ({ms:.1f} ms)"))
        else:
            checks.append(
                Check(
                    name,
                    "fail",
                    f"does not answer after {ms:.0f} ms: {found['error']} (start the server, or "
                    "fix KERNELCACHE_REMOTE; jobs run without the tier meanwhile)",
                )
            )
    return checks


def filelock_check(version: str | None) -> Check:
    """Whether the installed filelock can take the cache's exclusive locks."""
    from packaging.version import InvalidVersion, Version

    need = ".".join(map(str, MIN_FILELOCK))
    fix = f"pip install 'filelock>={need},<5'"
    if version is None:
        return Check("filelock", "fail", f"not installed: the cache works without locks; {fix}")
    try:
        release = Version(version).release
    except InvalidVersion:
        release = ()
    if release[:2] < MIN_FILELOCK:
        return Check(
            "filelock",
            "fail",
            f"{version} is older than {need}: the cache works without locks; {fix}",
        )
    return Check("filelock", "ok", version)


def shared_dir_checks(root: str) -> list[Check]:
    """A warning for each directory every user writes into (``.locks``, ``.stats``, and those
    packages registered as shared) that others can write but that is not sticky: any of them
    may rename or replace another user's lock files, scan index or other files there."""
    checks = []
    for name in sorted(shared_directories()):
        try:
            st = os.lstat(os.path.join(root, name))
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode) and st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
            checks.append(
                Check(
                    f"{name} sticky",
                    "warn",
                    f"{name} is writable by others but not sticky: any of them may replace "
                    f"another user's files there; run chmod +t {os.path.join(root, name)}",
                )
            )
    return checks


def lock_waits_detail(waits: list[dict[str, Any]]) -> str:
    """The latest lock waits a job noted (see :func:`kernelcache.stats.note_lock_wait`), each
    with who held the lock and whether it still runs."""
    parts = []
    for wait in waits[-SHOWN_LOCK_WAITS:]:
        holder = wait["holder"]
        if holder is None:
            who = "held by a process that cannot be told"
        else:
            since = holder["since"]
            held_for = wait["time"] - since if since is not None else wait["seconds"]
            alive = holder["host"] != HOST or pid_alive(holder["pid"])
            who = (
                f"held by pid {holder['pid']} on host {holder['host']} for "
                f"{'at least ' if since is None else ''}{held_for:.0f}s"
                f"{' (still running)' if alive else ' (gone now)'}"
            )
        parts.append(
            f"pid {wait['pid']} on host {wait['host']} waited {wait['seconds']:.0f}s for the "
            f"lock of {wait['key'][:16]}, {who}"
        )
    return f"{len(waits)} lock waits timed out; latest: " + "; ".join(parts)


def umask_text() -> str:
    with contextlib.suppress(OSError):
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return "0o" + line.split()[1].lstrip("0").rjust(3, "0")
    current = os.umask(0o022)  # no /proc: read it the portable way and put it back
    os.umask(current)
    return oct(current)
