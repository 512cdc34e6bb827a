"""Prune: the plan (size cap, age, filters, housekeeping), its execution under the per-key
locks while other processes read and write, and the folding of statistics logs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from artifact_images import elf_image
from cli_support import backdate, dead_pid, hold_shared, kc, kc_json, put, put_companion
from support import HELPERS, child_env, key_of

from kernelcache import stats
from kernelcache.maintenance.execute import execute
from kernelcache.maintenance.prune import plan_prune
from kernelcache.maintenance.scan import scan
from kernelcache.stats import SUMMARY_NAME, fold_logs, foldable_logs
from kernelcache.store import Store


@pytest.fixture
def aged(tmp_path: Path) -> tuple[Path, list]:
    """Ten entries of 1000 bytes, last used 1..10 days ago; two kernels, two targets."""
    root = tmp_path / "cache"
    arts = []
    for day in range(1, 11):
        name = "matmul" if day % 2 else "softmax"
        target = "cuda:90" if day <= 5 else "cuda:80"
        arts.append(put(root, name, target, size=1000, last_used=day * 86400, seed=day))
    return root, arts


def _deleted(plan) -> list[str]:
    return [a.key for a in plan.actions if a.kind == "delete-entry"]


def test_size_cap_removes_least_recently_used_first(aged):
    root, arts = aged
    result = scan(root, last_used=True, locks=True)
    nbytes = {e.key: e.nbytes for e in result.entries}
    total = result.nbytes
    oldest_first = [a.key for a in reversed(arts)]
    cap = total - sum(nbytes[k] for k in oldest_first[:3])
    plan = plan_prune(result, max_size=cap)
    assert _deleted(plan) == oldest_first[:3]
    assert plan.kept_entries == 7 and plan.kept_bytes == cap
    assert plan.bytes_to_free == total - plan.kept_bytes
    assert _deleted(plan_prune(result, max_size=cap - 1)) == oldest_first[:4]
    assert _deleted(plan_prune(result, max_size=total)) == []
    assert len(_deleted(plan_prune(result, max_size=0))) == 10


def test_age_filters_and_their_combination(aged):
    root, arts = aged
    result = scan(root, last_used=True, locks=True)
    older = _deleted(plan_prune(result, older_than=7.5 * 86400))
    assert sorted(older) == sorted(a.key for a in arts[7:])
    only = _deleted(plan_prune(result, kernels=["softmax"]))
    assert sorted(only) == sorted(a.key for a in arts if a.meta["name"] == "softmax")
    both = _deleted(plan_prune(result, kernels=["matmul"], targets=["cuda:80"]))
    assert sorted(both) == sorted(
        a.key for a in arts if a.meta["name"] == "matmul" and a.meta["target"] == "cuda:80"
    )
    # A cap with a filter applies to the matching entries only.
    nbytes = {e.key: e.nbytes for e in result.entries}
    newest_two = nbytes[arts[0].key] + nbytes[arts[1].key]
    capped = _deleted(plan_prune(result, targets=["cuda:90"], max_size=newest_two))
    assert capped == [a.key for a in reversed(arts[2:5])]
    assert _deleted(plan_prune(result)) == []  # no criteria: no entry goes


def test_cli_prune_dry_run_then_real(aged):
    root, arts = aged
    plan = kc_json(root, "prune", "--older-than", "5d12h", "--dry-run")
    assert plan["dry_run"] is True and plan["result"] is None
    assert plan["plan"]["summary"]["delete-entry"]["count"] == 5
    assert [a["key"] for a in plan["plan"]["actions"]] == [a.key for a in reversed(arts[5:])]
    assert len(list(root.glob("*.json"))) == 10
    human = kc(root, "prune", "--older-than", "5d12h", "--dry-run", "--list")
    assert "delete 5 entries" in human.stdout and "Dry run" in human.stdout
    assert arts[9].key in human.stdout
    done = kc_json(root, "prune", "--older-than", "5d12h")
    assert done["result"]["counts"] == {"done": 5}
    assert done["result"]["freed_bytes"] == plan["plan"]["bytes_to_free"]
    assert sorted(p.stem for p in root.glob("*.json")) == sorted(a.key for a in arts[:5])
    assert kc_json(root, "verify")["clean"] is True
    capped = kc_json(root, "prune", "--max-size", "2K")
    assert capped["plan"]["kept_bytes"] <= 2048


def test_housekeeping_by_age(tmp_path):
    root = tmp_path / "cache"
    put(root, "keep", size=310)
    q = root / ".quarantine"
    q.mkdir()
    (q / "old.cubin.1").write_bytes(b"o" * 10)
    (q / "new.cubin.2").write_bytes(b"n" * 10)
    backdate(q / "old.cubin.1", time.time() - 8 * 86400)
    backdate(q / "new.cubin.2", time.time() - 86400)
    doc = kc_json(root, "prune")
    assert doc["plan"]["summary"] == {"remove-quarantined": {"count": 1, "bytes": 10}}
    assert sorted(p.name for p in q.iterdir()) == ["new.cubin.2"]
    kc_json(root, "prune", "--quarantine-age", "12h")
    assert list(q.iterdir()) == []
    assert len(list(root.glob("*.json"))) == 1


def test_entries_in_use_are_skipped_not_waited_for(aged):
    root, arts = aged
    victim = arts[-1]  # the least recently used
    reader = hold_shared(victim.path)
    try:
        started = time.monotonic()
        doc = kc_json(root, "prune", "--older-than", "8d12h")
        assert time.monotonic() - started < 30
    finally:
        reader.communicate("", timeout=30)
    statuses = {o["key"]: o["status"] for o in doc["result"]["outcomes"]}
    assert statuses == {victim.key: "in-use", arts[-2].key: "done"}
    assert Path(victim.path).exists()
    again = kc_json(root, "prune", "--older-than", "8d12h")
    assert [o["status"] for o in again["result"]["outcomes"]] == ["done"]
    assert not Path(victim.path).exists()


def test_an_entry_used_after_the_plan_is_kept(aged):
    root, arts = aged
    plan = plan_prune(scan(root, last_used=True, locks=True), older_than=9.5 * 86400)
    assert _deleted(plan) == [arts[-1].key]
    os.utime(root / f"{arts[-1].key}.json")  # a hit refreshes the stamp
    result = execute(Store(root, lock_timeout=0), plan)
    assert [o.status for o in result.outcomes] == ["used-since-plan"]
    assert Path(arts[-1].path).exists()


def test_build_lock_of_a_pruned_entry_is_removed(tmp_path):
    root = tmp_path / "cache"
    import kernelcache

    cache = kernelcache.Cache(root, readonly_roots=())
    art = cache.get_or_create(key_of("built"), "bin", lambda: (b"bin", {"name": "b"}))
    assert (root / ".locks" / f"{art.key}.build.lock").exists()
    kc_json(root, "prune", "--kernel", "b", "--yes")  # (every entry of the root)
    assert not list((root / ".locks").glob(f"{art.key}*"))


def test_a_held_build_lock_of_a_pruned_entry_is_left_to_its_builder(tmp_path):
    root = tmp_path / "cache"
    import kernelcache

    cache = kernelcache.Cache(root, readonly_roots=())
    art = cache.get_or_create(key_of("rebuilt"), "bin", lambda: (b"bin", {"name": "b"}))
    build_lock = root / ".locks" / f"{art.key}.build.lock"
    builder = hold_shared(build_lock)  # a builder of the same key is at work
    try:
        kc_json(root, "prune", "--kernel", "b", "--yes")
        assert build_lock.exists()
    finally:
        builder.communicate("", timeout=30)
    assert not (root / f"{art.key}.json").exists()


# -- a kernel and its companions: one unit ------------------------------------------------
@pytest.fixture
def grouped(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """Two kernels, each with its PTX beside it: ``hot`` used an hour ago, its PTX 30 days ago
    (a companion is read only now and then); ``cold`` and its PTX both 10 days ago."""
    root = tmp_path / "cache"
    hot = put(root, "hot", size=1000, last_used=3600)
    cold = put(root, "cold", size=1000, last_used=10 * 86400)
    keys = {
        "hot": hot.key,
        "hot_ptx": put_companion(root, hot.key, name="hot", last_used=30 * 86400).key,
        "cold": cold.key,
        "cold_ptx": put_companion(root, cold.key, name="cold", last_used=10 * 86400).key,
    }
    return root, keys


def _done(doc: dict) -> set[str]:
    return {o["key"] for o in doc["result"]["outcomes"] if o["status"] == "done"}


def _left(root: Path) -> set[str]:
    return {p.stem for p in root.glob("*.json")}


def test_a_size_cap_drops_a_kernel_with_its_companions(grouped):
    root, keys = grouped
    scanned = scan(root, last_used=True)
    nbytes = {e.key: e.nbytes for e in scanned.entries}
    cap = scanned.nbytes - nbytes[keys["hot_ptx"]]  # one PTX too many
    doc = kc_json(root, "prune", "--max-size", f"{cap}B")
    assert _done(doc) == {keys["cold"], keys["cold_ptx"]}
    assert _left(root) == {keys["hot"], keys["hot_ptx"]}


def test_kernels_whose_keys_start_alike_go_each_on_its_own(tmp_path):
    """Two unrelated kernels whose keys share a group (the first characters) are not each
    other's companions: an age limit takes the old one and keeps the new one."""
    root = tmp_path / "cache"
    new = put(root, "new", key="ab" * 8 + "1" * 48, last_used=3600)
    old = put(root, "old", key="ab" * 8 + "2" * 48, last_used=10 * 86400)
    doc = kc_json(root, "prune", "--older-than", "7d")
    assert _done(doc) == {old.key}
    assert _left(root) == {new.key}


