"""How the ``kernelcache`` command scales: stats, ls, verify and prune --dry-run on a root of
100,000 entries, each timed as a real console-script subprocess (interpreter start included).

The root is written directly in the store's format (artifact, then metadata made with
``kernelcache.store.make_metadata``/``encode_metadata``, last-used stamps spread over 60 days,
the ``.lock``/``.build.lock`` files that ``Cache.get_or_create`` leaves, and a few dozen
per-process statistics logs), which is much faster than 100,000 ``put`` calls and gives the
same files.

The peer, measured in the same run on the same root: the naive way to get the same numbers,
``du -sb`` plus a Python walk that opens and parses every metadata file (what ``stats`` must do
without its scan index, and what a Triton-cache style layout forces on any tool), and for the
prune plan the same walk plus a stat of every metadata file and a sort by mtime.

Targets (issue 4): stats under 1 s, prune plan under 2 s on the 2-core CPU machine.

    python benchmarks/cli_scale.py [--entries 100000] [--out results.json] [--dir DIR] [--keep]

Prints a table, then one JSON line; ``--out`` also writes that JSON to a file.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kernelcache.index import INDEX_NAME
from kernelcache.store import encode_metadata, make_metadata

TARGETS = ("cuda:80", "cuda:90", "hip:gfx90a", "hip:gfx942")
EXT_OF = {"cuda:80": "cubin", "cuda:90": "cubin", "hip:gfx90a": "hsaco", "hip:gfx942": "hsaco"}
GOALS = {"stats": 1.0, "prune_plan": 2.0}


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
        data = blob[offset : offset + size]
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
root, cap = sys.argv[1], int(sys.argv[2])
rows = []
for entry in os.scandir(root):
    if entry.name.endswith(".json"):
        with open(entry.path, "rb") as f:
            doc = json.load(f)
        rows.append((entry.stat().st_mtime, doc["size"] + entry.stat().st_size, doc["key"]))
rows.sort()
total = sum(r[1] for r in rows)
doomed = 0
for mtime, size, key in rows:
    if total <= cap:
        break
    total -= size
    doomed += 1
print(json.dumps({"entries": len(rows), "doomed": doomed}))
"""


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--entries", type=int, default=100_000)
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
        cap = str(args.entries * (args.min_size + args.max_size) // 4)  # about half the bytes

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

        peer_stats, out = timed([sys.executable, "-c", PEER_STATS, r], args.repeat)
        assert json.loads(out)["entries"] == args.entries
        peer_prune, out = timed([sys.executable, "-c", PEER_PRUNE, r, cap], args.repeat)
        peer_doomed = json.loads(out)["doomed"]
        index_bytes = (root / ".stats" / INDEX_NAME).stat().st_size
    finally:
        if not args.keep:
            shutil.rmtree(base if not args.dir else root, ignore_errors=True)

    ratios = {
        "stats_vs_peer": results["stats"] / peer_stats,
        "stats_cold_vs_peer": results["stats_cold"] / peer_stats,
        "prune_plan_vs_peer": results["prune_plan"] / peer_prune,
    }
    met = {
        "stats_under_1s": results["stats"] < GOALS["stats"],
        "prune_plan_under_2s": results["prune_plan"] < GOALS["prune_plan"],
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
        ("peer: du -sb + parse every metadata", peer_stats, ""),
        ("peer: parse + stat every metadata, sort", peer_prune, ""),
    ]
    print(
        f"kernelcache CLI at {args.entries:,} entries ({platform.machine()}, {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}; median of {args.repeat})"
    )
    width = max(len(r[0]) for r in rows)
    for name, seconds, note in rows:
        print(f"  {name:<{width}}  {seconds:8.3f} s  {note}")
    print(
        f"  plan: {plan['summary'].get('delete-entry', {}).get('count', 0):,} entries to delete "
        f"(peer: {peer_doomed:,}); scan index {index_bytes / 1e6:.1f} MB"
    )
    doc = {
        "benchmark": "cli_scale",
        "entries": args.entries,
        "artifact_bytes": [args.min_size, args.max_size],
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "seconds": {k: round(v, 4) for k, v in results.items()},
        "peer_seconds": {"stats": round(peer_stats, 4), "prune_plan": round(peer_prune, 4)},
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
