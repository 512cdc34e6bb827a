"""Scanning a root: entries from metadata, the scan index, collected problems, verification."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from cli_support import backdate, dead_pid, hold_shared, put
from support import HELPERS, IS_ROOT, child_env, key_of

from kernelcache.maintenance.index import GROUPED, INDEX_NAME
from kernelcache.maintenance.inventory import summarize
from kernelcache.maintenance.records import GRACE_SECONDS
from kernelcache.maintenance.scan import scan
from kernelcache.maintenance.verify import verify
from kernelcache.schema import MAX_ARTIFACT_BYTES, entry_digest
from kernelcache.store import Store
from kernelcache.table import EntryInfo


def _read_index(path: Path) -> tuple[dict, dict]:
    """The scan index's two lines: the header and the columns."""
    head, columns = path.read_text().split("\n", 1)
    return json.loads(head), json.loads(columns)


def _write_index(path: Path, head: dict, columns: dict) -> None:
    path.write_text(json.dumps(head) + "\n" + json.dumps(columns))


def _kinds(result) -> dict[str, set]:
    out: dict[str, set] = {}
    for issue in result.issues:
        out.setdefault(issue.kind, set()).add(issue.path)
    return out


def test_entries_from_metadata(tmp_path):
    root = tmp_path / "cache"
    a = put(root, "matmul", "cuda:90", "cubin", 1234, last_used=3 * 86400)
    b = put(root, "softmax", "hip:gfx942", "hsaco", 299)
    result = scan(root, last_used=True)
    assert result.exists and not result.issues
    by_key = {e.key: e for e in result.entries}
    ea = by_key[a.key]
    assert isinstance(ea, EntryInfo)
    assert (ea.ext, ea.size, ea.kernel, ea.target) == ("cubin", 1234, "matmul", "cuda:90")
    assert ea.meta_size == (root / f"{a.key}.json").stat().st_size
    assert ea.nbytes == 1234 + ea.meta_size
    assert abs(ea.last_used - (time.time() - 3 * 86400)) < 5
    assert ea.created == pytest.approx(a.meta["created"])
    assert by_key[b.key].kernel == "softmax"
    assert result.table.group("target") == {
        "cuda:90": (1, ea.nbytes),
        "hip:gfx942": (1, by_key[b.key].nbytes),
    }
    assert scan(root).entries[0].last_used is None  # not asked for: no stat


def test_missing_root(tmp_path):
    result = scan(tmp_path / "nope")
    assert not result.exists and not result.entries and not result.issues


def test_index_is_reused_and_follows_replaced_metadata(tmp_path):
    root = tmp_path / "cache"
    art = put(root, "first", size=310)
    scan(root)
    index = root / ".stats" / INDEX_NAME
    assert index.is_file()
    head, doc = _read_index(index)
    assert doc["keys"] == art.key and head["totals"]["entries"] == 1
    # Republish the metadata with another name (a new file, as the store always does).
    meta = json.loads((root / f"{art.key}.json").read_text())
    meta["name"] = "second"
    meta["entry_digest"] = entry_digest(meta)
    tmp = root / "new.tmp"
    tmp.write_text(json.dumps(meta))
    os.replace(tmp, root / f"{art.key}.json")
    assert scan(root).entries[0].kernel == "second"
    # Rows for entries that disappeared are dropped.
    (root / f"{art.key}.json").unlink()
    (root / f"{art.key}.cubin").unlink()
    assert scan(root).entries == ()
    assert _read_index(index)[1]["keys"] == ""


def test_a_young_orphan_is_found_once_it_is_old_though_the_listing_is_unchanged(tmp_path):
    root = tmp_path / "cache"
    put(root, "entry", size=310)
    orphan = put(root, "orphan", size=310)
    (root / f"{orphan.key}.json").unlink()
    assert scan(root).issues == ()  # young: maybe a publish in progress
    assert scan(root).issues == ()  # (and the index is now written)
    backdate(Path(orphan.path), time.time() - GRACE_SECONDS - 60)  # the listing is the same
    assert [i.kind for i in scan(root).issues] == ["orphan-artifact"]


