"""The ``kernelcache`` command through its real console script: human and JSON output of every
command on empty, populated and corrupted roots; usage errors; no jax or triton needed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from artifact_images import launch, sized
from cli_support import KERNELCACHE, backdate, files_under, kc, kc_json, put
from support import HELPERS, key_of, run_on_a_terminal, run_py

from kernelcache.cli import parse_age, parse_size
from kernelcache.maintenance.index import INDEX_NAME, INDEX_VERSION
from kernelcache.store import Store

COMMANDS = [
    ["stats"],
    ["stats", "--format", "prometheus"],
    ["ls"],
    ["verify"],
    ["prune", "--dry-run"],
    ["prune"],
    ["doctor"],
]


@pytest.fixture
def populated(tmp_path: Path) -> Path:
    root = tmp_path / "cache"
    for i in range(6):
        put(root, "matmul", "cuda:90", "cubin", 1000 + i, last_used=86400 * (10 - i))
    for i in range(3):
        put(root, "softmax", "hip:gfx942", "hsaco", 3000 + i, last_used=3600 * (i + 1))
    put(root, "attn", "cuda:80", "ptx", 50_000, last_used=60)
    return root


def corrupt_root(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A root with one of every problem verify knows, plus two good entries."""
    root = tmp_path / "corrupt"
    put(root, "good", size=400)  # whole cubins (see test_cli_support.put)
    put(root, "good", size=401)
    keys = {}
    flipped = put(root, "flipped", size=250)
    data = bytearray(Path(flipped.path).read_bytes())
    data[5] ^= 0xFF
    Path(flipped.path).write_bytes(bytes(data))
    keys["flipped"] = flipped.key
    short = put(root, "short", size=250)
    Path(short.path).write_bytes(b"x" * 10)
    keys["short"] = short.key
    nometa = put(root, "nometa", size=300)
    (root / f"{nometa.key}.json").unlink()
    backdate(Path(nometa.path), time.time() - 7200)
    keys["orphan-artifact"] = nometa.key
    noart = put(root, "noart", size=300)
    Path(noart.path).unlink()
    keys["orphan-metadata"] = noart.key
    badmeta = put(root, "badmeta", size=300)
    (root / f"{badmeta.key}.json").write_text("{not json")
    keys["bad-metadata"] = badmeta.key
    (root / ".tmp").mkdir(exist_ok=True)
    (root / ".tmp" / "host-1-dead.tmp").write_bytes(b"half")
    backdate(root / ".tmp" / "host-1-dead.tmp", time.time() - 7200)
    (root / ".locks").mkdir(exist_ok=True)
    gone = key_of("stale lock")
    (root / ".locks" / f"{gone}.lock").write_bytes(b"")
    backdate(root / ".locks" / f"{gone}.lock", time.time() - 7200)
    keys["stale-lock"] = gone
    (root / "notes.txt").write_text("someone's notes")
    return root, keys


# -- every command on an empty root ---------------------------------------------------------
@pytest.mark.parametrize("args", COMMANDS, ids=lambda a: " ".join(a))
def test_every_command_on_an_empty_root(tmp_path, args):
    root = tmp_path / "empty"
    root.mkdir()
    human = kc(root, *args)
    assert human.returncode == 0, human.stderr
    assert "Traceback" not in human.stderr
    if args[-1] != "prometheus":
        doc = kc_json(root, *args)
        assert doc["root"] == str(root)
        assert doc["command"] == args[0]


def test_no_command_but_a_write_creates_a_missing_root(tmp_path):
    root = tmp_path / "missing"
    for args in (["verify"], ["prune", "--dry-run"], ["prune"]):
        proc = kc(root, *args)
        assert proc.returncode == 2, (args, proc.stderr)
        assert f"{root} does not exist" in proc.stderr
    assert kc(root, "stats").returncode == 0  # zeros before the first job
    assert kc(root, "ls").returncode == 0  # nothing to list yet
    assert kc(root, "doctor").returncode == 0  # doctor reports it
    assert not root.exists()
    assert "does not exist" in kc(root, "doctor").stdout


