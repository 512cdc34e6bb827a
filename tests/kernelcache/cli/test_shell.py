"""The commands that serve the shell, through the real console script: ``kernelcache dir``
prints the root alone (as ``pip cache dir`` does), and ``kernelcache completion SHELL`` prints
a script that real bash, zsh and fish load and complete ``kernelcache``'s commands with."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from cli_support import KERNELCACHE, kc
from support import child_env


def _shell_env(tmp_path: Path) -> dict[str, str]:
    """An environment where ``kernelcache`` is the console script under test and no user's
    shell start-up files are read."""
    assert KERNELCACHE is not None, "install the project first (pip install -e .)"
    path = os.pathsep.join([str(Path(KERNELCACHE).parent), os.environ.get("PATH", "")])
    return child_env(PATH=path, HOME=str(tmp_path), KERNELCACHE_DIR=str(tmp_path / "root"))


def _run(argv: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv,
        env=_shell_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
        cwd=str(tmp_path),
    )


# -- kernelcache dir -------------------------------------------------------------------------
def test_dir_prints_the_root_alone_from_each_place_it_comes_from(tmp_path):
    env_root = tmp_path / "from-env"
    proc = kc(None, "dir", env={"KERNELCACHE_DIR": str(env_root)})
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, f"{env_root}\n", "")

    proc = kc("given", "dir", env={"KERNELCACHE_DIR": str(env_root)}, cwd=tmp_path)
    assert proc.stdout == f"{tmp_path / 'given'}\n"  # --root wins, made absolute

    proc = kc(None, "dir", env={"XDG_CACHE_HOME": str(tmp_path / "xdg")})
    assert proc.stdout == f"{tmp_path / 'xdg' / 'kernelcache'}\n"  # platformdirs' default

    assert not any(tmp_path.iterdir()), "dir created something"


def test_dir_works_in_a_command_substitution(tmp_path):
    (tmp_path / "root").mkdir()
    proc = _run(["bash", "-c", 'cd "$(kernelcache dir)" && pwd'], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"{tmp_path / 'root'}\n"


def test_dir_with_a_bad_variable_is_a_usage_error(tmp_path):
    proc = kc(None, "dir", env={"KERNELCACHE_DIR": "~no-such-user-here/cache"})
    assert proc.returncode == 2 and proc.stdout == ""
    assert "KERNELCACHE_DIR" in proc.stderr and "no such home directory" in proc.stderr


# -- kernelcache completion ------------------------------------------------------------------
BASH_COMPLETE = """
source <(kernelcache completion bash) || exit 3
complete -p kernelcache || exit 4
for line in "kernelcache st" "kernelcache " "kernelcache prune --dr" "kernelcache completion "; do
    read -ra COMP_WORDS <<< "$line"
    [[ $line == *" " ]] && COMP_WORDS+=("")
    COMP_CWORD=$(( ${#COMP_WORDS[@]} - 1 ))
    COMP_LINE=$line
    COMP_POINT=${#line}
    COMPREPLY=()
    _python_argcomplete kernelcache "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD-1]}" 2>/dev/null
    echo "$line|${COMPREPLY[*]}"
done
"""


def test_bash_completes_commands_options_and_arguments(tmp_path):
    proc = _run(["bash", "-c", BASH_COMPLETE], tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert "-F _python_argcomplete kernelcache" in lines[0]
    found = {line: set(words.split()) for line, words in (x.split("|") for x in lines[1:])}
    assert found["kernelcache st"] == {"stats"}
    commands = found["kernelcache "]
    assert {"stats", "ls", "prune", "dir", "completion", "doctor"} <= commands
    assert "warm" in commands  # a command a package adds (the bridge) completes too
    assert found["kernelcache prune --dr"] == {"--dry-run"}
    assert found["kernelcache completion "] >= {"bash", "zsh", "fish"}


@pytest.mark.skipif(shutil.which("zsh") is None, reason="zsh is not installed")
def test_the_zsh_script_parses_and_registers_with_compinit(tmp_path):
    script = tmp_path / "_kernelcache"
    script.write_text(_run(["kernelcache", "completion", "zsh"], tmp_path).stdout)
    proc = _run(["zsh", "-n", str(script)], tmp_path)
    assert proc.returncode == 0, proc.stderr
    load = f'autoload -U compinit && compinit -u -D && source {script} && print -- "$_comps[kernelcache]"'
    proc = _run(["zsh", "-f", "-c", load], tmp_path)
    assert proc.returncode == 0 and proc.stdout == "_python_argcomplete\n", proc.stderr


@pytest.mark.skipif(shutil.which("fish") is None, reason="fish is not installed")
def test_fish_completes_commands(tmp_path):
    script = tmp_path / "kernelcache.fish"
    script.write_text(_run(["kernelcache", "completion", "fish"], tmp_path).stdout)
    proc = _run(["fish", "--no-execute", str(script)], tmp_path)
    assert proc.returncode == 0, proc.stderr
    proc = _run(["fish", "-c", f"source {script}; complete -C 'kernelcache st'"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert [line.split("\t")[0] for line in proc.stdout.splitlines()] == ["stats"]


def test_completion_of_an_unknown_shell_is_a_usage_error(tmp_path):
    proc = kc(None, "completion", "tcsh")
    assert proc.returncode == 2 and proc.stdout == ""
    assert "invalid choice: 'tcsh'" in proc.stderr
