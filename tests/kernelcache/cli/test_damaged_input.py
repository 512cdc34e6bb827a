"""The ``kernelcache`` command on damaged, hostile and mistyped input, through the real console
script: files that lie, files that would block, roots that do not exist, settings that are
wrong, names that carry terminal escapes, numbers that are not numbers."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from pathlib import Path

import pytest
from cli_support import KERNELCACHE, backdate, dead_pid, files_under, kc, kc_json, put
from support import CAN_UNSHARE, child_env, key_of

import bridge  # noqa: F401  (declares the bridge's variables, as the command's plugin does)
from kernelcache.config import variables
from kernelcache.remote import parse_url
from kernelcache.schema import MAX_ARTIFACT_BYTES, entry_digest
from kernelcache.store import Store

SECRET = "s3cr3t-pa55"


def _strict_json(text: str) -> dict:
    """Parse JSON as a strict parser would: NaN and Infinity are not JSON."""

    def refuse(name: str) -> None:
        raise ValueError(f"{name} is not JSON")

    return json.loads(text, parse_constant=refuse)


def _rewrite_metadata(root: Path, key: str, **fields: object) -> None:
    """Change fields of an entry's metadata and recompute its entry digest, as anyone who can
    write the file can: the entry stays well formed and lies."""
    meta = root / f"{key}.json"
    doc = json.loads(meta.read_text())
    doc.update(fields)
    doc["entry_digest"] = entry_digest(doc)
    meta.write_text(json.dumps(doc))


# -- an entry that lies about its size ------------------------------------------------------
def test_an_entry_that_lies_about_its_size_does_not_steer_prune_or_stats(tmp_path):
    root = tmp_path / "cache"
    good = [put(root, f"good{i}", size=1000, last_used=86400 * (i + 1)) for i in range(5)]
    liar = put(root, "liar", size=400, last_used=60)
    _rewrite_metadata(root, liar.key, size=MAX_ARTIFACT_BYTES)  # the most the schema allows
    stats = kc_json(root, "stats")
    metadata = sum(p.stat().st_size for p in root.glob("*.json"))
    assert stats["artifact_bytes"] == 5 * 1000 + 400
    assert stats["bytes"] == 5 * 1000 + 400 + metadata
    assert {e["key"]: e["size"] for e in kc_json(root, "ls")["entries"]}[liar.key] == 400
    doc = kc_json(root, "prune", "--max-size", "1G")
    assert doc["plan"]["summary"].get("delete-entry") is None
    assert all(Path(g.path).exists() for g in good)
    found = kc_json(root, "verify", code=1)["problems"]
    assert [(p["kind"], p["key"]) for p in found] == [("corrupt", liar.key)]


# -- nothing under a root, and no input path, may block -------------------------------------
def test_a_fifo_or_device_link_among_the_statistics_logs_does_not_hang(tmp_path):
    root = tmp_path / "cache"
    put(root, "k", size=310)
    logs = root / ".stats"
    logs.mkdir(exist_ok=True)
    os.mkfifo(logs / "planted.jsonl")
    os.mkfifo(logs / "summary.jsonl")
    os.mkfifo(logs / f"{socket.gethostname()}-{dead_pid()}-deadbeef.jsonl")  # foldable
    (logs / "zero.jsonl").symlink_to("/dev/zero")
    doc = kc_json(root, "stats", timeout=30)
    assert doc["entries"] == 1
    problems = " ".join(doc["log_problems"])
    assert "planted.jsonl" in problems and "zero.jsonl" in problems
    assert kc(root, "stats", "--format", "prometheus", timeout=30).returncode == 0
    kc(root, "prune", timeout=30)  # folding must not hang either (its exit code may say 1)


@pytest.mark.parametrize(
    "delta",
    [{"hits": 10**400}, {"hits": 1e308}, {"hits": -5}, {"builds": float("nan")}, {"hits": "1"}],
    ids=["huge-int", "near-overflow", "negative", "nan", "string"],
)
def test_odd_counters_in_statistics_logs_are_ignored_by_stats_and_prune(tmp_path, delta):
    """A log is untrusted: odd values are skipped, never summed into inf or a crash, and a
    fold keeps working (its summary stays readable by the next stats and prune)."""
    root = tmp_path / "cache"
    put(root, "k", size=310)
    logs = root / ".stats"
    logs.mkdir(exist_ok=True)
    for i in range(2):  # two 1e308 lines would sum to inf
        name = f"{socket.gethostname()}-{dead_pid()}-odd{i}.jsonl"
        good = {"v": 1, "delta": {"hits": 3}}
        bad = {"v": 1, "delta": delta}
        (logs / name).write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n")
    before = kc_json(root, "stats")
    assert before["counters"]["hits"] == 6
    done = kc(root, "prune", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout)["result"]["folded_logs"] == 2
    after = kc_json(root, "stats")
    assert after["counters"]["hits"] == 6 and after["processes"] == 2
    assert kc(root, "prune").returncode == 0


def test_a_statistics_summary_with_odd_fields_is_not_used(tmp_path):
    root = tmp_path / "cache"
    put(root, "k", size=310)
    logs = root / ".stats"
    logs.mkdir(exist_ok=True)
    foldable = logs / f"{socket.gethostname()}-{dead_pid()}-x.jsonl"
    for summary in (
        {"v": 1, "summary": True, "logs": 1, "delta": {"hits": 1}, "folded": [{"a": 1}]},
        {"v": 1, "summary": True, "logs": 10**400, "delta": {"hits": 1}, "folded": []},
    ):
        (logs / "summary.jsonl").write_text(json.dumps(summary) + "\n")
        foldable.write_text('{"v": 1, "delta": {"hits": 2}}\n')
        assert kc_json(root, "stats")["counters"]["hits"] >= 2
        done = kc(root, "prune", "--json")
        assert done.returncode == 1, done.stderr  # the fold fails, saying why; nothing crashes
        assert "summary.jsonl" in json.loads(done.stdout)["result"]["fold_error"]
        assert foldable.exists(), "a log is never lost to a fold that cannot write its summary"


def test_a_statistics_log_named_with_unicode_digits_does_not_crash_prune(tmp_path):
    root = tmp_path / "cache"
    put(root, "k", size=310)
    logs = root / ".stats"
    logs.mkdir(exist_ok=True)
    (logs / f"{socket.gethostname()}-\u00b2-x.jsonl").write_text('{"v": 1, "delta": {}}\n')
    proc = kc(root, "prune")
    assert proc.returncode == 0, proc.stderr


# -- a mistyped --root -----------------------------------------------------------------------
@pytest.mark.parametrize(
    "args",
    [
        ["stats", "--zero"],
        ["show", "ab" * 16],
        ["verify"],
        ["verify", "--repair"],
        ["prune", "--dry-run"],
        ["prune", "--max-size", "1G"],
        ["export", "BUNDLE"],
    ],
    ids=lambda a: " ".join(a),
)
def test_commands_on_a_missing_root_exit_2_and_name_it(tmp_path, args):
    root = tmp_path / "mistyped"
    bundle = tmp_path / "out.tar"
    args = [str(bundle) if a == "BUNDLE" else a for a in args]
    proc = kc(root, *args)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert str(root) in proc.stderr and "does not exist" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not root.exists() and not bundle.exists()
    if "--format" not in args:  # (--json conflicts with --format prometheus)
        doc = json.loads(kc(root, *args, "--json").stdout)
        assert str(root) in doc["error"]


def test_a_root_that_is_a_file_is_a_usage_error(tmp_path):
    root = tmp_path / "file"
    root.write_text("not a directory")
    proc = kc(root, "ls")
    assert proc.returncode == 2 and "not a directory" in proc.stderr


def test_doctor_and_import_on_a_missing_root(tmp_path):
    root = tmp_path / "new"
    doc = kc_json(root, "doctor")
    assert doc["exists"] is False
    assert not root.exists()
    populated = tmp_path / "populated"
    put(populated, "k", size=310)
    bundle = tmp_path / "b.tar"
    kc_json(populated, "export", str(bundle))
    assert kc_json(root, "import", str(bundle))["imported"] == 1  # a write creates its root


def test_a_misspelt_variable_is_said_by_every_command(tmp_path):
    """KERNELCACHE_DIRR would silently leave the root at its default: every command says so
    (doctor among its checks), and a declared variable (the bridge's too) is not flagged."""
    put(tmp_path / "root", "k", size=310)
    env = {"KERNELCACHE_DIRR": str(tmp_path / "x"), "KERNELCACHE_AUTOTUNE": "job"}
    for args in (["ls"], ["stats"], ["verify"]):
        proc = kc(tmp_path / "root", *args, env=env)
        assert proc.returncode == 0, proc.stderr
        assert "KERNELCACHE_DIRR is not a kernelcache variable" in proc.stderr, args
        assert "did you mean KERNELCACHE_DIR?" in proc.stderr
        assert "KERNELCACHE_AUTOTUNE" not in proc.stderr
    doctor = kc(tmp_path / "root", "doctor", env=env)
    assert doctor.stderr.count("KERNELCACHE_DIRR") == 0 and "KERNELCACHE_DIRR" in doctor.stdout


def test_doctor_says_what_is_wrong_with_the_root_once(tmp_path):
    """A root that is a file is "not a directory" in the header as in the check, and a
    missing one "does not exist yet" in both."""
    afile = tmp_path / "afile"
    afile.write_text("x")
    said = kc(afile, "doctor").stdout
    head = said.splitlines()[0]
    assert head.endswith("(is not a directory)") and "does not exist" not in said, said
    assert f"{afile} is not a directory" in said
    missing = kc(tmp_path / "nosuch", "doctor").stdout
    assert missing.splitlines()[0].endswith("(does not exist yet)")
    assert "is not a directory" not in missing


# -- future-dated files ----------------------------------------------------------------------
def test_future_dated_quarantined_files_are_removed_by_age(tmp_path):
    root = tmp_path / "cache"
    put(root, "keep", size=310)
    q = root / ".quarantine"
    q.mkdir()
    (q / "a.cubin.1").write_bytes(b"q" * 10)
    backdate(q / "a.cubin.1", time.time() + 365 * 86400)
    time.sleep(0.05)
    doc = kc_json(root, "prune", "--quarantine-age", "0s")
    assert doc["plan"]["summary"] == {"remove-quarantined": {"count": 1, "bytes": 10}}
    assert list(q.iterdir()) == []


# -- doctor: every setting, one line each ----------------------------------------------------
def _setting_checks(doc: dict) -> dict[str, dict]:
    return {c["name"]: c for c in doc["checks"] if c["name"].startswith("KERNELCACHE_")}


def test_doctor_reports_every_setting_on_its_own_line(tmp_path):
    root = tmp_path / "cache"
    root.mkdir()
    doc = kc_json(root, "doctor")
    checks = _setting_checks(doc)
    assert sorted(checks) == sorted(v.name for v in variables())
    assert all(c["status"] == "ok" for c in checks.values())
    human = kc(root, "doctor").stdout.splitlines()
    for var in variables():
        assert sum(var.name + ":" in line for line in human) == 1, var.name


def test_doctor_checks_the_remote_url_and_hides_its_password(tmp_path):
    root = tmp_path / "cache"
    root.mkdir()
    bad = f"redis://:{SECRET}@h:6379/0?timeout=fast"
    proc = kc(root, "doctor", "--json", env={"KERNELCACHE_REMOTE": bad})
    assert proc.returncode == 1, proc.stderr
    assert SECRET not in proc.stdout + proc.stderr
    check = _setting_checks(json.loads(proc.stdout))["KERNELCACHE_REMOTE"]
    assert check["status"] == "fail" and "timeout" in check["detail"]
    human = kc(root, "doctor", env={"KERNELCACHE_REMOTE": "http://h:6379/0"})
    assert human.returncode == 1
    assert any(
        "KERNELCACHE_REMOTE" in line and "unsupported scheme" in line
        for line in human.stdout.splitlines()
    )
    good = f"redis://:{SECRET}@h:6379/0?ttl=7d&timeout=0.5"
    ok = kc(root, "doctor", "--json", env={"KERNELCACHE_REMOTE": good})
    assert SECRET not in ok.stdout + ok.stderr
    checks = {c["name"]: c for c in json.loads(ok.stdout)["checks"]}
    assert checks["KERNELCACHE_REMOTE"]["status"] == "ok"
    # the URL is fine, but nothing answers there: doctor connects and says so
    assert checks["remote redis://:***@h:6379/0"]["status"] == "fail" and ok.returncode == 1


def test_doctor_reports_every_bad_setting_even_without_a_root(tmp_path):
    env = {
        "KERNELCACHE_LOCK_TIMEOUT": "soon",
        "KERNELCACHE_TARGET": "gfx942",
        "KERNELCACHE_DIR": str(tmp_path / "cache"),
    }
    proc = kc(None, "doctor", "--json", env=env)
    assert proc.returncode == 1, proc.stderr
    checks = _setting_checks(json.loads(proc.stdout))
    assert checks["KERNELCACHE_LOCK_TIMEOUT"]["status"] == "fail"
    assert checks["KERNELCACHE_TARGET"]["status"] == "fail"
    assert checks["KERNELCACHE_DIR"]["status"] == "ok"
    # even the root's own variable may be wrong: the rest is still reported
    proc = kc(None, "doctor", "--json", env={"KERNELCACHE_DIR": "~no-such-user-here/x"})
    assert proc.returncode == 1, proc.stderr
    doc = json.loads(proc.stdout)
    assert _setting_checks(doc)["KERNELCACHE_DIR"]["status"] == "fail"
    assert doc["root"] is None


# -- smaller things --------------------------------------------------------------------------
def test_prune_by_kernel_without_a_limit_says_what_it_deletes(tmp_path):
    root = tmp_path / "cache"
    for i in range(3):
        put(root, "old", size=310, seed=i)
    keep = put(root, "other", size=310)
    helptext = kc(None, "prune", "--help").stdout
    assert "every matching entry" in " ".join(helptext.split())
    proc = kc(root, "prune", "--kernel", "old")
    assert proc.returncode == 0
    assert "3 entries" in proc.stderr and "--kernel" in proc.stderr  # said before it acts
    assert [p.stem for p in root.glob("*.json")] == [keep.key]
    dry = kc(root, "prune", "--kernel", "other", "--dry-run")
    assert "Dry run" in dry.stdout and (root / f"{keep.key}.json").exists()


def test_one_parser_of_sizes_everywhere():
    from kernelcache.cli import parse_size

    assert parse_size("64MB") == 64_000_000
    assert parse_url("redis://h:6379/0?max_size=64MB")[1].max_size == 64_000_000
    assert parse_url("redis://h:6379/0?max_size=64M")[1].max_size == 64 << 20
    assert parse_url("redis://h:6379/0?max_size=1.5M")[1].max_size == int(1.5 * (1 << 20))
    assert parse_url("redis://h:6379/0?ttl=1d12h")[1].ttl == 36 * 3600


@pytest.mark.parametrize(
    "args, words",
    [
        (["export", "{tmp}/x.tar.zst", "--level", "99"], "--level"),
        (["export", "{tmp}/x.tar.zst", "--level", "0"], "--level"),
        (["ls", "--limit", "-1"], "--limit"),
        (["stats", "--top", "-3"], "--top"),
    ],
)
def test_out_of_range_numbers_are_usage_errors(tmp_path, args, words):
    root = tmp_path / "cache"
    put(root, "k", size=310)
    proc = kc(root, *(a.format(tmp=tmp_path) for a in args))
    assert proc.returncode == 2, proc.stderr
    assert words in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "x.tar.zst").exists()


