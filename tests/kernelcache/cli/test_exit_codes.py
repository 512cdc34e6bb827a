"""Every command exits by one table, ``kernelcache.cli.EXIT_CODES``: 0 done, 1 done in part
(problems found, some work failed), 2 nothing done (bad arguments or variables, or an
environment the command cannot work in), 130 interrupted. Each command is run here for each
code it can give; a command with no row fails the test, so a new command comes with its rows.
(``audit``'s 1, a hole in a key, is made in test_audit.py; ``import``'s 1, a conflict, in
test_bundle.py; 130 in test_progress.py. A refused confirmation of ``clear`` or ``prune``, and a
bundle refused whole, are 2: nothing was done.)"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
from cli_support import kc, put
from redis_server import free_port
from support import REPO

from kernelcache.cli import EXIT_CODES, EXIT_INTERRUPTED, EXIT_OK, EXIT_PROBLEMS, EXIT_USAGE
from kernelcache.cli.app import build_parser

EXAMPLES = [json.loads(line) for line in (REPO / "examples" / "manifest.jsonl").open()]

#: (command, expected code, arguments after ``--root ROOT``, extra environment); in the
#: arguments, {root} {clean} {file} {add} {matmul} {bundle} {junk} {key} {out} {jax} are filled in
CASES = [
    ("stats", EXIT_OK, ["stats"], {}),
    ("stats", EXIT_PROBLEMS, ["stats", "--remote"], {"KERNELCACHE_REMOTE": "{down}"}),
    ("stats", EXIT_USAGE, ["stats", "--top", "-1"], {}),
    ("stats", EXIT_USAGE, ["stats", "-o", "{file}/x.prom"], {}),
    ("ls", EXIT_OK, ["ls"], {}),
    ("ls", EXIT_USAGE, ["ls", "--limit", "many"], {}),
    ("ls", EXIT_USAGE, ["--root", "{file}", "ls"], {}),
    ("show", EXIT_OK, ["show", "{key}"], {}),
    ("show", EXIT_PROBLEMS, ["show", "f" * 64], {}),
    ("show", EXIT_USAGE, ["show"], {}),
    ("verify", EXIT_OK, ["--root", "{clean}", "verify"], {}),
    ("verify", EXIT_PROBLEMS, ["verify"], {}),
    ("verify", EXIT_USAGE, ["verify", "--repiar"], {}),
    ("prune", EXIT_OK, ["prune", "--dry-run", "--max-size", "1G"], {}),
    ("prune", EXIT_USAGE, ["prune", "--max-size", "-5G"], {}),
    ("prune", EXIT_USAGE, ["--root", "{file}", "prune", "--max-size", "1G"], {}),
    ("clear", EXIT_OK, ["--root", "{scratch}", "clear", "--yes"], {}),
    ("clear", EXIT_USAGE, ["--root", "{file}", "clear", "--yes"], {}),
    ("export", EXIT_OK, ["--root", "{clean}", "export", "{out}/a.tar"], {}),
    ("export", EXIT_PROBLEMS, ["export", "{out}/b.tar"], {}),  # the corrupt entry is skipped
    ("export", EXIT_USAGE, ["export", "{out}/c.tar", "--compression", "rar"], {}),
    ("import", EXIT_OK, ["--root", "{scratch}", "import", "{bundle}"], {}),
    ("import", EXIT_USAGE, ["--root", "{scratch}", "import", "{junk}"], {}),  # refused whole
    ("import", EXIT_USAGE, ["import", "{out}/nosuch.tar"], {}),
    ("doctor", EXIT_OK, ["--root", "{clean}", "doctor"], {}),
    ("doctor", EXIT_PROBLEMS, ["--root", "{clean}", "doctor"], {"KERNELCACHE_REMOTE": "{down}"}),
    ("doctor", EXIT_USAGE, ["doctor", "--fix"], {}),
    ("warm", EXIT_OK, ["--root", "{warm}", "warm", "{add}", "--target", "cuda:90"], {}),
    ("warm", EXIT_PROBLEMS, ["--root", "{warm}", "warm", "{broken}", "--target", "cuda:90"], {}),
    ("warm", EXIT_USAGE, ["warm", "{out}/nosuch.jsonl", "--target", "cuda:90"], {}),
    ("warm", EXIT_USAGE, ["--root", "{file}", "warm", "{add}", "--target", "cuda:90"], {}),
    ("tune", EXIT_OK, ["tune", "{matmul}", "--pin", "matmul_kernel=1"], {}),
    ("tune", EXIT_PROBLEMS, ["tune", "{matmul}"], {}),  # no GPU here to measure on
    ("tune", EXIT_USAGE, ["tune", "{matmul}", "--pin", "matmul_kernel=9"], {}),
    ("explain", EXIT_OK, ["--root", "{warm}", "explain", "{add}", "--target", "cuda:90"], {}),
    (
        "explain",
        EXIT_PROBLEMS,
        ["--root", "{clean}", "explain", "{add}", "--target", "cuda:90"],
        {},
    ),
    ("explain", EXIT_USAGE, ["explain", "{out}/nosuch.jsonl", "--target", "cuda:90"], {}),
    ("audit", EXIT_OK, ["--root", "{warm}", "audit", "{add}", "--target", "cuda:90"], {}),
    ("audit", EXIT_USAGE, ["audit", "{out}/nosuch.jsonl"], {}),
    ("run", EXIT_OK, ["run", "--", sys.executable, "-c", "pass"], {}),
    ("run", EXIT_USAGE, ["run"], {}),
    ("jax-cache", EXIT_OK, ["jax-cache", "--dir", "{jax}"], {}),
    ("jax-cache", EXIT_USAGE, ["jax-cache", "--dir", "{jax}", "--max-age", "soon"], {}),
    ("config", EXIT_OK, ["config"], {}),
    ("config", EXIT_USAGE, ["config", "--set", "no_such_setting=1"], {}),
    ("dir", EXIT_OK, ["dir"], {}),
    ("dir", EXIT_USAGE, ["dir", "--all"], {}),
    ("completion", EXIT_OK, ["completion", "bash"], {}),
    ("completion", EXIT_USAGE, ["completion", "tcsh"], {}),
    ("help", EXIT_OK, ["help", "commands"], {}),
    ("help", EXIT_USAGE, ["help", "no-such-topic"], {}),
]


def test_the_table_names_every_code_and_every_command_has_rows():
    assert set(EXIT_CODES) == {EXIT_OK, EXIT_PROBLEMS, EXIT_USAGE, EXIT_INTERRUPTED}
    parser = build_parser()
    (commands,) = [a for a in parser._actions if a.dest == "command"]
    assert set(commands.choices) == {command for command, *_ in CASES}
    for command in commands.choices:
        codes = {code for name, code, *_ in CASES if name == command}
        assert EXIT_OK in codes and EXIT_USAGE in codes, command


@pytest.fixture(scope="module")
def places(tmp_path_factory) -> dict[str, str]:
    base = tmp_path_factory.mktemp("exits")
    root, clean, warm = base / "root", base / "clean", base / "warm"
    good = put(root, "good", size=400)
    bad = put(root, "bad", size=300)
    Path(bad.path).write_bytes(b"\0" * 300)  # same size, wrong digest
    put(clean, "fine", size=400)
    warm.mkdir()
    (base / "a-file").write_text("not a directory")
    out = base / "out"
    out.mkdir()
    bundle = out / "good.tar"
    assert kc(clean, "export", str(bundle)).returncode == 0
    junk = out / "junk.tar"
    junk.write_bytes(b"\0" * 2048)
    add = base / "add.jsonl"
    add.write_text(json.dumps(EXAMPLES[0]) + "\n")
    broken = base / "broken.jsonl"
    block = {"BLOCK": 1000}  # tl.arange wants a power of two: the compiler rejects it
    record = {**EXAMPLES[0], "kwargs": block, "arguments": {**EXAMPLES[0]["arguments"], **block}}
    broken.write_text(json.dumps({**record, "constexprs": {"4": 1000}}) + "\n")
    matmul = base / "matmul.jsonl"
    matmul.write_text("".join(json.dumps(r) + "\n" for r in EXAMPLES if "matmul" in r["kernel"]))
    (base / "jax").mkdir()
    return {
        "root": str(root),
        "clean": str(clean),
        "warm": str(warm),
        "scratch": str(base / "scratch"),
        "file": str(base / "a-file"),
        "out": str(out),
        "bundle": str(bundle),
        "junk": str(junk),
        "add": str(add),
        "broken": str(broken),
        "matmul": str(matmul),
        "key": good.key,
        "jax": str(base / "jax"),
        "down": f"redis://127.0.0.1:{free_port()}/0?timeout=0.5",
    }


@pytest.mark.parametrize(
    "command,code,args,env",
    CASES,
    ids=[f"{c[0]}-{c[1]}-{i}" for i, c in enumerate(CASES)],
)
def test_each_command_exits_by_the_table(places, command, code, args, env):
    if command == "explain" and code == EXIT_OK:  # a hit: what warm stored
        kc(places["warm"], "warm", places["add"], "--target", "cuda:90", cwd=REPO)
    if command == "audit" and code == EXIT_OK:
        kc(places["warm"], "warm", places["add"], "--target", "cuda:90", cwd=REPO)
    if command == "clear":
        shutil.rmtree(places["scratch"], ignore_errors=True)
        put(Path(places["scratch"]), "doomed", size=300)
    filled = [a.format(**places) for a in args]
    root = None if "--root" in filled else places["root"]
    proc = kc(root, *filled, env={k: v.format(**places) for k, v in env.items()}, cwd=REPO)
    assert proc.returncode == code, (
        f"{' '.join(filled)}: exit {proc.returncode}, the table says {code} "
        f"({EXIT_CODES[code]})\n{proc.stdout[-1500:]}\n{proc.stderr[-1500:]}"
    )
    assert "Traceback" not in proc.stderr
    if code == EXIT_USAGE:
        assert "error" in proc.stderr or "usage:" in proc.stderr
    if "--json" in filled and code != EXIT_OK:
        assert json.loads(proc.stdout)["error"], proc.stdout


@pytest.mark.parametrize(
    "args, command, words",
    [
        (["prune", "--max-size", "10X", "--json"], "prune", "invalid size '10X'"),
        (["--json", "ls", "--limit", "many"], "ls", "invalid count 'many'"),
        (["--json", "frobnicate"], None, "invalid choice: 'frobnicate'"),
        (["verify", "--repiar", "--json"], "verify", "did you mean --repair?"),
        (["--json"], None, "required: COMMAND"),
    ],
)
def test_with_json_a_usage_error_is_a_json_document_too(tmp_path, args, command, words):
    proc = kc(tmp_path, *args)
    assert proc.returncode == EXIT_USAGE
    doc = json.loads(proc.stdout)
    assert doc["schema"] == 1 and doc["command"] == command and words in doc["error"], doc
    assert "usage:" in proc.stderr and words in proc.stderr  # people read stderr as before


def test_with_json_an_interrupted_command_says_so_in_json(tmp_path, monkeypatch, capsys):
    from kernelcache.cli import app, verification

    def interrupted(args, out):
        with out.progress("verifying", 400) as tick:
            tick(37)
            raise KeyboardInterrupt

    monkeypatch.setattr(verification, "cmd_verify", interrupted)
    assert app.main(["--root", str(tmp_path), "verify", "--json"]) == EXIT_INTERRUPTED
    shown = capsys.readouterr()
    doc = json.loads(shown.out)
    assert doc["interrupted"] is True and doc["command"] == "verify"
    assert doc["error"].startswith("interrupted while verifying, after 37 of 400 entries")
    assert "run the command again to finish" in shown.err


def test_declining_or_a_bundle_refused_whole_is_nothing_done(tmp_path):
    """The help's table: 2 says nothing was done; a rejected bundle changes nothing."""
    junk = tmp_path / "junk.tar"
    junk.write_bytes(b"\0" * 2048)
    proc = kc(tmp_path / "fresh", "import", str(junk), "--json")
    assert proc.returncode == EXIT_USAGE and "nothing was imported" in proc.stderr
    assert "nothing was imported" in json.loads(proc.stdout)["error"]
    assert not (tmp_path / "fresh").exists()
    assert "2 nothing was done" in kc(None, "--help").stdout
