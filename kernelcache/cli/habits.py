"""ccache's options where ``kernelcache`` expects a command: the ones with a command of the
same meaning run it (``kernelcache -s`` is ``kernelcache stats``, ``-M 50G`` and ``-o
max_size=50G`` set the root's own configuration file through ``config --set``, ``-p`` shows
every setting and its origin, ``--evict-older-than 30d`` is ``prune --older-than 30d``), the
others say what does their work here; ``-d DIR``/``--dir DIR`` name the root as ``--root``
does. ``pip cache``'s commands, given as a command or after the word ``cache`` (``kernelcache
cache dir``), are answered with the command that does their work here (:data:`PIP_CACHE`;
never run for them: ``purge`` deletes).

Invariant: only the first argument after the global options (``--root DIR``, ``-d DIR``,
``--json``, ``-v``) is read, and only when it is one of ccache's options or ``cache``: a
command's own options are never rewritten, nor anything after ``--``.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import UsageError

#: ccache's option -> the command line that does the same here (its value, if it takes one,
#: follows it; see :data:`VALUE_INTO`)
ALIASES: dict[str, tuple[str, ...]] = {
    "-s": ("stats",),
    "--show-stats": ("stats",),
    "-z": ("stats", "--zero"),
    "--zero-stats": ("stats", "--zero"),
    "-C": ("clear",),
    "--clear": ("clear",),
    "-V": ("--version",),
    "-p": ("config",),
    "--show-config": ("config",),
    "-o": ("config", "--set"),
    "--set-config": ("config", "--set"),
    "-M": ("config", "--set"),
    "--max-size": ("config", "--set"),
    "--evict-older-than": ("prune", "--older-than"),
}
#: ccache's options whose value becomes a setting: ``-M 5G`` is ``config --set max_size=5G``
VALUE_INTO: dict[str, str] = {"-M": "max_size=", "--max-size": "max_size="}
#: ccache's options that take a value
VALUED: frozenset[str] = frozenset({"-o", "--set-config", "--evict-older-than", *VALUE_INTO})
#: ccache's option -> what does its work here
HINTS: dict[str, str] = {
    "-c": "`kernelcache prune` cleans up (add --max-size SIZE or --older-than AGE to trim)",
    "--cleanup": "`kernelcache prune` cleans up (add --max-size SIZE or --older-than AGE to trim)",
    "-x": "`kernelcache stats` shows the sizes; `kernelcache -p` shows whether new entries are "
    "compressed (the compression setting)",
    "--show-compression": "`kernelcache stats` shows the sizes; `kernelcache -p` shows whether "
    "new entries are compressed (the compression setting)",
}
#: ``pip cache``'s commands -> the command that does their work here (suggested, not run)
COMMANDS: dict[str, str] = {
    "purge": "clear",
    "list": "ls",
    "info": "stats",
}
#: ``pip cache``'s commands given after the word ``cache`` (``kernelcache cache dir``) -> ours
PIP_CACHE: dict[str, str] = {**COMMANDS, "dir": "dir", "remove": "prune --kernel PATTERN"}
#: the global options that take a value (``-d``, ``--dir``: ccache's names of ``--root``)
_VALUED = ("--root", "-d", "--dir")


def _command_at(argv: Sequence[str]) -> int:
    """The index of the first argument that is not a global option (len(argv): none)."""
    i = 0
    while i < len(argv):
        token = argv[i]
        if token in _VALUED:
            i += 2
        elif token.startswith(("--root=", "--dir=")) or token in ("--json", "--verbose"):
            i += 1
        elif token.startswith("-v") and set(token[1:]) == {"v"}:
            i += 1
        else:
            return i
    return i


_EXAMPLES = {
    "-M": "-M 50G",
    "--max-size": "--max-size 50G",
    "-o": "-o max_size=50G",
    "--set-config": "--set-config max_size=50G",
    "--evict-older-than": "--evict-older-than 30d",
}


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
    if out[i] == "cache":  # pip's habit: `pip cache dir`
        raise UsageError(_pip_cache(out[i + 1] if i + 1 < len(out) else None))
    option, equals, value = out[i].partition("=")
    if option in ALIASES:
        rest = out[i + 1 :]
        if option in VALUED:
            if not equals and not rest:
                raise UsageError(f"{option} takes a value, e.g. {_EXAMPLES[option]}")
            value, rest = (value, rest) if equals else (rest[0], rest[1:])
            first = [*ALIASES[option], VALUE_INTO.get(option, "") + value]
            if first[0] == "config":  # ccache takes several: -o a=1 -o b=2 -M 5G
                return [*out[:i], *first, *_more_settings(rest)]
            return [*out[:i], *first, *rest]
        return [*out[:i], *ALIASES[option], *rest]
    if option in HINTS:
        raise UsageError(f"{option} is ccache's option: here, {HINTS[option]}")
    return out


def _pip_cache(given: str | None) -> str:
    """What is said of ``kernelcache cache GIVEN``: the command that does its work here."""
    ours = PIP_CACHE.get(given or "")
    if ours is not None:
        return f"`pip cache {given}` is `kernelcache {ours}` here: the command names the cache"
    known = ", ".join(f"{k}: `kernelcache {v}`" for k, v in PIP_CACHE.items())
    return f"kernelcache has no `cache` command: the command itself is the cache's ({known})"


def _more_settings(rest: list[str]) -> list[str]:
    """``rest`` after a first ``-o``/``-M``, each further ``-o KEY=VALUE`` or ``-M SIZE`` made
    ``--set`` (any other argument is left for ``config`` to judge)."""
    out: list[str] = []
    tokens = iter(rest)
    for token in tokens:
        option, equals, value = token.partition("=")
        if option in VALUED and ALIASES[option][0] == "config":
            value = value if equals else next(tokens, "")
            out += ["--set", VALUE_INTO.get(option, "") + value]
        else:
            out.append(token)
    return out
