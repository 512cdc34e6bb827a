"""ccache's habits: ``kernelcache -s``, ``-z`` and ``-C`` do what ``ccache -s``, ``-z`` and
``-C`` do; ccache's other options say what does their work here."""

from __future__ import annotations

import pytest
from cli_support import kc, kc_json, put

from kernelcache.cli.habits import translate


def test_s_z_and_c_run_their_commands(tmp_path):
    root = tmp_path / "cache"
    put(root, "matmul", size=400)
    assert kc_json(root, "-s")["entries"] == kc_json(root, "stats")["entries"] == 1
    shown = kc(root, "-s")
    assert shown.returncode == 0 and "Entries:" in shown.stdout
    assert kc(None, "--root", str(root), "--json", "-z").returncode == 0
    assert "zeroed" in kc_json(root, "--zero-stats")
    cleared = kc_json(root, "-C")  # not a terminal: no question, as `ccache -C`
    assert cleared["result"]["counts"] == {"done": 1} and kc_json(root, "ls")["count"] == 0
    assert kc(None, "-V").stdout.startswith("kernelcache ")


@pytest.mark.parametrize(
    "option, words",
    [
        (["-M", "5G"], "KERNELCACHE_MAX_SIZE=SIZE"),
        (["-c"], "`kernelcache prune`"),
        (["-p"], "`kernelcache doctor`"),
    ],
)
def test_other_ccache_options_say_what_does_their_work(tmp_path, option, words):
    proc = kc(tmp_path, *option)
    assert proc.returncode == 2
    assert f"{option[0]} is ccache's option: here, " in proc.stderr and words in proc.stderr


def test_only_the_command_place_is_read():
    assert translate(["--root", "/r", "-v", "-s", "--json"]) == [
        "--root",
        "/r",
        "-v",
        "stats",
        "--json",
    ]
    assert translate(["--root=/r", "-z"]) == ["--root=/r", "stats", "--zero"]
    assert translate(["ls", "-s"]) == ["ls", "-s"]  # a command's own arguments stay
    assert translate(["run", "--", "ccache", "-C"]) == ["run", "--", "ccache", "-C"]


def test_no_command_says_how_to_find_one(tmp_path):
    proc = kc(tmp_path)
    assert proc.returncode == 2 and "e.g. `kernelcache stats`" in proc.stderr
