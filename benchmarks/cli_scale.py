"""How the ``kernelcache`` command scales: stats, ls, verify, prune --dry-run, ``verify --repair``
and a real ``prune --max-size`` of half the root, on a root of 100,000 entries, each timed as a
real console-script subprocess (interpreter start included).

The root is written directly in the store's format (artifact, then metadata made with
``kernelcache.store.make_metadata``/``encode_metadata``, last-used stamps spread over 60 days,
the ``.lock``/``.build.lock`` files that ``Cache.get_or_create`` leaves, and a few dozen
per-process statistics logs), which is much faster than 100,000 ``put`` calls and gives the
same files.

The peer, measured in the same run on the same root: the naive way to get the same numbers,
``du -sb`` plus a Python walk that opens and parses every metadata file (what ``stats`` must do
without its scan index, and what a Triton-cache style layout forces on any tool), and for the
prune plan the same walk plus a stat of every metadata file and a sort by mtime.

Destructive runs are timed once each: ``verify --repair`` on the root after 1% of its entries
were damaged (flipped bytes, lost metadata, dead staging files), then a real ``prune --max-size``
that deletes about half of it (each entry under its lock, readers excluded). The peer for the
real prune, on an identical root: a Python walk that parses and stats every metadata file, sorts
by mtime and unlinks the oldest half's files with no lock at all (the least any tool must do).
The real prune is also timed on roots of 2,000 and 8,000 entries (``--scales``): linear growth
means the 8,000 / 2,000 ratio is about 4.

Deleting is file-system work: freeing the blocks of tens of thousands of files depends on the
disk (on a virtual disk mounted with online ``discard`` it dominates, and varies with whatever
else the disk is doing). Each root is synced to disk once written, and the destructive runs also
report the child's CPU time (user + system), which does not depend on the disk. ``--dir
/dev/shm/...`` measures on tmpfs, where the CPU is all there is.

Goals on the 2-core CPU machine: stats under 1 s, prune plan under 2 s, a real prune of half of
100,000 entries under 10 s.

    python benchmarks/cli_scale.py [--entries 100000] [--scales 2000,8000] [--out results.json]
                                   [--dir DIR] [--keep]

Prints a table, then one JSON line; ``--out`` also writes that JSON to a file.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kernelcache.maintenance.index import INDEX_NAME
from kernelcache.store import encode_metadata, make_metadata

# whole machine code (an ELF for its vendor): what verify and the readers hold artifacts to
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "helpers"))
from artifact_images import sized

TARGETS = ("cuda:80", "cuda:90", "hip:gfx90a", "hip:gfx942")
EXT_OF = {"cuda:80": "cubin", "cuda:90": "cubin", "hip:gfx90a": "hsaco", "hip:gfx942": "hsaco"}
GOALS = {"stats": 1.0, "prune_plan": 2.0, "prune_real": 10.0}


def console_script() -> str:
    beside = Path(sys.executable).parent / "kernelcache"
    found = str(beside) if beside.exists() else shutil.which("kernelcache")
    if not found:
        sys.exit("the kernelcache console script is not installed (pip install -e .)")
    return found


def populate(root: Path, n: int, min_size: int, max_size: int, seed: int = 0) -> float:
    """Write ``n`` entries in the store's format; return the seconds it took."""
    started = time.perf_counter()
    rng = random.Random(seed)
    root.mkdir(parents=True)
    locks = root / ".locks"
    locks.mkdir()
    now = time.time()
    blob = os.urandom(max_size + 64)
    for i in range(n):
        key = f"{rng.getrandbits(256):064x}"
        target = TARGETS[i % len(TARGETS)]
        ext = EXT_OF[target]
        size = rng.randint(min_size, max_size)
        offset = i % 64
        data = sized(ext, size, blob[offset : offset + 64])
        meta = {
            "name": f"kernel_{i % 500}",
            "target": target,
            "num_warps": 4,
            "num_ctas": 1,
            "shared": 16384,
            "producer": {"triton": "3.6.0", "jax": "0.10.2"},
            "created": now - rng.uniform(0, 90 * 86400),
        }
        doc = make_metadata(key, ext, data, meta)
        with open(root / f"{key}.{ext}", "wb") as f:
            f.write(data)
        meta_path = root / f"{key}.json"
        with open(meta_path, "wb") as f:
            f.write(encode_metadata(doc))
        used = now - rng.uniform(0, 60 * 86400)
        os.utime(meta_path, (used, used))
        for suffix in (".lock", ".build.lock"):
            os.close(os.open(locks / f"{key}{suffix}", os.O_CREAT | os.O_WRONLY, 0o666))
    stats_dir = root / ".stats"
    stats_dir.mkdir()
    for p in range(40):
        with open(stats_dir / f"node{p % 4}-{1000 + p}-{p:08x}.jsonl", "w") as f:
            for _ in range(100):
                f.write(
                    json.dumps(
                        {
                            "v": 1,
                            "delta": {"hits": 50, "misses": 2, "builds": 2, "build_seconds": 3.1},
                        }
                    )
                    + "\n"
                )
    os.sync()  # written back now, not while a later command is timed
    return time.perf_counter() - started


