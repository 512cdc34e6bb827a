"""ccache's options where ``kernelcache`` expects a command: the ones with a command of the
same meaning run it (``kernelcache -s`` is ``kernelcache stats``), the others say what does
their work here. ``pip cache``'s commands, given as a command, are answered with the command
that does their work here (:data:`COMMANDS`; never run for them: ``purge`` deletes).

Invariant: only the first argument after the global options (``--root DIR``, ``--json``,
``-v``) is read, and only when it is one of ccache's options: a command's own options are never
rewritten, nor anything after ``--``.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import UsageError

#: ccache's option -> the command line that does the same here
ALIASES: dict[str, tuple[str, ...]] = {
    "-s": ("stats",),
    "--show-stats": ("stats",),
    "-z": ("stats", "--zero"),
    "--zero-stats": ("stats", "--zero"),
    "-C": ("clear",),
    "--clear": ("clear",),
    "-V": ("--version",),
}
#: ccache's option -> what does its work here
HINTS: dict[str, str] = {
    "-c": "`kernelcache prune` cleans up (add --max-size SIZE or --older-than AGE to trim)",
    "--cleanup": "`kernelcache prune` cleans up (add --max-size SIZE or --older-than AGE to trim)",
    "-M": "the size cap is KERNELCACHE_MAX_SIZE=SIZE in the jobs' environment; "
    "`kernelcache prune --max-size SIZE` trims to SIZE now",
    "--max-size": "the size cap is KERNELCACHE_MAX_SIZE=SIZE in the jobs' environment; "
    "`kernelcache prune --max-size SIZE` trims to SIZE now",
    "-p": "`kernelcache doctor` shows every setting and checks it",
    "--show-config": "`kernelcache doctor` shows every setting and checks it",
    "-x": "`kernelcache stats` shows the sizes (kernelcache does not compress entries)",
    "--show-compression": "`kernelcache stats` shows the sizes (kernelcache does not compress "
    "entries)",
}
#: ``pip cache``'s commands -> the command that does their work here (suggested, not run)
COMMANDS: dict[str, str] = {
    "purge": "clear",
    "list": "ls",
    "info": "stats",
}
#: the global options that take a value
_VALUED = ("--root",)


def _command_at(argv: Sequence[str]) -> int:
    """The index of the first argument that is not a global option (len(argv): none)."""
    i = 0
    while i < len(argv):
        token = argv[i]
        if token in _VALUED:
            i += 2
        elif token.startswith("--root=") or token in ("--json", "--verbose"):
            i += 1
        elif token.startswith("-v") and set(token[1:]) == {"v"}:
            i += 1
        else:
            return i
    return i


def translate(argv: Sequence[str]) -> list[str]:
    """``argv`` with a ccache option in the command's place replaced by its command.

    Raises:
        UsageError: it is a ccache option with no command of the same meaning; the message
            says what does its work here.
    """
    out = list(argv)
    i = _command_at(out)
    if i == len(out):
        return out
    option = out[i].split("=", 1)[0]
    if option in ALIASES:
        return [*out[:i], *ALIASES[option], *out[i + 1 :]]
    if option in HINTS:
        raise UsageError(f"{option} is ccache's option: here, {HINTS[option]}")
    return out