def test_an_unexpandable_root_is_a_clear_error(tmp_path):
    proc = kc(None, "stats", env={"KERNELCACHE_DIR": "~no-such-user-here/x"})
    assert proc.returncode == 2 and "KERNELCACHE_DIR" in proc.stderr
    with pytest.raises(ValueError, match="no-such-user-here"):
        Store("~no-such-user-here/x")


def test_json_never_holds_nan_or_infinity(tmp_path):
    """Metadata with NaN or Infinity is refused by the schema; the commands that show it anyway
    (``show`` of a corrupt entry, ``ls`` and ``verify`` problems) print strict JSON."""
    root = tmp_path / "cache"
    put(root, "fine", size=310)
    art = put(root, "k", size=310)
    meta = root / f"{art.key}.json"
    meta.write_text(meta.read_text().replace(f'"created":{art.meta["created"]}', '"created":NaN'))
    assert "NaN" in meta.read_text()
    other = put(root, "j", size=310)
    meta = root / f"{other.key}.json"
    meta.write_text(meta.read_text()[:-1] + ',"shared":Infinity}')
    for args in (["ls"], ["show", art.key], ["show", other.key], ["stats"], ["verify"]):
        proc = kc(root, *args, "--json")
        doc = _strict_json(proc.stdout)
        assert doc["command"] == args[0]
    human = kc(root, "ls").stdout + kc(root, "show", art.key).stdout
    assert "nand ago" not in human and "nan ago" not in human