PEER_STATS = r"""
import json, os, sys, subprocess
root = sys.argv[1]
du = int(subprocess.run(["du", "-sb", root], capture_output=True, text=True).stdout.split()[0])
groups = {}
n = 0
for entry in os.scandir(root):
    if entry.name.endswith(".json"):
        with open(entry.path, "rb") as f:
            doc = json.load(f)
        n += 1
        for field in ("ext", "target", "name"):
            slot = groups.setdefault((field, doc.get(field)), [0, 0])
            slot[0] += 1
            slot[1] += doc["size"]
print(json.dumps({"entries": n, "du": du, "groups": len(groups)}))
"""

PEER_PRUNE = r"""
import json, os, sys
root, cap, delete = sys.argv[1], int(sys.argv[2].rstrip("B")), sys.argv[3:] == ["--delete"]
rows = []
for entry in os.scandir(root):
    if entry.name.endswith(".json"):
        with open(entry.path, "rb") as f:
            doc = json.load(f)
        rows.append((entry.stat().st_mtime, doc["size"] + entry.stat().st_size, doc["key"], doc["ext"]))
rows.sort()
total = sum(r[1] for r in rows)
doomed = 0
for mtime, size, key, ext in rows:
    if total <= cap:
        break
    if delete:
        os.unlink(os.path.join(root, key + ".json"))
        os.unlink(os.path.join(root, key + "." + ext))
    total -= size
    doomed += 1
print(json.dumps({"entries": len(rows), "doomed": doomed}))
"""


def damage(root: Path, fraction: float, seed: int = 1) -> dict[str, int]:
    """Damage ``fraction`` of the entries, as crashes and bad disks do: flipped artifact bytes,
    lost metadata (orphans, backdated past the grace period), dead writers' staging files."""
    rng = random.Random(seed)
    metas = sorted(root.glob("*.json"))
    n = max(1, int(len(metas) * fraction / 2))
    chosen = rng.sample(metas, 2 * n)
    old = time.time() - 2 * 3600

    def artifact_of(meta: Path) -> Path:
        return root / f"{meta.stem}.{json.loads(meta.read_bytes())['ext']}"

    for meta in chosen[:n]:  # flipped bytes: corrupt entries
        artifact = artifact_of(meta)
        data = bytearray(artifact.read_bytes())
        data[0] ^= 0xFF
        stamp = artifact.stat().st_mtime
        artifact.write_bytes(bytes(data))
        os.utime(artifact, (stamp, stamp))
    for meta in chosen[n:]:  # lost metadata: orphan artifacts
        artifact = artifact_of(meta)
        meta.unlink()
        os.utime(artifact, (old, old))
    tmp = root / ".tmp"
    tmp.mkdir(exist_ok=True)
    for i in range(n):
        path = tmp / f"deadhost-{i}-{i:032x}.tmp"
        path.write_bytes(b"half")
        os.utime(path, (old, old))
    return {"corrupt": n, "orphan-artifact": n, "stale-temp": n}


def timed_once(cmd: list[str]) -> tuple[float, float, str]:
    """Wall time and CPU time (user + system, of the child) of one run of ``cmd``, and its
    stdout. The CPU time does not depend on how busy the disk is; the wall time does."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode not in (0, 1):
        sys.exit(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, proc.stdout


def timed(cmd: list[str], repeat: int) -> tuple[float, str]:
    """Median wall time of ``repeat`` runs of ``cmd``, and the last run's stdout."""
    times = []
    out = ""
    for _ in range(repeat):
        started = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True)
        times.append(time.perf_counter() - started)
        if proc.returncode not in (0, 1):
            sys.exit(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr}")
        out = proc.stdout
    return statistics.median(times), out


