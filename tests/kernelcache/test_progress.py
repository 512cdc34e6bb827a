"""Progress of long commands, through the real command line: a bar of the package's own when
standard error is a pseudo-terminal (no optional package needed; ``warm`` still compiles in
parallel: the bar starts no thread), plain periodic lines when it is a pipe."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from cli_support import KERNELCACHE, put
from support import REPO, child_env, run_on_a_terminal

from kernelcache.stats import read_logs

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="pseudo-terminals as on Linux")


def stderr_on_a_terminal(argv: list[str], **env: str) -> tuple[int, str, str]:
    """Run ``argv`` with standard error on a pseudo-terminal and standard output to a file;
    returns (exit code, stdout, what the terminal showed)."""
    with tempfile.TemporaryFile() as stdout:
        code, shown = run_on_a_terminal(argv, stdout=stdout, **env)
        stdout.seek(0)
        return code, stdout.read().decode(), shown


def _manifest(tmp_path: Path) -> Path:
    """A manifest of one Triton kernel (two specializations with two targets)."""
    lines = (REPO / "examples" / "manifest.jsonl").read_text().splitlines()
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(next(line for line in lines if "add_kernel" in line) + "\n")
    return manifest


def _builders(root: Path) -> set[int]:
    """The pids whose statistics logs under ``root`` count a build."""
    pids = set()
    for log in (root / ".stats").glob("*.jsonl"):
        for line in log.read_text().splitlines():
            record = json.loads(line)
            if record.get("delta", {}).get("builds"):
                pids.add(record["pid"])
    return pids


def test_warm_on_a_terminal_draws_a_bar_and_compiles_in_parallel(tmp_path):
    root = tmp_path / "c"
    argv = [KERNELCACHE or "kernelcache", "--root", str(root), "warm", str(_manifest(tmp_path))]
    argv += ["--target", "cuda:80", "--target", "cuda:86", "-j", "2"]
    code, out, shown = stderr_on_a_terminal(argv)
    assert code == 0, out + shown
    assert "warming" in shown  # the bar
    assert "compiled             2  (" in out and "2 processes)" in out, out
    assert len(_builders(root)) == 2  # each worker process compiled one kernel
    assert read_logs(str(root))[0]["builds"] == 2


def test_warm_piped_writes_plain_progress_lines(tmp_path):
    root = tmp_path / "c"
    argv = [KERNELCACHE or "kernelcache", "--root", str(root), "warm", str(_manifest(tmp_path))]
    argv += ["--target", "cuda:80", "--target", "cuda:86", "-j", "2", "--json"]
    proc = subprocess.run(
        argv,
        env=child_env(KERNELCACHE_PROGRESS_INTERVAL="0"),
        capture_output=True,
        text=True,
        timeout=240,
        cwd=str(REPO),
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("kernelcache: warming")]
    assert lines and lines[-1].startswith("kernelcache: warming: 2/2 (100%) after "), proc.stderr
    assert "\r" not in proc.stderr and "\x1b" not in proc.stderr  # no bar drawn into a log
    assert json.loads(proc.stdout)["workers"] == 2


def _entries(root: Path, n: int) -> None:
    for i in range(n):
        put(root, f"k{i}", size=400)  # whole cubins: verify finds them clean


def test_verify_piped_lines_only_past_the_interval(tmp_path):
    root = tmp_path / "c"
    _entries(root, 3)
    argv = [KERNELCACHE or "kernelcache", "--root", str(root), "verify"]
    quick = subprocess.run(argv, env=child_env(), capture_output=True, text=True, timeout=60)
    assert quick.returncode == 0 and "verifying" not in quick.stderr  # shorter than 10 s
    every = subprocess.run(
        argv,
        env=child_env(KERNELCACHE_PROGRESS_INTERVAL="0"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert every.returncode == 0
    assert "kernelcache: verifying: 3/3 (100%) after " in every.stderr, every.stderr


# the command line with tqdm missing (its import fails): the bar is the package's own
_NO_TQDM = "import sys; sys.modules['tqdm'] = None; from kernelcache.cli.app import run; run()"


def test_a_terminal_gets_a_bar_without_any_optional_package(tmp_path):
    root = tmp_path / "c"
    _entries(root, 3)
    argv = [sys.executable, "-c", _NO_TQDM, "--root", str(root), "verify", "--repair"]
    code, out, shown = stderr_on_a_terminal(argv, KERNELCACHE_PROGRESS_INTERVAL="0")
    assert code == 0, out + shown
    assert "\rverifying: [" in shown and "] 3/3 entries (100%) " in shown, repr(shown)
    assert "kernelcache: verifying:" not in shown and "install" not in shown  # no line, no hint
    assert re.search(r"\r {40,}\r", shown), repr(shown)  # erased at the end
    assert "\x1b" not in shown  # a carriage return and spaces: any terminal draws it
    piped = subprocess.run(
        argv,
        env=child_env(KERNELCACHE_PROGRESS_INTERVAL="0"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert piped.returncode == 0, piped.stderr
    assert "kernelcache: verifying: 3/3 (100%) after " in piped.stderr
    assert "\r" not in piped.stderr and "[" not in piped.stderr  # lines, not a bar


def test_a_bar_fits_its_terminal_and_drops_the_bar_before_the_counts():
    import io

    from kernelcache.progress import _Bar

    bar = _Bar("pruning", 400, "entries", io.StringIO())
    bar.done = 100
    wide = bar.line(bar.started + 12, 80)
    assert wide.startswith("pruning: [") and wide.endswith("] 100/400 entries (25%) 12s")
    assert len(wide) == 79  # the last column left for the cursor
    inside = wide[wide.index("[") + 1 : wide.index("]")]
    assert inside == "#" * 10 + "." * 30 + "." * 2  # a quarter of the 42 columns left for it
    narrow = bar.line(bar.started, 40)
    assert narrow == "pruning: 100/400 entries (25%) 0s"
    assert len(bar.line(bar.started, 20)) == 19
    bar.total = None
    assert bar.line(bar.started + 3, 80) == "pruning: 100 entries 3s"


def test_an_interrupted_command_says_how_far_it_got_and_that_a_rerun_finishes(
    tmp_path, monkeypatch, capsys
):
    """Ctrl-C in the middle of an operation: how far it got, and that what was done is kept
    (exit 130); with no operation under way, the same advice."""
    from kernelcache.cli import app, verification

    def verify_then_interrupt(args, out):
        with out.progress("verifying", 400) as tick:
            tick(37)
            raise KeyboardInterrupt

    monkeypatch.setattr(verification, "cmd_verify", verify_then_interrupt)
    assert app.main(["--root", str(tmp_path), "verify"]) == 130
    said = capsys.readouterr().err.strip().splitlines()[-1]
    assert said == (
        "kernelcache: interrupted while verifying, after 37 of 400 entries; what was done is "
        "kept: run the command again to finish"
    ), said

    def interrupt(args, out):
        raise KeyboardInterrupt

    monkeypatch.setattr(verification, "cmd_verify", interrupt)
    assert app.main(["--root", str(tmp_path), "verify"]) == 130
    assert "run the command again to finish" in capsys.readouterr().err