def test_an_age_limit_keeps_the_companions_of_a_kernel_used_lately(grouped):
    root, keys = grouped
    doc = kc_json(root, "prune", "--older-than", "7d")
    assert _done(doc) == {keys["cold"], keys["cold_ptx"]}
    assert _left(root) == {keys["hot"], keys["hot_ptx"]}


def test_a_kernel_kept_in_use_keeps_its_companions(grouped):
    root, keys = grouped
    reader = hold_shared(root / f"{keys['cold']}.cubin")
    try:
        doc = kc_json(root, "prune", "--older-than", "7d")
    finally:
        reader.communicate("", timeout=30)
    outcomes = {o["key"]: o for o in doc["result"]["outcomes"]}
    assert [outcomes[keys[k]]["status"] for k in ("cold", "cold_ptx")] == ["in-use", "in-use"]
    assert f"kept with {keys['cold']}.cubin" in outcomes[keys["cold_ptx"]]["detail"]
    assert _left(root) == set(keys.values())


def test_a_filter_selects_a_kernel_with_its_companions(grouped):
    """An entry kept beside a kernel that the filter does not match on its own (no target)
    goes with the kernel the filter selects."""
    root, keys = grouped
    ident = put_companion(root, keys["cold"], "ident", "identity", target=None).key
    doc = kc_json(root, "prune", "--kernel", "cold", "--target", "cuda:90")
    assert _done(doc) == {keys["cold"], keys["cold_ptx"], ident}
    assert _left(root) == {keys["hot"], keys["hot_ptx"]}