def kc_entries(kc: str, root: str) -> int:
    """How many entries ``kernelcache stats`` counts under ``root``."""
    proc = subprocess.run([kc, "--root", root, "stats", "--json"], capture_output=True, text=True)
    return int(json.loads(proc.stdout)["entries"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--entries", type=int, default=100_000)
    parser.add_argument(
        "--scales",
        default="2000,8000",
        help="also time a real prune of half of roots this large (comma-separated; '' for none)",
    )
    parser.add_argument("--min-size", type=int, default=256, help="smallest artifact (bytes)")
    parser.add_argument("--max-size", type=int, default=4096, help="largest artifact (bytes)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per timing (median)")
    parser.add_argument("--dir", help="where to create the root (default: a temporary directory)")
    parser.add_argument("--keep", action="store_true", help="keep the root afterwards")
    parser.add_argument("--out", help="also write the JSON result to this file")
    args = parser.parse_args()

    kc = console_script()
    base = Path(args.dir or tempfile.mkdtemp(prefix="kc-cli-scale-"))
    root = base / "root"
    if root.exists():
        shutil.rmtree(root)
    try:
        created = populate(root, args.entries, args.min_size, args.max_size)
        r = str(root)
        results: dict[str, float] = {"create": created}
        cpu: dict[str, float] = {}
        cap = f"{args.entries * (args.min_size + args.max_size) // 4}B"  # about half the bytes

        results["stats_cold"], out = timed([kc, "--root", r, "stats", "--json"], 1)
        assert json.loads(out)["entries"] == args.entries, out[:200]
        results["stats"], out = timed([kc, "--root", r, "stats", "--json"], args.repeat)
        assert json.loads(out)["entries"] == args.entries
        results["stats_table"], _ = timed([kc, "--root", r, "stats"], args.repeat)
        results["ls_last_used_top20"], _ = timed(
            [kc, "--root", r, "ls", "--sort", "last-used", "--limit", "20"], args.repeat
        )
        results["prune_plan"], out = timed(
            [kc, "--root", r, "prune", "--dry-run", "--max-size", cap], args.repeat
        )
        results["prune_plan_json"], out = timed(
            [kc, "--root", r, "prune", "--dry-run", "--max-size", cap, "--json"], args.repeat
        )
        plan = json.loads(out)["plan"]
        results["prune_plan_age"], _ = timed(
            [kc, "--root", r, "prune", "--dry-run", "--older-than", "30d"], args.repeat
        )
        results["verify"], out = timed([kc, "--root", r, "verify", "--json"], 1)
        assert json.loads(out)["entries_ok"] == args.entries
        results["explain_lowerings"], out = timed(
            [kc, "--root", r, "explain", "--lowerings", "--json"], args.repeat
        )
        assert json.loads(out)["splits"] == []

        peer_stats, out = timed([sys.executable, "-c", PEER_STATS, r], args.repeat)
        assert json.loads(out)["entries"] == args.entries
        peer_prune, out = timed([sys.executable, "-c", PEER_PRUNE, r, cap], args.repeat)
        peer_doomed = json.loads(out)["doomed"]
        index_bytes = (root / ".stats" / INDEX_NAME).stat().st_size

        # -- destructive: verify --repair of a damaged root, then a real prune of half -------
        damaged = damage(root, 0.01)
        results["verify_repair"], cpu["verify_repair"], out = timed_once(
            [kc, "--root", r, "verify", "--repair", "--json"]
        )
        repair = json.loads(out)
        assert repair["counts"] == damaged, (repair["counts"], damaged)
        assert repair["repair"]["counts"] == {"done": sum(damaged.values())}, repair["repair"]
        repaired_entries = repair["entries_ok"]
        os.sync()
        results["prune_real"], cpu["prune_real"], out = timed_once(
            [kc, "--root", r, "prune", "--max-size", cap, "--json"]
        )
        pruned = json.loads(out)["result"]["counts"]
        assert set(pruned) == {"done"}, pruned
        kept = kc_entries(kc, r)
        peer_root = base / "peer"
        if peer_root.exists():
            shutil.rmtree(peer_root)
        populate(peer_root, args.entries, args.min_size, args.max_size)
        peer_prune_real, cpu["peer_prune_real"], out = timed_once(
            [sys.executable, "-c", PEER_PRUNE, str(peer_root), cap, "--delete"]
        )
        peer_deleted = json.loads(out)["doomed"]
        shutil.rmtree(peer_root)
        scales: dict[int, dict[str, float]] = {}
        for n in [int(x) for x in args.scales.split(",") if x.strip()]:
            small = base / f"scale-{n}"
            if small.exists():
                shutil.rmtree(small)
            populate(small, n, args.min_size, args.max_size)
            small_cap = f"{n * (args.min_size + args.max_size) // 4}B"
            seconds, cpu_seconds, out = timed_once(
                [kc, "--root", str(small), "prune", "--max-size", small_cap, "--json"]
            )
            scales[n] = {
                "seconds": seconds,
                "cpu_seconds": cpu_seconds,
                "deleted": json.loads(out)["result"]["counts"]["done"],
            }
            shutil.rmtree(small)
        scales[args.entries] = {
            "seconds": results["prune_real"],
            "cpu_seconds": cpu["prune_real"],
            "deleted": pruned["done"],
        }
    finally:
        if not args.keep:
            shutil.rmtree(base if not args.dir else root, ignore_errors=True)

    ratios = {
        "stats_vs_peer": results["stats"] / peer_stats,
        "stats_cold_vs_peer": results["stats_cold"] / peer_stats,
        "prune_plan_vs_peer": results["prune_plan"] / peer_prune,
        "prune_real_vs_peer": results["prune_real"] / peer_prune_real,
    }
    sizes = sorted(scales)
    for small, large in itertools.pairwise(sizes):
        ratios[f"prune_real_{large}_vs_{small}"] = (
            scales[large]["seconds"] / scales[small]["seconds"]
        )
    met = {
        "stats_under_1s": results["stats"] < GOALS["stats"],
        "prune_plan_under_2s": results["prune_plan"] < GOALS["prune_plan"],
        "prune_real_under_10s": results["prune_real"] < GOALS["prune_real"],
    }
    rows = [
        ("create root (direct writes)", results["create"], ""),
        (
            "stats --json, first run (no index)",
            results["stats_cold"],
            f"peer x{ratios['stats_cold_vs_peer']:.2f}",
        ),
        ("stats --json", results["stats"], f"peer x{ratios['stats_vs_peer']:.2f}  goal < 1 s"),
        ("stats (table)", results["stats_table"], ""),
        ("ls --sort last-used --limit 20", results["ls_last_used_top20"], ""),
        (
            "prune --dry-run --max-size",
            results["prune_plan"],
            f"peer x{ratios['prune_plan_vs_peer']:.2f}  goal < 2 s",
        ),
        ("prune --dry-run --max-size --json", results["prune_plan_json"], ""),
        ("prune --dry-run --older-than 30d", results["prune_plan_age"], ""),
        ("verify --json (reads every artifact)", results["verify"], ""),
        ("explain --lowerings --json (a scan)", results["explain_lowerings"], ""),
        (
            "verify --repair --json (1% damaged)",
            results["verify_repair"],
            f"cpu {cpu['verify_repair']:.2f} s",
        ),
        (
            f"prune --max-size (real, {pruned['done']:,} deleted)",
            results["prune_real"],
            f"cpu {cpu['prune_real']:.2f} s  peer x{ratios['prune_real_vs_peer']:.2f}  goal < 10 s",
        ),
        ("peer: du -sb + parse every metadata", peer_stats, ""),
        ("peer: parse + stat every metadata, sort", peer_prune, ""),
        (
            f"peer: same, then unlink {peer_deleted:,} (no locks)",
            peer_prune_real,
            f"cpu {cpu['peer_prune_real']:.2f} s",
        ),
    ]
    for n in sizes:
        rows.append(
            (
                f"  prune --max-size (real) at {n:,} entries",
                scales[n]["seconds"],
                f"cpu {scales[n]['cpu_seconds']:.2f} s, {scales[n]['deleted']:,} deleted",
            )
        )
    print(
        f"kernelcache CLI at {args.entries:,} entries ({platform.machine()}, {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}; median of {args.repeat})"
    )
    width = max(len(r[0]) for r in rows)
    for name, seconds, note in rows:
        print(f"  {name:<{width}}  {seconds:8.3f} s  {note}")
    print(
        f"  plan: {plan['summary'].get('delete-entry', {}).get('count', 0):,} entries to delete "
        f"(peer: {peer_doomed:,}); scan index {index_bytes / 1e6:.1f} MB; after repair "
        f"{repaired_entries:,} entries ok; after the prune {kept:,} entries"
    )
    growth = ", ".join(
        f"{large:,}/{small:,}: x{scales[large]['seconds'] / scales[small]['seconds']:.1f} "
        f"for x{large / small:.0f} entries"
        for small, large in itertools.pairwise(sizes)
    )
    if growth:
        print(f"  real prune growth: {growth}")
    doc = {
        "benchmark": "cli_scale",
        "entries": args.entries,
        "artifact_bytes": [args.min_size, args.max_size],
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "seconds": {k: round(v, 4) for k, v in results.items()},
        "peer_seconds": {
            "stats": round(peer_stats, 4),
            "prune_plan": round(peer_prune, 4),
            "prune_real": round(peer_prune_real, 4),
        },
        "cpu_seconds": {k: round(v, 4) for k, v in cpu.items()},
        "prune_real_by_entries": {
            str(n): {
                "seconds": round(v["seconds"], 4),
                "cpu_seconds": round(v["cpu_seconds"], 4),
                "deleted": v["deleted"],
            }
            for n, v in sorted(scales.items())
        },
        "dir": str(base),
        "ratios": {k: round(v, 3) for k, v in ratios.items()},
        "goals_seconds": GOALS,
        "met": met,
    }
    line = json.dumps(doc, sort_keys=True)
    if args.out:
        Path(args.out).write_text(line + "\n")
    print(line)


if __name__ == "__main__":
    main()