def test_index_of_an_unchanged_listing_is_taken_whole(tmp_path):
    root = tmp_path / "cache"
    arts = [put(root, f"k{i}", size=310 + i) for i in range(3)]
    first = scan(root)
    index = root / ".stats" / INDEX_NAME
    assert _read_index(index)[0]["listing"]  # a clean listing: its signature is kept
    second = scan(root)
    assert sorted(second.entries) == sorted(first.entries)
    (root / "stray").write_text("x")
    third = scan(root)
    assert [i.path for i in third.issues] == ["stray"]
    (root / "stray").unlink()
    assert scan(root).issues == () and len(scan(root).entries) == len(arts)


def test_summary_from_the_index_header_equals_a_full_scan(tmp_path):
    root = tmp_path / "cache"
    for i in range(5):
        put(root, f"k{i % 2}", "cuda:90" if i % 3 else "hip:gfx942", size=300 + i)

    def expected():
        table = scan(root, update_index=False).table
        groups = {c: table.group(c) for c in GROUPED}
        return len(table), sum(table.size), sum(table.meta_size), groups

    cold = summarize(root)  # no index yet: a full scan, which writes it
    assert (cold.entries, cold.artifact_bytes, cold.metadata_bytes, cold.groups) == expected()
    warm = summarize(root)  # the header of an unchanged listing
    assert (warm.entries, warm.artifact_bytes, warm.metadata_bytes, warm.groups) == expected()
    put(root, "new", "cuda:80", size=307)
    after = summarize(root)
    assert after.entries == 6 and after.groups["target"]["cuda:80"][0] == 1
    assert (after.entries, after.artifact_bytes, after.metadata_bytes, after.groups) == expected()
    (root / "junk").write_text("x")
    assert summarize(root).problems == 1


@pytest.mark.parametrize(
    "mutate",
    [
        lambda h, d: d.update(size=[-1] * len(d["size"])),
        lambda h, d: d.update(kernel=[99] * len(d["kernel"])),
        lambda h, d: d.update(inode=["x"] * len(d["inode"])),
        lambda h, d: d.update(ext=d["ext"][:-1]),
        lambda h, d: d.pop("strings"),
        lambda h, d: d.update(created=["yesterday"] * len(d["created"])),
        lambda h, d: h.update(v=1),
        lambda h, d: h.update(totals={"entries": -1}),
        lambda h, d: h["groups"].update(kernel=[["k0", "many", 3]]),
        lambda h, d: h.update(listing=None),
    ],
)
def test_malformed_index_is_ignored(tmp_path, mutate):
    root = tmp_path / "cache"
    for i in range(3):
        put(root, f"k{i}", size=310 + i)
    truth = sorted(scan(root, update_index=False).entries)
    index = root / ".stats" / INDEX_NAME
    assert not index.exists()
    scan(root)
    head, doc = _read_index(index)
    mutate(head, doc)
    _write_index(index, head, doc)
    assert sorted(scan(root, update_index=False).entries) == truth
    summary = summarize(root)
    assert summary.entries == 3 and summary.groups["kernel"]["k0"][0] == 1


def test_index_that_lies_about_inodes_is_not_trusted(tmp_path):
    root = tmp_path / "cache"
    put(root, "real", size=310)
    scan(root)
    index = root / ".stats" / INDEX_NAME
    head, doc = _read_index(index)
    doc["strings"] = ["cubin" if s == "cubin" else "forged" for s in doc["strings"]]
    doc["inode"] = [i + 1 for i in doc["inode"]]
    head["listing"] = None
    _write_index(index, head, doc)
    assert scan(root).entries[0].kernel == "real"