def test_stats_before_the_first_job_shows_zeros(tmp_path):
    root = tmp_path / "not-yet"
    human = kc(root, "stats")
    assert human.returncode == 0, human.stderr
    assert "(does not exist yet)" in human.stdout and "Entries:          0" in human.stdout
    doc = kc_json(root, "stats")
    assert (doc["exists"], doc["entries"], doc["bytes"]) == (False, 0, 0)
    assert doc["counters"]["hits"] == 0 and doc["hit_rate"] is None
    # a metrics cron set up before the first job: the textfile is written, with zeros
    out = tmp_path / "kernelcache.prom"
    proc = kc(root, "stats", "--format", "prometheus", "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    assert f'kernelcache_entries{{root="{root}"}} 0' in out.read_text()
    assert not root.exists()


def test_export_and_import_of_an_empty_root(tmp_path):
    root = tmp_path / "empty"
    root.mkdir()
    bundle = tmp_path / "empty.tar"
    doc = kc_json(root, "export", str(bundle))
    assert doc["entries"] == 0 and bundle.is_file()
    other = tmp_path / "other"
    doc = kc_json(other, "import", str(bundle))
    assert (doc["entries"], doc["imported"], doc["present"]) == (0, 0, 0)


# -- a populated root ------------------------------------------------------------------------
def test_stats_counts_and_bytes(populated):
    doc = kc_json(populated, "stats")
    assert doc["entries"] == 10
    sizes = [1000 + i for i in range(6)] + [3000, 3001, 3002, 50_000]
    assert doc["artifact_bytes"] == sum(sizes)
    metadata = sum(p.stat().st_size for p in populated.glob("*.json"))
    assert doc["metadata_bytes"] == metadata
    assert doc["bytes"] == sum(sizes) + metadata
    assert doc["by_ext"]["cubin"]["entries"] == 6
    assert doc["by_ext"]["hsaco"]["entries"] == 3
    assert doc["by_target"]["cuda:80"]["entries"] == 1
    assert doc["by_kernel"]["matmul"]["entries"] == 6
    assert list(doc["by_kernel"]) == ["attn", "softmax", "matmul"]  # largest first
    assert doc["problems"] == 0
    human = kc(populated, "stats").stdout
    assert "Entries:          10" in human
    assert "matmul" in human and "hip:gfx942" in human


def test_stats_uses_and_refreshes_the_scan_index(populated):
    kc_json(populated, "stats")
    index = populated / ".stats" / INDEX_NAME
    assert index.is_file()
    # A replaced metadata file (new inode) is read again, not taken from the index.
    extra = put(populated, "late", "cuda:90", "cubin", 777)
    doc = kc_json(populated, "stats")
    assert doc["entries"] == 11 and doc["by_kernel"]["late"]["entries"] == 1
    (populated / f"{extra.key}.json").unlink()
    (populated / f"{extra.key}.cubin").unlink()
    assert kc_json(populated, "stats")["entries"] == 10
    # A garbage index is ignored, then rewritten.
    index.write_text('{"v": 1, "keys": 5}')
    assert kc_json(populated, "stats")["entries"] == 10
    assert json.loads(index.read_text().split("\n")[0])["v"] == INDEX_VERSION


def test_stats_aggregates_process_logs(tmp_path):
    root = tmp_path / "cache"
    code = """
        import sys, time, kernelcache
        from support import key_of
        c = kernelcache.Cache(sys.argv[1], readonly_roots=())
        def build():
            time.sleep(0.05)
            return b"binary", {"name": "k", "target": "cuda:90"}
        for i in range(3):
            for _ in range(4):
                c.get_or_create(key_of("logs", i), "bin", build)
    """
    run_py(code, str(root), PYTHONPATH=str(HELPERS))
    run_py(code, str(root), PYTHONPATH=str(HELPERS))
    doc = kc_json(root, "stats")
    c = doc["counters"]
    # first process: 3 misses (each built), 9 hits; second: 12 hits
    assert (c["misses"], c["builds"], c["hits"]) == (3, 3, 21)
    assert doc["processes"] == 2
    assert doc["hit_rate"] == pytest.approx(21 / 24)
    assert doc["mean_build_seconds"] == pytest.approx(c["build_seconds"] / 3, rel=1e-3)
    assert doc["compile_seconds_saved"] == pytest.approx(21 * c["build_seconds"] / 3, rel=1e-3)
    assert c["build_seconds"] >= 0.15
    human = kc(root, "stats").stdout
    assert "Hit rate:         87.5%" in human


def test_stats_prometheus_format_and_atomic_output(populated, tmp_path):
    text = kc(populated, "stats", "--format", "prometheus").stdout
    lines = [line for line in text.splitlines() if line and not line.startswith("#")]
    samples = {}
    for line in lines:
        name_labels, value = line.rsplit(" ", 1)
        samples[name_labels] = float(value)
    root = str(populated)
    assert samples[f'kernelcache_entries{{root="{root}"}}'] == 10
    assert samples[f'kernelcache_entries_by_target{{root="{root}",target="cuda:90"}}'] == 6
    assert samples[f'kernelcache_hits_total{{root="{root}"}}'] == 0
    assert "# TYPE kernelcache_hits_total counter" in text
    assert "# TYPE kernelcache_entries gauge" in text
    out = tmp_path / "textfile" / "kernelcache.prom"
    out.parent.mkdir()
    assert kc(populated, "stats", "--format", "prometheus", "-o", str(out)).returncode == 0
    assert out.read_text() == text
    assert sorted(p.name for p in out.parent.iterdir()) == ["kernelcache.prom"]


def test_ls_filters_sorts_and_json(populated):
    doc = kc_json(populated, "ls", "--sort", "size")
    sizes = [e["size"] for e in doc["entries"]]
    assert sizes == sorted(sizes, reverse=True) and doc["count"] == 10
    first = doc["entries"][0]
    assert set(first) >= {
        "key",
        "ext",
        "size",
        "meta_size",
        "kernel",
        "target",
        "created",
        "last_used",
        "path",
    }
    assert Path(first["path"]).read_bytes() == sized(
        first["ext"], first["size"], first["key"].encode(), first["kernel"]
    )
    lru = kc_json(populated, "ls", "--sort", "last-used")["entries"]
    stamps = [e["last_used"] for e in lru]
    assert stamps == sorted(stamps) and lru[0]["kernel"] == "matmul"
    limited = kc_json(populated, "ls", "--sort", "last-used", "--reverse", "--limit", "2")
    rev = limited["entries"]
    assert [e["kernel"] for e in rev] == ["attn", "softmax"]
    assert limited["count"] == 2 and limited["matched"] == len(lru)
    said = kc(populated, "ls", "--limit", "2").stdout.splitlines()[-1]
    assert said.startswith(f"2 of {len(lru)} kernels (--limit), "), said
    only = kc_json(populated, "ls", "--kernel", "softmax", "--target", "hip:gfx942")
    assert only["count"] == 3 and {e["kernel"] for e in only["entries"]} == {"softmax"}
    both = kc_json(populated, "ls", "--target", "cuda:80", "--target", "hip:gfx942")
    assert both["count"] == 4
    human = kc(populated, "ls", "--kernel", "attn").stdout
    assert "attn" in human and "cuda:80" in human and "1 kernel," in human


def _named(root: Path, name: str, qualname: str, kind: str | None = None, size: int = 400) -> str:
    """An entry as the bridge names one: ``name`` and where it is defined (``kernel``)."""
    key = key_of(name, qualname, kind)
    meta = launch(name=name, kernel=qualname, target="cuda:90", num_warps=4)
    if kind is not None:
        meta["kind"] = kind
    Store(root).put(
        key, "cubin" if kind is None else "bin", sized("cubin", size, key.encode()), meta
    )
    return key


def test_kernel_filters_take_where_a_kernel_is_defined(tmp_path):
    """``--kernel`` matches the name ``ls`` shows, where the kernel is defined
    (``module:name``, as ``warm`` and ``explain`` print it), and each kernel an entry of
    several holds; a filter that matches nothing says so."""
    root = tmp_path / "cache"
    mine = _named(root, "matmul_kernel", "myproj.kernels:matmul_kernel")
    theirs = _named(root, "matmul_kernel", "theirs.ops:matmul_kernel")
    program = _named(
        root,
        "add_kernel, matmul_kernel",
        "myproj.kernels:add_kernel, myproj.kernels:matmul_kernel",
        kind="lowering",
    )
    listed = kc_json(root, "ls", "--kernel", "myproj.kernels:matmul_kernel", "--kind", "all")
    assert {e["key"] for e in listed["entries"]} == {mine, program}
    assert listed["unmatched"] == []
    assert kc_json(root, "ls", "--kernel", "add_kernel", "--kind", "lowering")["count"] == 1
    assert kc_json(root, "ls", "--kernel", "theirs.*")["count"] == 1
    human = kc(root, "ls", "--kernel", "add_kernel", "--kind", "lowering").stdout
    assert "add_kernel, matmul_kernel" in human
    # nothing matches: said, on every command that filters
    none = kc_json(root, "prune", "--kernel", "myproj.kernels:nothing", "--dry-run")
    assert none["unmatched"] == ["--kernel myproj.kernels:nothing"]
    text = kc(root, "prune", "--kernel", "nothing", "--target", "hip:*", "--dry-run").stdout
    assert "no entry matches --kernel nothing" in text
    assert "no entry matches --target hip:*" in text
    assert "No entry matches --kernel nothing." in kc(root, "ls", "--kernel", "nothing").stdout
    bundle = tmp_path / "b.tar"
    exported = kc_json(root, "export", str(bundle), "--kernel", "nothing")
    assert exported["unmatched"] == ["--kernel nothing"] and exported["entries"] == 0
    # prune by where the kernel is defined deletes its entries and the program's, not theirs
    done = kc_json(root, "prune", "--kernel", "myproj.kernels:matmul_kernel")
    assert done["result"]["counts"] == {"done": 2}
    assert [p.stem for p in root.glob("*.json")] == [theirs]


def test_ls_names_every_kernel_of_an_entry_that_holds_many(tmp_path):
    root = tmp_path / "cache"
    names = [f"k{i}" for i in range(5)]
    _named(root, ", ".join(names), ", ".join(f"m:{n}" for n in names), kind="lowering")
    row = kc(root, "ls", "--kind", "lowering").stdout.splitlines()[1]
    assert "k0, k1, k2 (+2 more)" in row
    assert kc_json(root, "ls", "--kind", "all")["entries"][0]["kernel"] == ", ".join(names)


def test_ls_into_a_closed_pipe_is_quiet(populated):
    assert KERNELCACHE is not None
    proc = subprocess.run(
        f"'{KERNELCACHE}' --root '{populated}' ls | head -n 1",
        shell=True,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0
    assert "Traceback" not in proc.stderr and "Broken pipe" not in proc.stderr


def test_show_by_key_and_prefix(populated):
    entry = kc_json(populated, "ls", "--kernel", "attn")["entries"][0]
    doc = kc_json(populated, "show", entry["key"][:10])
    assert doc["key"] == entry["key"] and doc["status"] == "ok"
    assert doc["metadata"]["name"] == "attn" and doc["metadata"]["size"] == 50_000
    assert doc["path"] == entry["path"]
    human = kc(populated, "show", entry["key"]).stdout
    assert "status:     ok" in human and "name: attn" in human


def test_show_does_not_refresh_the_last_used_stamp(populated):
    entry = kc_json(populated, "ls", "--kernel", "matmul", "--sort", "last-used")["entries"][0]
    before = os.stat(Path(populated) / f"{entry['key']}.json").st_mtime
    kc_json(populated, "show", entry["key"])
    kc_json(populated, "verify")
    assert os.stat(Path(populated) / f"{entry['key']}.json").st_mtime == before


def test_show_errors(populated):
    missing = kc(populated, "show", "ab" * 16)
    assert missing.returncode == 1 and "no entry" in missing.stderr
    bad = kc(populated, "show", "not-a-key")
    assert bad.returncode == 2 and "invalid key" in bad.stderr
    short = kc(populated, "show", "abc")
    assert short.returncode == 2 and "at least 6" in short.stderr


def test_verify_clean_root(populated):
    doc = kc_json(populated, "verify")
    assert doc["entries_checked"] == 10 and doc["entries_ok"] == 10
    assert doc["problems"] == [] and doc["clean"] is True
    assert "No problems found" in kc(populated, "verify").stdout


# -- a corrupted root ------------------------------------------------------------------------
def test_verify_finds_every_kind_of_problem(tmp_path):
    root, keys = corrupt_root(tmp_path)
    doc = kc_json(root, "verify", code=1)
    found = {(p["kind"], p["key"]) for p in doc["problems"]}
    assert ("corrupt", keys["flipped"]) in found
    assert ("corrupt", keys["short"]) in found
    assert ("corrupt", keys["orphan-metadata"]) in found
    assert ("corrupt", keys["bad-metadata"]) in found
    assert ("orphan-artifact", keys["orphan-artifact"]) in found
    assert ("stale-lock", keys["stale-lock"]) in found
    kinds = doc["counts"]
    assert kinds == {
        "corrupt": 4,
        "orphan-artifact": 1,
        "stale-temp": 1,
        "stale-lock": 1,
        "foreign": 1,
    }
    assert doc["entries_ok"] == 2 and doc["clean"] is False
    reasons = {p["key"]: p["detail"] for p in doc["problems"]}
    assert reasons[keys["flipped"]] == "artifact digest mismatch"
    assert "250" in reasons[keys["short"]]
    human = kc(root, "verify")
    assert human.returncode == 1
    assert "notes.txt" in human.stdout and "verify --repair" in human.stdout


def test_verify_repair_says_why_it_cannot_quarantine_into_a_linked_quarantine(tmp_path):
    """A ``.quarantine`` that is a link (another user's trap) is never followed: the corrupt
    entry stays, reported as failed with the reason, not as an entry in use."""
    root, outside = tmp_path / "root", tmp_path / "outside"
    outside.mkdir()
    art = put(root, ext="bin", size=64)
    Path(art.path).write_bytes(b"x" * 64)  # (its digest no longer matches)
    (root / ".quarantine").symlink_to(outside)
    doc = kc_json(root, "verify", "--repair", code=1)
    assert doc["repair"]["counts"] == {"failed": 1}, doc["repair"]
    said = json.dumps(doc["repair"])
    assert ".quarantine" in said and "in use" not in said
    assert list(outside.iterdir()) == [] and Path(art.path).exists()


def test_verify_repair_fixes_all_but_foreign_files(tmp_path):
    root, keys = corrupt_root(tmp_path)
    doc = kc_json(root, "verify", "--repair")  # notes.txt stays: it is not the cache's
    assert doc["clean"] is True
    counts = doc["repair"]["counts"]
    assert counts == {"done": 7}
    quarantined = {p.name.split(".")[0] for p in (root / ".quarantine").iterdir()}
    for kind in ("flipped", "short", "orphan-metadata", "bad-metadata"):
        assert keys[kind] in quarantined
    assert not (root / ".tmp" / "host-1-dead.tmp").exists()
    assert not (root / ".locks" / f"{keys['stale-lock']}.lock").exists()
    assert not list(root.glob(f"{keys['orphan-artifact']}.*"))
    again = kc_json(root, "verify")
    assert [p["kind"] for p in again["problems"]] == ["foreign"]
    (root / "notes.txt").unlink()
    assert kc_json(root, "verify")["clean"] is True
    assert kc_json(root, "stats")["entries"] == 2


def test_show_and_stats_on_a_corrupted_root(tmp_path):
    root, keys = corrupt_root(tmp_path)
    doc = kc_json(root, "show", keys["flipped"], code=1)
    assert doc["status"] == "corrupt" and doc["problem"] == "artifact digest mismatch"
    assert doc["metadata"]["name"] == "flipped"
    assert "CORRUPT" in kc(root, "show", keys["flipped"]).stdout
    stats = kc_json(root, "stats")
    assert stats["entries"] == 4  # the quick scan does not read artifacts: flipped, short count
    assert stats["problems"] >= 4
    assert kc_json(root, "ls")["count"] == 4
    assert kc(root, "stats").returncode == 0


def test_prune_on_a_corrupted_root_cleans_up_and_leaves_the_rest(tmp_path):
    root, keys = corrupt_root(tmp_path)
    plan = kc_json(root, "prune", "--dry-run")
    kinds = plan["plan"]["summary"]
    assert kinds["remove-orphan"]["count"] == 1
    assert kinds["remove-temp"]["count"] == 1
    assert kinds["remove-lock"]["count"] == 1
    assert kinds["delete-entry"]["count"] == 1  # metadata without artifact
    assert {i["kind"] for i in plan["left"]} == {"corrupt", "foreign"}  # for verify --repair
    before = files_under(root)
    assert files_under(root) == before
    done = kc_json(root, "prune")
    assert done["result"]["counts"] == {"done": 4}
    assert not (root / f"{keys['orphan-metadata']}.json").exists()
    assert (root / f"{keys['flipped']}.json").exists()


def test_a_foreign_file_alone_is_no_failure(tmp_path):
    """A file the cache does not know is reported and left alone: verify does not fail for it,
    nor suggest a repair that would leave it there."""
    root = tmp_path / "cache"
    put(root, "k", size=400)
    (root / "notes.txt").write_text("someone's notes")
    proc = kc(root, "verify")
    assert proc.returncode == 0, proc.stdout
    assert "notes.txt" in proc.stdout and "--repair" not in proc.stdout
    doc = kc_json(root, "verify")
    assert doc["clean"] is True and doc["counts"] == {"foreign": 1}
    damaged = put(root, "bad", size=400)
    Path(damaged.path).write_bytes(b"\0" * 400)
    again = kc(root, "verify")
    assert again.returncode == 1 and "verify --repair" in again.stdout


@pytest.mark.skipif(sys.platform != "linux", reason="pseudo-terminals as on Linux")
def test_prune_prints_its_plan_before_it_runs(tmp_path):
    root = tmp_path / "cache"
    for i in range(300):
        put(root, f"k{i}", size=400, last_used=40 * 86400)
    code, shown = run_on_a_terminal(
        [KERNELCACHE, "--root", str(root), "prune", "--older-than", "30d", "--yes"]
    )
    assert code == 0, shown
    plan, bar, outcome = (shown.find(s) for s in ("Plan for", "pruning", "Pruned:"))
    assert -1 < plan < bar < outcome, shown
    assert shown.count("Plan for") == 1
    piped = kc(root, "prune")
    assert piped.stdout.startswith("Plan for") and "nothing to do" in piped.stdout


# -- usage errors and exit codes ------------------------------------------------------------
@pytest.mark.parametrize(
    "args, words",
    [
        (["prune", "--max-size", "10X"], "invalid size '10X'"),
        (["prune", "--max-size=-5G"], "invalid size"),
        (["prune", "--older-than", "30"], "invalid duration '30'"),
        (["prune", "--older-than", "3 days"], "invalid duration"),
        (["import", "x", "--max-member-size", "lots"], "invalid size"),
        (["frobnicate"], "invalid choice"),
        (["warm", "m.jsonl"], "--target"),
    ],
)
def test_usage_errors_exit_2(tmp_path, args, words):
    proc = kc(tmp_path, *args)
    assert proc.returncode == 2
    assert words in proc.stderr


def test_bad_environment_variable_is_a_usage_error(tmp_path):
    proc = kc(tmp_path, "verify", env={"KERNELCACHE_LOCK_MODE": "sometimes"})
    assert proc.returncode == 2
    assert "KERNELCACHE_LOCK_MODE" in proc.stderr


def test_json_errors_are_json(tmp_path):
    proc = kc(tmp_path, "show", "ab" * 16, "--json")
    assert proc.returncode == 1
    doc = json.loads(proc.stdout)
    assert doc["command"] == "show" and "no entry" in doc["error"]


def test_errors_read_like_results(tmp_path):
    """An error's JSON is laid out as a result's (compact when piped), and a file that does
    not exist is a usage error for every command that reads one."""
    root = tmp_path / "cache"
    root.mkdir()
    error = kc(root, "show", "ab" * 16, "--json")
    result = kc(root, "stats", "--json")
    assert error.stdout.count("\n") == result.stdout.count("\n") == 1
    assert ": " not in error.stdout  # compact separators, as every piped document
    missing = kc(root, "import", str(tmp_path / "missing.tar"))
    assert missing.returncode == 2 and "missing.tar does not exist" in missing.stderr
    doc = json.loads(kc(root, "import", str(tmp_path / "missing.tar"), "--json").stdout)
    assert "does not exist" in doc["error"]


def test_root_from_the_environment(populated):
    proc = kc(None, "stats", "--json", env={"KERNELCACHE_DIR": str(populated)})
    assert json.loads(proc.stdout)["entries"] == 10


def test_global_options_before_or_after_the_command(populated):
    assert KERNELCACHE is not None
    for argv in (
        ["--root", str(populated), "--json", "stats"],
        ["stats", "--root", str(populated), "--json"],
    ):
        proc = subprocess.run([KERNELCACHE, *argv], capture_output=True, text=True, timeout=60)
        assert json.loads(proc.stdout)["entries"] == 10


@pytest.mark.parametrize(
    "text, value",
    [
        ("10G", 10 << 30),
        ("500M", 500 << 20),
        ("1.5GiB", int(1.5 * (1 << 30))),
        ("2TB", 2 * 10**12),
        ("4096B", 4096),
        ("64k", 64 << 10),
        ("1 MB", 10**6),
        ("0", 0),
    ],
)
def test_parse_size(text, value):
    assert parse_size(text) == value


def test_a_size_needs_its_unit(populated):
    """A bare number is refused as a size, as it is as an age: `--max-size 10` could mean 10
    bytes (deleting everything) or 10 gigabytes."""
    entries = sorted(populated.glob("*.json"))
    proc = kc(populated, "prune", "--max-size", "10", "--dry-run")
    assert proc.returncode == 2
    assert "invalid size '10'" in proc.stderr and "10G" in proc.stderr
    assert kc(populated, "import", "x.tar", "--max-member-size", "4096").returncode == 2
    bad = kc(populated, "-M", "50")
    assert bad.returncode == 2 and "max_size='50'" in bad.stderr and "invalid size" in bad.stderr
    # stats does not use the jobs' cap: it says it, and shows no cap
    said = kc(populated, "stats", env={"KERNELCACHE_MAX_SIZE": "50"})
    assert said.returncode == 0 and "KERNELCACHE_MAX_SIZE='50': invalid size" in said.stderr
    assert "needs a unit" in bad.stderr
    assert kc_json(populated, "stats", env={"KERNELCACHE_MAX_SIZE": "50G"})["max_size"] == 50 << 30
    kept = kc_json(populated, "prune", "--max-size", "10B", "--dry-run")["plan"]["kept_entries"]
    assert kept == 0 and sorted(populated.glob("*.json")) == entries
    zero = kc_json(populated, "prune", "--max-size", "0", "--dry-run")  # 0: no cap, as the variable
    assert zero["plan"]["kept_entries"] == len(entries) and zero["criteria"]["max_size"] is None


@pytest.mark.parametrize(
    "text, value",
    [
        ("30d", 30 * 86400),
        ("12h", 43200),
        ("90m", 5400),
        ("45s", 45),
        ("2w", 14 * 86400),
        ("1d12h", 129600),
        ("1.5h", 5400),
    ],
)
def test_parse_age(text, value):
    assert parse_age(text) == value


# -- no jax, no triton ----------------------------------------------------------------------
@pytest.fixture
def no_gpu_stack(tmp_path) -> dict[str, str]:
    """PYTHONPATH under which importing jax, jaxlib or triton fails."""
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    for name in ("jax", "jaxlib", "triton"):
        (shadow / f"{name}.py").write_text(f"raise ImportError('{name} is not installed here')\n")
    return {"PYTHONPATH": os.pathsep.join([str(shadow), os.environ.get("PYTHONPATH", "")])}


def test_runs_without_jax_or_triton(populated, tmp_path, no_gpu_stack):
    env = no_gpu_stack
    for args in (["stats"], ["ls"], ["verify"], ["prune", "--dry-run"], ["doctor"]):
        proc = kc(populated, *args, env=env)
        assert proc.returncode == 0, (args, proc.stderr)
    bundle = tmp_path / "b.tar.zst"
    assert kc(populated, "export", str(bundle), env=env).returncode == 0
    assert kc(tmp_path / "other", "import", str(bundle), env=env).returncode == 0
    doctor = kc_json(populated, "doctor", env=env)
    assert doctor["versions"]["triton"] is not None  # read from metadata, not imported


def test_warm_without_the_bridge_says_what_to_install(tmp_path, no_gpu_stack):
    proc = kc(tmp_path, "warm", "manifest.jsonl", "--target", "cuda:90", env=no_gpu_stack)
    assert proc.returncode == 2
    assert "pip install 'kernelcache[bridge]'" in proc.stderr
    assert "Traceback" not in proc.stderr


def _plugin_dist(site: Path, name: str, entry: str, module: str, source: str) -> None:
    """An installed distribution on ``site`` whose entry point adds a ``kernelcache`` command."""
    info = site / f"{name}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[kernelcache.commands]\n{name} = {entry}\n")
    (site / f"{module}.py").write_text(source)


def test_commands_from_other_packages_through_the_entry_point_group(tmp_path):
    site = tmp_path / "site"
    record = tmp_path / "called.json"
    _plugin_dist(
        site,
        "hello",
        "hello_plugin:register",
        "hello_plugin",
        "import json\n"
        "from kernelcache.cli import add_command, root_of\n"
        "def register(sub):\n"
        "    p = add_command(sub, 'hello', 'say hello')\n"
        "    p.add_argument('--times', type=int, default=1)\n"
        "    p.set_defaults(func=run)\n"
        "def run(args, out):\n"
        f"    open({str(record)!r}, 'w').write(json.dumps([root_of(args), args.times, out.json]))\n"
        "    return 3\n",
    )
    _plugin_dist(
        site, "broken", "broken_plugin:register", "broken_plugin", "raise RuntimeError('boom')\n"
    )
    env = {"PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    root = tmp_path / "cache"
    root.mkdir()
    proc = kc(root, "hello", "--times", "2", "--json", env=env)
    assert proc.returncode == 3, proc.stderr
    assert json.loads(record.read_text()) == [str(root), 2, True]
    # the broken plugin is named on stderr; the built-in commands still work
    assert "broken" in proc.stderr and "boom" in proc.stderr
    assert kc(root, "stats", env=env).returncode == 0
    assert "warm" in kc(root, "--help", env=env).stdout


# -- progress bars --------------------------------------------------------------------------
@pytest.mark.skipif(sys.platform != "linux", reason="pseudo-terminals as on Linux")
def test_progress_bar_only_on_a_terminal_and_never_with_json(tmp_path):
    root = tmp_path / "cache"
    for i in range(300):
        put(root, f"k{i}", size=400)
    code, shown = run_on_a_terminal([KERNELCACHE, "--root", str(root), "verify"])
    assert code == 0 and "verifying" in shown and "300 ok" in shown
    code, shown = run_on_a_terminal([KERNELCACHE, "--root", str(root), "verify", "--json"])
    assert code == 0 and "verifying" not in shown
    assert json.loads(shown)["entries_ok"] == 300
    piped = kc(root, "verify")
    assert "verifying" not in piped.stderr and "verifying" not in piped.stdout