# -- statistics logs ----------------------------------------------------------------------
def _log(root: Path, name: str, **delta: float) -> Path:
    path = root / ".stats" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write(json.dumps({"v": 1, "delta": delta}) + "\n")
    return path


def test_logs_of_finished_processes_are_folded_and_totals_kept(tmp_path):
    root = tmp_path / "cache"
    put(root, "x", size=310)
    host = stats.log_name().rsplit("-", 2)[0]
    dead = _log(
        root, f"{host}-{dead_pid()}-aaaa1111.jsonl", hits=5, misses=1, builds=1, build_seconds=2.5
    )
    _log(root, dead.name, hits=2)
    alive = _log(root, f"{host}-{os.getpid()}-bbbb2222.jsonl", hits=7)
    old_other = _log(root, "otherhost-123-cccc3333.jsonl", hits=11, misses=3)
    backdate(old_other, time.time() - 2 * 86400)
    young_other = _log(root, "otherhost-124-dddd4444.jsonl", hits=13)
    assert foldable_logs(str(root)) == sorted([dead.name, old_other.name])
    before = kc_json(root, "stats")
    assert before["counters"]["hits"] == 38 and before["processes"] == 4
    doc = kc_json(root, "prune")
    assert doc["result"]["folded_logs"] == 2
    names = sorted(p.name for p in (root / ".stats").iterdir() if p.suffix == ".jsonl")
    assert names == sorted([SUMMARY_NAME, alive.name, young_other.name])
    after = kc_json(root, "stats")
    assert after["counters"] == before["counters"]
    assert after["processes"] == 4
    summary = json.loads((root / ".stats" / SUMMARY_NAME).read_text())
    assert summary["logs"] == 2 and summary["delta"]["hits"] == 18
    # A second fold adds to the summary.
    _log(root, f"{host}-{dead_pid()}-eeee5555.jsonl", hits=100)
    kc_json(root, "prune")
    again = kc_json(root, "stats")
    assert again["counters"]["hits"] == 138 and again["processes"] == 5


