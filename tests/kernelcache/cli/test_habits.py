"""ccache's habits: ``kernelcache -s``, ``-z``, ``-C``, ``-d DIR``, ``--evict-older-than`` do
what ccache's do (``-M``, ``-o``, ``-p``: test_root_settings.py); ccache's other options say
what does their work here; ``pip cache``'s words are answered with ours."""

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
        (["-c"], "`kernelcache prune`"),
        (["-x"], "the compression setting"),
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


def test_d_and_dir_name_the_root_as_root_does(tmp_path):
    root = tmp_path / "cache"
    put(root, "matmul", size=400)
    for given in (["-d", str(root)], ["--dir", str(root)], [f"--dir={root}"]):
        doc = kc_json(None, *given, "ls")
        assert doc["root"] == str(root) and doc["count"] == 1, given
        assert kc_json(None, *given, "-s")["entries"] == 1  # before a ccache option too
    assert translate(["-d", "/r", "-s"]) == ["-d", "/r", "stats"]


def test_evict_older_than_prunes_by_age(tmp_path):
    root = tmp_path / "cache"
    put(root, "old", size=400, last_used=40 * 86400)
    put(root, "new", size=400)
    assert translate(["--evict-older-than", "30d"]) == ["prune", "--older-than", "30d"]
    assert translate(["--evict-older-than=30d"]) == ["prune", "--older-than", "30d"]
    doc = kc_json(root, "--evict-older-than", "30d")
    assert doc["command"] == "prune"
    assert [e["kernel"] for e in kc_json(root, "ls")["entries"]] == ["new"]
    bare = kc(root, "--evict-older-than")
    assert bare.returncode == 2 and "takes a value, e.g. --evict-older-than 30d" in bare.stderr


@pytest.mark.parametrize(
    "given, ours",
    [(["dir"], "dir"), (["purge"], "clear"), (["list"], "ls"), (["info"], "stats")],
)
def test_pip_cache_words_after_cache_name_our_command(tmp_path, given, ours):
    proc = kc(tmp_path, "cache", *given)
    assert proc.returncode == 2
    assert f"`pip cache {given[0]}` is `kernelcache {ours}` here" in proc.stderr
    assert "jax-cache" not in proc.stderr
    assert list(tmp_path.iterdir()) == []  # (purge: never run)


def test_cache_alone_lists_what_pip_cache_words_are_here(tmp_path):
    proc = kc(tmp_path, "cache")
    assert proc.returncode == 2 and "dir: `kernelcache dir`" in proc.stderr