def test_problems_are_collected(tmp_path):
    root = tmp_path / "cache"
    good = put(root, "good", size=310)
    young = put(root, "young-orphan", size=310)
    (root / f"{young.key}.json").unlink()
    old = put(root, "old-orphan", size=310)
    (root / f"{old.key}.json").unlink()
    backdate(Path(old.path), time.time() - GRACE_SECONDS - 60)
    second = root / f"{good.key}.ptx"  # a second artifact for a key
    second.write_bytes(b"extra")
    backdate(second, time.time() - GRACE_SECONDS - 60)
    (root / f"{key_of('bad ext')}.CUBIN").write_bytes(b"x")
    (root / "README").write_text("hello")
    (root / ".mystery").write_text("?")
    (root / ".tmp").mkdir(exist_ok=True)
    (root / ".tmp" / "fresh.tmp").write_bytes(b"in progress")
    (root / ".tmp" / "dead.tmp").write_bytes(b"left behind")
    backdate(root / ".tmp" / "dead.tmp", time.time() - GRACE_SECONDS - 60)
    result = scan(root)
    kinds = _kinds(result)
    assert kinds["orphan-artifact"] == {f"{old.key}.cubin", f"{good.key}.ptx"}
    assert kinds["stale-temp"] == {".tmp/dead.tmp"}
    assert kinds["foreign"] == {"README", ".mystery", f"{key_of('bad ext')}.CUBIN"}
    assert [e.key for e in result.entries] == [good.key]
    assert [f.path for f in result.temp] == [".tmp/dead.tmp", ".tmp/fresh.tmp"]


def test_stale_locks(tmp_path):
    root = tmp_path / "cache"
    live = put(root, "live", size=310)
    locks = root / ".locks"
    locks.mkdir(exist_ok=True)
    old = time.time() - GRACE_SECONDS - 60
    names = {
        "entry": f"{live.key}.lock",  # its entry exists: never stale
        "gone": f"{key_of('gone')}.lock",
        "gone-build": f"{key_of('gone')}.build.lock",
        "held": f"{key_of('held')}.lock",
        "young": f"{key_of('young')}.lock",
        "dead-soft": f"{key_of('dead')}.softlock",
        "live-soft": f"{key_of('alive')}.softlock",
        "broken": f"{key_of('broken')}.softlock.broken-0123",  # a breaker died before its unlink
        "staged": f"{key_of('staged')}.softlock.staged-4567",  # a taker died before its unlink
    }
    for name in names.values():
        (locks / name).write_bytes(b"")
    host = socket.gethostname()
    gone_pid = dead_pid()
    (locks / names["dead-soft"]).write_text(
        json.dumps({"host": host, "pid": gone_pid, "token": "t"})
    )
    (locks / names["live-soft"]).write_text(
        json.dumps({"host": host, "pid": os.getpid(), "token": "u"})
    )
    for kind, name in names.items():
        if kind != "young":
            backdate(locks / name, old if "soft" not in kind else time.time())
    holder = hold_shared(locks / names["held"])
    try:
        result = scan(root, locks=True)
    finally:
        holder.communicate("", timeout=30)
    stale = _kinds(result).get("stale-lock", set())
    assert stale == {
        f".locks/{names[k]}" for k in ("gone", "gone-build", "dead-soft", "broken", "staged")
    }


def test_verify_reads_every_artifact_without_touching_stamps(tmp_path):
    root = tmp_path / "cache"
    good = put(root, "good", size=300, last_used=3 * 86400)  # a whole cubin
    bad = put(root, "bad", size=300, last_used=3 * 86400)
    Path(bad.path).write_bytes(b"\1" * 300)
    stamp = (root / f"{good.key}.json").stat().st_mtime
    quick = scan(root, last_used=True)
    assert len(quick.entries) == 2 and not quick.issues  # sizes match: only digests tell
    checked = verify(Store(root), quick)
    assert [e.key for e in checked.entries] == [good.key]
    assert [(i.kind, i.key, i.detail) for i in checked.issues] == [
        ("corrupt", bad.key, "artifact digest mismatch")
    ]
    assert (root / f"{good.key}.json").stat().st_mtime == stamp
    assert (root / f"{bad.key}.json").exists()  # verify only reports


@pytest.mark.skipif(not IS_ROOT, reason="needs root to give a file to another user")
def test_verify_reports_untrusted_entries(tmp_path):
    root = tmp_path / "cache"
    art = put(root, "foreign-owner", size=300)  # a whole cubin: its owner is the problem
    os.chown(art.path, 65534, 65534)
    checked = verify(Store(root), scan(root))
    assert [(i.kind, i.key) for i in checked.issues] == [("untrusted", art.key)]
    assert verify(Store(root, trust="any"), scan(root)).issues == ()