ESCAPE = "evil\x1b[2J\x1b[31mred\nforged line\r"


def test_names_with_terminal_escapes_or_newlines_are_printed_escaped(tmp_path):
    """The schema refuses such names in entries, but an entry whose metadata carries one is
    still shown (as corrupt), and file names are whatever someone made them."""
    root = tmp_path / "cache"
    put(root, "fine", size=310)
    art = put(root, "k", size=310)
    meta = root / f"{art.key}.json"
    doc = json.loads(meta.read_text())
    doc["name"] = ESCAPE
    doc["note"] = ESCAPE
    meta.write_text(json.dumps(doc))
    (root / "notes\x1b[1m.txt").write_text("?")
    for args in (
        ["ls"],
        ["stats"],
        ["show", art.key],
        ["verify"],
        ["prune", "--dry-run", "--list"],
    ):
        proc = kc(root, *args)
        shown = proc.stdout + proc.stderr
        assert "\x1b" not in shown and "\r" not in shown, args
        assert not [line for line in shown.splitlines() if line.startswith("forged line")], args
    assert "\\x1b[1m" in kc(root, "verify").stdout
    assert kc_json(root, "show", art.key, code=1)["metadata"]["note"] == ESCAPE  # JSON: as is


def test_stats_does_not_count_identity_records_as_kernels(tmp_path):
    root = tmp_path / "cache"
    put(root, "matmul", size=300)
    store = Store(root)
    for label in ("triton_key", "backend:cuda:90"):
        store.put(
            key_of("identity", label), "ident", b"digest", {"kind": "identity", "name": label}
        )
    doc = kc_json(root, "stats")
    assert list(doc["by_kernel"]) == ["matmul"]
    assert doc["entries"] == 3
    assert doc["by_kind"]["identity"]["entries"] == 2
    assert doc["by_kind"]["kernel"]["entries"] == 1
    assert "triton_key" not in kc(root, "stats").stdout