def test_logs_of_real_processes(tmp_path):
    root = tmp_path / "cache"
    code = """
        import sys, kernelcache
        from support import key_of
        c = kernelcache.Cache(sys.argv[1], readonly_roots=())
        for i in range(3):
            c.get_or_create(key_of("p", i), "bin", lambda: (b"bin", {"name": "p"}))
            c.get(key_of("p", i), "bin")
    """
    for _ in range(3):
        subprocess.run(
            [sys.executable, "-c", textwrap.dedent(code), str(root)],
            env=child_env(PYTHONPATH=str(HELPERS) + os.pathsep + child_env()["PYTHONPATH"]),
            check=True,
            timeout=60,
        )
    before = kc_json(root, "stats")["counters"]
    assert before["misses"] == 3 and before["hits"] == 15
    assert kc_json(root, "prune")["result"]["folded_logs"] == 3
    assert kc_json(root, "stats")["counters"] == before


def test_fold_recovers_after_a_crash(tmp_path):
    root = tmp_path / "cache"
    stats_dir = root / ".stats"
    stats_dir.mkdir(parents=True)
    (stats_dir / SUMMARY_NAME).write_text(
        json.dumps(
            {"v": 1, "summary": True, "logs": 1, "delta": {"hits": 10}, "folded": ["a.jsonl"]}
        )
    )
    # crash after the summary was written: a.jsonl is counted, its renamed file is left over
    (stats_dir / "a.jsonl.folding").write_text(json.dumps({"delta": {"hits": 10}}) + "\n")
    # crash after renaming, before the summary: b.jsonl is not counted yet
    (stats_dir / "b.jsonl.folding").write_text(json.dumps({"delta": {"hits": 3}}) + "\n")
    folded, error = fold_logs(Store(root).locker, [])
    assert (folded, error) == (1, None)
    summary = json.loads((stats_dir / SUMMARY_NAME).read_text())
    assert summary["delta"]["hits"] == 13 and summary["logs"] == 2
    assert sorted(p.name for p in stats_dir.iterdir()) == [SUMMARY_NAME]
    totals, _, _ = stats.read_logs(str(root))
    assert totals["hits"] == 13


def test_fold_refuses_to_overwrite_an_unreadable_summary(tmp_path):
    root = tmp_path / "cache"
    stats_dir = root / ".stats"
    stats_dir.mkdir(parents=True)
    (stats_dir / SUMMARY_NAME).write_text("garbage")
    log = _log(root, f"{stats.log_name().rsplit('-', 2)[0]}-{dead_pid()}-ffff.jsonl", hits=1)
    proc = kc(root, "prune")
    assert proc.returncode == 1 and SUMMARY_NAME in proc.stdout
    assert log.exists() and (stats_dir / SUMMARY_NAME).read_text() == "garbage"