def test_scan_concurrent_with_writers_reports_no_false_problems(tmp_path):
    root = tmp_path / "cache"
    code = """
        import sys, kernelcache
        from support import key_of
        s = kernelcache.Store(sys.argv[1])
        for i in range(300):
            s.put(key_of("w", sys.argv[2], i), "bin", b"x" * (i + 1), {"name": "w"})
    """
    env = child_env(PYTHONPATH=str(HELPERS) + os.pathsep + child_env()["PYTHONPATH"])
    writers = [
        subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), str(root), str(n)], env=env)
        for n in range(2)
    ]
    scans = 0
    while any(w.poll() is None for w in writers):
        result = scan(root, locks=True)
        assert not [i for i in result.issues if i.kind != "stale-temp"], result.issues
        scans += 1
    assert all(w.wait() == 0 for w in writers)
    assert scans > 0
    assert len(scan(root).entries) == 600
    assert Store(root).read(key_of("w", "0", 5)).data == b"x" * 6


# -- what the file system says, not what metadata claims ------------------------------------
def _lie_about_size(root: Path, art, size: int) -> None:
    """Rewrite an entry's metadata so that it claims ``size`` bytes, entry digest and all (an
    entry digest is no secret: anyone who can write the file can recompute it)."""
    meta = root / f"{art.key}.json"
    doc = json.loads(meta.read_text())
    doc["size"] = size
    doc["entry_digest"] = entry_digest(doc)
    meta.write_text(json.dumps(doc))


def test_sizes_come_from_the_file_system(tmp_path):
    root = tmp_path / "cache"
    good = [put(root, f"good{i}", size=1000) for i in range(3)]
    liar = put(root, "liar", size=400)
    _lie_about_size(root, liar, MAX_ARTIFACT_BYTES)
    for last_used in (False, True):
        result = scan(root, last_used=last_used)
        sizes = {e.key: e.size for e in result.entries}
        assert sizes[liar.key] == 400, last_used
        assert all(sizes[g.key] == 1000 for g in good)
        assert result.table.nbytes < 10_000
    assert summarize(root).artifact_bytes == 3 * 1000 + 400
    # an artifact that grows in place (same inode, same metadata) is measured again
    with open(good[0].path, "ab") as f:
        f.write(b"x" * 500)
    sizes = {e.key: e.size for e in scan(root, last_used=True).entries}
    assert sizes[good[0].key] == 1500


def test_future_dated_housekeeping_files_are_reported_once_old(tmp_path):
    """Orphans, staging files and lock files whose mtime is in the future age from when they
    last changed (their ctime), so they are not kept forever."""
    root = tmp_path / "cache"
    put(root, "keep", size=310)
    orphan = put(root, "orphan", size=310)
    (root / f"{orphan.key}.json").unlink()
    (root / ".tmp").mkdir(exist_ok=True)
    staging = root / ".tmp" / "host-1-dead.tmp"
    staging.write_bytes(b"half")
    (root / ".locks").mkdir(exist_ok=True)
    lock = root / ".locks" / f"{key_of('gone')}.lock"
    lock.write_bytes(b"")
    future = time.time() + 30 * 86400
    for path in (Path(orphan.path), staging, lock):
        backdate(path, future)
    now = scan(root, locks=True)
    assert not {"orphan-artifact", "stale-temp", "stale-lock"} & set(_kinds(now))  # young
    later = scan(root, locks=True, now=time.time() + GRACE_SECONDS + 600)
    kinds = _kinds(later)
    assert kinds["orphan-artifact"] == {f"{orphan.key}.cubin"}
    assert kinds["stale-temp"] == {".tmp/host-1-dead.tmp"}
    assert f".locks/{lock.name}" in kinds["stale-lock"]


def test_the_bridges_handoff_directory_is_not_foreign(tmp_path):
    import bridge.embed.handoff  # noqa: F401  (registers the directory, as the bridge does at import)

    root = tmp_path / "cache"
    put(root, "k", size=310)
    (root / ".handoff").mkdir()
    first = scan(root)
    assert "foreign" not in _kinds(first)
    head, _ = _read_index(root / ".stats" / INDEX_NAME)
    assert head["listing"] is not None  # the listing is clean: the index's fast path is on