def test_the_handoff_directory_is_not_foreign(tmp_path):
    root = tmp_path / "cache"
    put(root, "k", size=400)  # a whole cubin: verify finds nothing else
    (root / ".handoff").mkdir()
    assert kc_json(root, "verify")["clean"] is True
    before = files_under(root)
    assert kc_json(root, "stats")["problems"] == 0
    assert files_under(root) >= before


@pytest.mark.parametrize(
    ("version", "status"), [("4.3.1", "ok"), ("3.30.0", "ok"), ("3.29.7", "fail"), (None, "fail")]
)
def test_doctor_says_whether_filelock_can_take_the_locks(version, status):
    from kernelcache.doctor import filelock_check

    check = filelock_check(version)
    assert check.status == status
    if status == "fail":
        assert "pip install 'filelock>=3.30,<5'" in check.detail


def test_doctor_reports_the_installed_filelock(tmp_path):
    import filelock

    root = tmp_path / "cache"
    root.mkdir()
    doc = kc_json(root, "doctor")
    assert doc["versions"]["filelock"] == filelock.__version__
    assert {"name": "filelock", "status": "ok", "detail": filelock.__version__} in doc["checks"]


def test_argument_mistakes_are_named_with_what_was_meant(tmp_path):
    """A negative size is refused for being negative (not "expected one argument"); a
    misspelt command or option gets the nearest one, and the command's own usage."""
    proc = kc(tmp_path, "prune", "--max-size", "-5G")
    assert proc.returncode == 2 and "invalid size '-5G'" in proc.stderr, proc.stderr
    assert "expected one argument" not in proc.stderr
    proc = kc(tmp_path, "stat")
    assert proc.returncode == 2 and "did you mean 'stats'?" in proc.stderr, proc.stderr
    proc = kc(tmp_path, "ls", "--kernal", "x")
    assert proc.returncode == 2 and "did you mean --kernel?" in proc.stderr, proc.stderr
    assert "kernelcache ls: error" in proc.stderr and "usage: kernelcache ls" in proc.stderr
    proc = kc(tmp_path, "ls", "--limit", "-1")
    assert proc.returncode == 2 and "invalid count '-1'" in proc.stderr, proc.stderr
    from kernelcache.cli.app import _joined_negatives

    given = ["run", "--", "python", "--seed", "-1"]  # a command's own arguments: as given
    assert _joined_negatives(given) == given