# -- prune while jobs read and write ------------------------------------------------------
WORKER = (
    f"import sys\nsys.path.insert(0, {str(HELPERS)!r})\n"
    + """
import json, random, sys, time, hashlib, kernelcache
from artifact_images import elf_image, launch
root, seed, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
def data_of(i):
    return elf_image(hashlib.sha256(str(i).encode()).digest() * (64 + 16 * i))
def key_of(i):
    return hashlib.sha256(b"mayhem-%d" % i).hexdigest()
cache = kernelcache.Cache(root, readonly_roots=())
rng = random.Random(seed)
done = {"reads": 0, "builds": 0, "hits": 0, "wrong": 0}
deadline = time.monotonic() + seconds
while time.monotonic() < deadline:
    i = rng.randrange(40)
    if rng.random() < 0.5:
        def build(i=i):
            done["builds"] += 1
            return data_of(i), launch(name="k%d" % (i % 4))
        art = cache.get_or_create(key_of(i), "cubin", build)
    else:
        art = cache.get(key_of(i), "cubin")
    done["reads"] += 1
    if art is not None:
        done["hits"] += art.source != "memory"
        if art.data != data_of(i):
            done["wrong"] += 1
done.update(kernelcache.process_stats())
print(json.dumps(done))
"""
)


def test_prune_while_four_processes_read_and_write(tmp_path):
    root = tmp_path / "cache"
    root.mkdir()
    seconds = 4.0
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, str(root), str(n), str(seconds)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=child_env(),
        )
        for n in range(4)
    ]
    prunes = []
    deadline = time.monotonic() + seconds
    round_ = 0
    while time.monotonic() < deadline:
        args = ["prune", "--max-size", "200K"] if round_ % 2 else ["prune", "--older-than", "0s"]
        prunes.append(kc_json(root, *args, "--yes"))
        round_ += 1
    results = []
    for w in workers:
        out, err = w.communicate(timeout=120)
        assert w.returncode == 0, err
        results.append(json.loads(out))
    assert len(prunes) >= 2
    deleted = sum(p["result"]["counts"].get("done", 0) for p in prunes if p["result"])
    assert deleted > 0  # prune really removed entries under the workers
    for r in results:
        assert r["wrong"] == 0, r
        assert r["corrupt"] == 0, r
        assert r["reads"] > 0
    failed = [
        o for p in prunes if p["result"] for o in p["result"]["outcomes"] if o["status"] == "failed"
    ]
    assert failed == []
    assert not (root / ".quarantine").exists() or not list((root / ".quarantine").iterdir())
    assert kc_json(root, "verify")["clean"] is True


# -- linear time, and re-validation under the lock ----------------------------------------
def test_deleting_entries_does_not_list_the_root_per_entry(tmp_path, monkeypatch):
    """A prune of N entries lists the root a constant number of times, not once per entry
    (one listing per delete made `prune --max-size` quadratic in the entries)."""
    root = tmp_path / "cache"
    for i in range(40):
        put(root, f"k{i}", size=264, last_used=86400 + i)
    plan = plan_prune(scan(root, last_used=True, locks=True), max_size=0)
    assert len(_deleted(plan)) == 40
    listings = []
    real_scandir, real_listdir = os.scandir, os.listdir

    def counting_scandir(path=".", *a, **kw):
        if not isinstance(path, int) and os.fspath(path) == str(root):
            listings.append(path)
        return real_scandir(path, *a, **kw)

    def counting_listdir(path=".", *a, **kw):
        if not isinstance(path, int) and os.fspath(path) == str(root):
            listings.append(path)
        return real_listdir(path, *a, **kw)

    monkeypatch.setattr(os, "scandir", counting_scandir)
    monkeypatch.setattr(os, "listdir", counting_listdir)
    result = execute(Store(root, lock_timeout=0), plan)
    assert result.counts == {"done": 40}
    assert len(listings) <= 1, f"the root was listed {len(listings)} times for 40 deletes"
    assert not list(root.glob("*.json")) and not list(root.glob("*.cubin"))


PUBLISH = f"""
import sys
sys.path.insert(0, {str(HELPERS)!r})
from artifact_images import elf_image, launch
from kernelcache.store import Store
Store(sys.argv[1]).put(sys.argv[2], "cubin", elf_image(b"fresh" * 20), launch(name="fresh"))
"""
HIT = """
import sys
from kernelcache.store import Store, Artifact
assert isinstance(Store(sys.argv[1]).get(sys.argv[2], "cubin"), Artifact)
"""


