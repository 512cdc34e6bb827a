"""The commands that serve an operator's shell: ``dir`` (the cache root alone, for
``cd "$(kernelcache dir)"``) and ``completion`` (the script that completes ``kernelcache``'s
commands and options in bash, zsh or fish).

Completion is argcomplete's: the script asks the ``kernelcache`` command itself (run with
``_ARGCOMPLETE`` set, :func:`complete`) what may follow the words typed, so that the commands
packages add (``kernelcache.commands``) complete as soon as they are installed, with no script
to make again.

Invariant: ``dir`` writes the root and nothing else on standard output (warnings go to standard
error), whether or not the root exists yet.
"""

from __future__ import annotations

import argparse

from .common import ROOT, Context, Subparsers, add_command
from .output import EXIT_OK, Output, envelope

#: the shells ``completion`` writes a script for
SHELLS = ("bash", "zsh", "fish")


def register(subparsers: Subparsers) -> None:
    p = add_command(
        subparsers,
        "dir",
        "print the cache root alone (--root, else $KERNELCACHE_DIR, else the user cache "
        'directory), e.g. for cd "$(kernelcache dir)"',
        uses=ROOT,
    )
    p.set_defaults(func=cmd_dir)
    p = add_command(
        subparsers,
        "completion",
        "print the script that completes kernelcache's commands and options in SHELL",
        uses=(),
    )
    p.add_argument("shell", choices=SHELLS, metavar="SHELL", help="the shell: " + ", ".join(SHELLS))
    p.epilog = (
        'Install it with `eval "$(kernelcache completion bash)"` in ~/.bashrc, '
        '`eval "$(kernelcache completion zsh)"` in ~/.zshrc (after compinit), or '
        "`kernelcache completion fish > ~/.config/fish/completions/kernelcache.fish`."
    )
    p.set_defaults(func=cmd_completion)


def cmd_dir(args: argparse.Namespace, out: Output) -> int:
    context: Context = args.context
    root = context.root
    out.emit(envelope("dir", root), lambda: root)
    return EXIT_OK


def cmd_completion(args: argparse.Namespace, out: Output) -> int:
    import argcomplete

    script = argcomplete.shellcode(["kernelcache"], shell=args.shell)
    out.emit(
        {**envelope("completion", None), "shell": args.shell, "script": script}, lambda: script
    )
    return EXIT_OK


def complete(parser: argparse.ArgumentParser) -> None:
    """Answer the completion script and exit, when the shell runs the command for completions
    (``_ARGCOMPLETE`` in the environment); otherwise return at once."""
    import argcomplete

    argcomplete.autocomplete(parser)