def test_a_write_error_is_said_once_without_errno_or_a_doubled_prefix(tmp_path):
    """An import into a root that cannot be made: one plain message naming the root and what
    to do, no ``[Errno N]`` and no second ``kernelcache:``."""
    populated = tmp_path / "populated"
    put(populated, "k", size=310)
    bundle = tmp_path / "b.tar"
    kc_json(populated, "export", str(bundle))
    (tmp_path / "afile").write_text("")
    proc = kc(tmp_path / "afile" / "root", "import", str(bundle))
    assert proc.returncode == 2, proc.stderr  # nothing done: the root cannot take it
    assert "cannot log statistics" not in proc.stderr, "said once: the error named the root"
    (line,) = [e for e in proc.stderr.splitlines() if "error" in e]
    assert line.startswith("kernelcache: error: cannot write under "), line
    assert "[Errno" not in line and line.count("kernelcache:") == 1, line
    assert "Not a directory" in line and "nothing was imported" in line


@pytest.mark.skipif(not CAN_UNSHARE, reason="needs a private mount namespace for a full disk")
def test_an_import_onto_a_full_disk_is_one_error_and_no_statistics_warning(tmp_path):
    """The disk fills during an import: exit 2 (nothing imported), one error naming the
    root and "No space left", and no second warning about the statistics log."""
    populated = tmp_path / "populated"
    for i in range(8):
        put(populated, f"k{i}", size=40_000)
    bundle = tmp_path / "b.tar"
    kc_json(populated, "export", str(bundle))
    root = tmp_path / "full"
    root.mkdir()
    script = f'mount -t tmpfs -o size=96k tmpfs "{root}" && exec "$KC" --root "{root}" import "$B"'
    proc = subprocess.run(
        ["unshare", "-rm", "sh", "-c", script],
        env=child_env(KC=str(KERNELCACHE), B=str(bundle)),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert "cannot log statistics" not in proc.stderr, proc.stderr
    (line,) = [e for e in proc.stderr.splitlines() if "error" in e]
    assert "No space left" in line and "[Errno" not in line and str(root) in line, line