def _before_the_lock(monkeypatch, key: str, code: str, root: Path) -> list[str]:
    """Run ``code`` in another process right before the executor takes ``key``'s lock: the
    moment between a plan's check and its delete."""
    ran: list[str] = []
    real_lock = Store.lock

    def lock(self, name, *, shared, timeout=None):
        if name == key and not shared and not ran:
            ran.append(name)
            subprocess.run(
                [sys.executable, "-c", code, str(root), key],
                env=child_env(),
                check=True,
                timeout=60,
            )
        return real_lock(self, name, shared=shared, timeout=timeout)

    monkeypatch.setattr(Store, "lock", lock)
    return ran


def test_metadata_without_artifact_is_rechecked_under_the_lock(tmp_path, monkeypatch):
    """A writer that publishes between the plan and the delete keeps its fresh entry."""
    root = tmp_path / "cache"
    put(root, "keep", size=310)
    broken = put(root, "broken", size=300)
    Path(broken.path).unlink()  # metadata without artifact: prune deletes it
    plan = plan_prune(scan(root, last_used=True, locks=True))
    assert _deleted(plan) == [broken.key]
    ran = _before_the_lock(monkeypatch, broken.key, PUBLISH, root)
    result = execute(Store(root, lock_timeout=5), plan)
    assert ran == [broken.key]
    assert [o.status for o in result.outcomes] == ["gone"]
    fresh = Store(root).get(broken.key, "cubin")
    assert fresh is not None and fresh.data == elf_image(b"fresh" * 20)


def test_an_entry_used_between_the_check_and_the_delete_is_kept(aged, monkeypatch):
    """The used-since-plan check is made under the key's lock, not before it."""
    root, arts = aged
    victim = arts[-1]
    plan = plan_prune(scan(root, last_used=True, locks=True), older_than=9.5 * 86400)
    assert _deleted(plan) == [victim.key]
    ran = _before_the_lock(monkeypatch, victim.key, HIT, root)  # a hit refreshes the stamp
    result = execute(Store(root, lock_timeout=5), plan)
    assert ran == [victim.key]
    assert [o.status for o in result.outcomes] == ["used-since-plan"]
    assert Path(victim.path).exists() and (root / f"{victim.key}.json").exists()


@pytest.mark.parametrize("waiting", [False, True], ids=["in turn", "in threads"])
def test_many_deletes_keep_the_plans_order_and_skip_what_is_in_use(tmp_path, monkeypatch, waiting):
    """Deletes of a size or age limit run in threads where they wait on the file system:
    outcomes still follow the plan, and an entry a reader holds is still skipped."""
    from kernelcache.maintenance import execute as executing

    monkeypatch.setattr(executing, "PROBE_DELETES", 4)
    monkeypatch.setattr(executing, "_mostly_waiting", lambda wall, cpu: waiting)
    threads = set()
    real_delete = Store.delete

    def delete(self, key, **kw):
        threads.add(threading.current_thread().name.split("_")[0])
        return real_delete(self, key, **kw)

    monkeypatch.setattr(Store, "delete", delete)
    root = tmp_path / "cache"
    arts = [put(root, f"k{i}", size=264, last_used=86400 + 60 * i) for i in range(30)]
    held = arts[12]
    plan = plan_prune(scan(root, last_used=True, locks=True), max_size=0)
    assert len(_deleted(plan)) == 30
    reader = hold_shared(held.path)
    try:
        result = execute(Store(root, lock_timeout=0), plan)
    finally:
        reader.communicate("", timeout=30)
    assert [o.action.key for o in result.outcomes] == _deleted(plan)
    statuses = {o.action.key: o.status for o in result.outcomes}
    assert statuses.pop(held.key) == "in-use"
    assert set(statuses.values()) == {"done"}
    assert [p.stem for p in root.glob("*.json")] == [held.key]
    assert ("kernelcache-prune" in threads) == waiting, threads


def test_every_action_kind_has_one_function():
    from kernelcache.maintenance.execute import ACTIONS
    from kernelcache.maintenance.prune import ACTION_KINDS

    assert set(ACTIONS) == set(ACTION_KINDS)
