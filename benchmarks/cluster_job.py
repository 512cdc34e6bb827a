"""A job of many machines under faults, simulated on this one: N nodes x P processes, each node
its own cache root, all sharing a 3-primary Redis Cluster (with or without a replica of each
primary), an S3 server (moto, in a process of its own), or both in layers (the cluster in
front). Every process lowers the same model. Per scenario and tier the script reports, for a
first job (fresh roots, an empty tier) and the next one (fresh roots, the tier as the first
left it, the fault still there):

* compiles, against the ideal (each variant once for the job), the makespan, and the longest
  time a process waited (its time in the cache that was not its own compiles);
* the evidence that the fault landed at the moment it names (``cluster_faults.py``);
* that every process lowered the same thing (one digest of its module, or of its binaries),
  the same in both jobs, and that ``kernelcache verify`` finds every node's root clean;
* the remote requests each process sent (Redis commands, object-store requests by kind), per
  process and per node, and what the object-store requests of a job cost at list prices;
* the time the job's thread of each process waited on each tier (every call into it, timed
  where the job makes it: a copy in the background is not a wait), summed and the longest,
  per process and per node.

Scenarios (a fault made during the first job stays for the next):

  healthy                    nothing wrong (the next job: a warm tier)
  killed-primary             one of the 3 primaries killed (kill -9) before the job starts;
                             evidence: its port refuses connections
  killed-lock-holder         the primary that holds a build lock killed while the lock is held
                             and polled: the lock in Redis, its entry not, the shard serving
                             other processes' commands meanwhile
  killed-after-publications  a primary killed once the namespace holds 15 entries
  stopped-primary            one of the 3 primaries stopped (SIGSTOP: connections hang);
                             evidence: stopped in /proc, a PING unanswered
  stopped-s3                 the S3 server stopped (SIGSTOP); evidence: the same, for HTTP
  full-disk                  node 0's root on a full filesystem: a filled 64 KiB tmpfs in a
                             private mount namespace where the system allows one, else its
                             files limited to 1 KiB; evidence: its processes' probe write fails

With replicas (tier ``replicas``), every kill also measures the failover: seconds until another
node serves every slot of the killed primary.

Models (``cluster_model.py``):

  synthetic (default)  the bridge's use of the cache, without Triton: 8 kernels of 13 variants
                       (1, 1, 1, 1, 2, 2, 2 and 3 per kernel), one ``get_or_create_each``
                       call per kernel with its variants (those of one lowering), a compile a
                       sleep of --compile-s whose PTX is stored first, under the build locks,
                       as the bridge does
  triton               the real bridge lowering 8 calls of 7 Triton kernels (13 variants: four
                       calls are autotuned over 2 or 3 configs) for cuda:90, compiled by
                       Triton here (no GPU); each process imports jax and Triton: give it
                       cores

``--peer LABEL=PATH`` runs every job again with PATH first on the workers' PYTHONPATH (an older
checkout: ``git worktree add /tmp/before REV``), in the same run; every root is verified with
the checkout that wrote it. A peer whose orphaned locks last ``lock_ttl`` makes jobs of two
minutes.

Usage::

    python benchmarks/cluster_job.py [--nodes 4,8] [--per-node 2] [--model synthetic]
        [--compile-s 0.5] [--tiers cluster,replicas,layered,s3] [--scenarios healthy,...]
        [--peer before=/tmp/before] [--out F]

Prints a table, the bounds each row is held to, then one JSON line; ``--out`` also writes the
JSON.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from cluster_faults import FAULTS, Servers
from cluster_model import (
    IDEAL,
    count_requests,
    keep_warnings,
    lower_synthetic,
    lower_triton,
    time_tiers,
)

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
SCENARIOS = tuple(FAULTS)
TIERS = ("cluster", "replicas", "layered", "s3")
CLUSTERS = ("cluster", "replicas", "layered")
#: the tiers a scenario's fault concerns
APPLIES = {
    "healthy": TIERS,
    "killed-primary": CLUSTERS,
    "killed-lock-holder": CLUSTERS,
    "killed-after-publications": CLUSTERS,
    "stopped-primary": CLUSTERS,
    "stopped-s3": ("s3", "layered"),
    "full-disk": TIERS,
}
#: object-store request prices, dollars per 1,000 (S3 Standard, us-east-1: PUT, COPY, POST and
#: LIST one price; GET, HEAD and the rest another; DELETE free)
PRICES = {"PUT": 0.005, "LIST": 0.005, "COPY": 0.005, "GET": 0.0004, "HEAD": 0.0004}
#: the object store's request timeout the bounds allow once per node (the tier's default)
TIMEOUT_S = 5.0
#: what a node's processes may wait on a stopped object store beyond one timeout, in all
WAIT_SLACK_S = 2.0


# -- the worker: one process of the job ---------------------------------------------------------
def probe_write(root: str) -> str:
    """Write 8 KiB under ``root`` and remove it: "ok", or the error's name (the evidence of a
    full disk)."""
    path = os.path.join(root, f".probe-{os.getpid()}")
    try:
        with open(path, "wb") as f:
            f.write(b"\0" * 8192)
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        return errno.errorcode.get(e.errno or 0, str(e))
    finally:
        if os.path.exists(path):
            os.unlink(path)
    return "ok"


def worker(cfg: dict[str, Any]) -> None:
    """Lower the model once through the cache (from ``$PYTHONPATH``: this checkout or a
    peer's); print one JSON line: wall-clock start and end, compiles, compile seconds, the
    seconds spent in the cache other than compiling, the warnings logged, the digest of what
    it lowered, its remote requests, and (on a full disk) what a probe write met."""
    import resource
    import signal

    if cfg["small_files"]:  # a full disk where no file system can be mounted
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1024, 1024))
    warnings = keep_warnings()
    import kernelcache

    requests = count_requests()
    cache = kernelcache.Cache(cfg["root"], readonly_roots=[], remote=cfg["url"])
    waits = time_tiers(cache.remote)
    lower = lower_triton if cfg["model"] == "triton" else lower_synthetic
    prepared = lower(cache, cfg, prepare=True)
    disk = probe_write(cfg["root"]) if cfg["full"] else None
    time.sleep(max(0.0, cfg["start_at"] - time.time()))
    started = time.time()
    digest = lower(cache, cfg, prepared=prepared)
    ended = time.time()
    counts = kernelcache.process_stats()
    wall = ended - started
    report = json.dumps(
        {
            "node": cfg["node"],
            "started": started,
            "ended": ended,
            "compiles": counts["builds"],
            "compile_s": counts["build_seconds"],
            "wait_s": max(0.0, wall - counts["build_seconds"]),
            "warnings": sorted(set(warnings))[:3],
            "digest": digest,
            "requests": {tier: dict(c) for tier, c in requests.items()},
            "waits": {kind: [sum(w), max(w, default=0.0)] for kind, w in waits.items()},
            "disk": disk,
        }
    )
    os.write(1, (report + "\n").encode())  # one write: the node's processes share a pipe


# -- the job ----------------------------------------------------------------------------------
def job(
    url: str,
    directory: Path,
    args: argparse.Namespace,
    nodes: int,
    pythonpath: str,
    full_node: str | None,
    servers: Servers | None = None,
    scenario: str = "",
) -> dict[str, Any]:
    """Run one job (``nodes`` x ``--per-node`` processes started together); its compiles,
    makespan, longest wait, warnings, digests, requests and every root's verify. ``full_node``:
    "tmpfs" or "small-files" for node 0's root on a full disk, or None; with ``servers``, the
    fault of ``scenario`` is made during the job (its evidence: ``"evidence"``)."""
    env = checkout_env(pythonpath)
    procs = nodes * args.per_node
    start_at = time.time() + (8.0 if args.model == "triton" else 1.0) + 0.15 * procs
    launched = []
    roots = []
    for node in range(nodes):
        root = directory / f"node{node}"
        root.mkdir(parents=True)
        roots.append(root)
        full = node == 0 and full_node is not None
        cfgs = [
            {
                "url": url,
                "root": str(root),
                "node": node,
                "model": args.model,
                "compile_s": args.compile_s,
                "start_at": start_at,
                "small_files": full and full_node == "small-files",
                "full": full,
            }
            for _ in range(args.per_node)
        ]
        argvs = [[sys.executable, str(Path(__file__)), "--worker", json.dumps(c)] for c in cfgs]
        if full and full_node == "tmpfs":  # every process of the node in one namespace
            runs = " & ".join(subprocess.list2cmdline(a) for a in argvs)
            fill = f"head -c 1048576 /dev/zero > {root}/filler 2>/dev/null"
            script = f"mount -t tmpfs -o size=64k tmpfs {root} && {{ {fill}; {runs} & wait; }}"
            argvs = [["unshare", "-rm", "sh", "-c", script]]
        for argv in argvs:
            launched.append(
                subprocess.Popen(
                    argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
                )
            )
    watcher = None
    if servers is not None:
        watcher = servers.during(scenario, start_at, start_at + args.job_timeout)
    results = []
    try:
        for p in launched:
            out, err = p.communicate(timeout=args.job_timeout)
            reports = reports_in(out)
            if p.returncode != 0 or not reports:
                raise SystemExit(f"a worker failed ({p.returncode}):\n{err[-3000:]}")
            results += reports
    finally:
        evidence = watcher.finish() if watcher is not None else None
    if len(results) != procs:
        raise SystemExit(f"{len(results)} of {procs} workers reported")
    out = {
        "compiles": int(sum(r["compiles"] for r in results)),
        "makespan_s": max(r["ended"] for r in results) - min(r["started"] for r in results),
        "max_wait_s": max(r["wait_s"] for r in results),
        "warned": sum(bool(r["warnings"]) for r in results),
        "warnings": sorted({w for r in results for w in r["warnings"]})[:6],
        "digests": sorted({r["digest"] for r in results}),
        "requests": requests_of(results, nodes),
        "waits": waits_of(results, nodes),
        "verify": [verify(root, pythonpath) for root in roots],
    }
    if full_node is not None:
        out["disk"] = sorted({r["disk"] for r in results if r["disk"] is not None})
    if evidence is not None:
        out["evidence"] = evidence
    return out


def checkout_env(pythonpath: str) -> dict[str, str]:
    """The environment of a process of the checkout at ``pythonpath``: no KERNELCACHE_*."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KERNELCACHE_")}
    return {**env, "PYTHONPATH": pythonpath}


def reports_in(out: str) -> list[dict[str, Any]]:
    """The JSON reports in a worker's output (several, from the processes of one node)."""
    decoder, found, at = json.JSONDecoder(), [], out.find("{")
    while at >= 0:
        doc, end = decoder.raw_decode(out, at)
        found.append(doc)
        at = out.find("{", end)
    return found


def requests_of(results: list[dict[str, Any]], nodes: int) -> dict[str, Any]:
    """The job's remote requests: by kind for the whole job, and per process and per node
    (median and most), Redis commands and object-store requests apart; the object-store
    requests' cost in dollars per 1,000 jobs at :data:`PRICES`."""
    total: dict[str, Counter[str]] = {"redis": Counter(), "objstore": Counter()}
    per_process: dict[str, list[int]] = {"redis": [], "objstore": []}
    per_node: dict[str, list[int]] = {"redis": [0] * nodes, "objstore": [0] * nodes}
    for r in results:
        for tier, counts in r["requests"].items():
            total[tier].update(counts)
            per_process[tier].append(sum(counts.values()))
            per_node[tier][r["node"]] += sum(counts.values())
    cost = sum(PRICES.get(kind, 0.0) * n for kind, n in total["objstore"].items())
    return {
        "total": {tier: dict(sorted(c.items())) for tier, c in total.items()},
        "per_process": {t: spread(v) for t, v in per_process.items()},
        "per_node": {t: spread(v) for t, v in per_node.items()},
        "objstore_dollars_per_1000_jobs": round(cost, 4),
    }


def waits_of(results: list[dict[str, Any]], nodes: int) -> dict[str, Any]:
    """Seconds the job's threads waited on each tier (Redis, the object store): per process and
    per node (summed over its processes), median and most; and the longest single wait."""
    per_process: dict[str, list[float]] = {"redis": [], "objstore": []}
    per_node: dict[str, list[float]] = {"redis": [0.0] * nodes, "objstore": [0.0] * nodes}
    longest = {"redis": 0.0, "objstore": 0.0}
    for r in results:
        for kind, (total, most) in r["waits"].items():
            per_process[kind].append(total)
            per_node[kind][r["node"]] += total
            longest[kind] = max(longest[kind], most)
    rounded = {k: {s: round(v, 3) for s, v in spread(vs).items()} for k, vs in per_node.items()}
    return {
        "per_process": {
            k: {s: round(v, 3) for s, v in spread(vs).items()} for k, vs in per_process.items()
        },
        "per_node": rounded,
        "longest": {k: round(v, 3) for k, v in longest.items()},
    }


def spread(values: list[Any]) -> dict[str, float]:
    return {"median": statistics.median(values or [0]), "max": max(values or [0])}


def verify(root: Path, pythonpath: str) -> dict[str, Any]:
    """``kernelcache verify --json`` of one root, by the checkout that wrote it: entries
    checked and problems (a root on a private tmpfs is gone: 0 and 0)."""
    env = checkout_env(pythonpath)
    done = subprocess.run(
        [sys.executable, "-m", "kernelcache.cli", "verify", "--root", str(root), "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    try:
        doc = json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        return {"entries": None, "problems": None, "error": done.stderr[-300:]}
    return {"entries": doc.get("entries_checked"), "problems": len(doc.get("problems", []))}


def can_mount_tmpfs() -> bool:
    try:
        probe = subprocess.run(
            ["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt"],
            capture_output=True,
            timeout=20,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return probe.returncode == 0


def run(args: argparse.Namespace) -> dict[str, Any]:
    impls = [("this", str(REPO))] + [tuple(p.split("=", 1)) for p in args.peer]
    full_node = "tmpfs" if can_mount_tmpfs() else "small-files"
    rows = []
    with tempfile.TemporaryDirectory(prefix="kc-cluster-job-") as tmp_name, ExitStack() as stack:
        tmp = Path(tmp_name)
        servers = Servers(stack, tmp)
        stack.callback(servers.close_cluster)
        counter = 0
        for nodes in args.nodes:
            for scenario in args.scenarios:
                for tier in [t for t in args.tiers if t in APPLIES[scenario]]:
                    for label, path in impls:
                        counter += 1
                        name = f"j{counter}"
                        if tier == "s3":
                            servers.close_cluster()
                        else:
                            servers.fresh_cluster(name, 1 if tier == "replicas" else 0)
                        url = servers.urls(tier, name)
                        full = full_node if scenario == "full-disk" else None
                        during = servers if FAULTS[scenario] == "during" else None
                        try:
                            made = servers.before(scenario)
                            first = job(
                                url, tmp / name / "1", args, nodes, path, full, during, scenario
                            )
                            second = job(url, tmp / name / "2", args, nodes, path, full)
                        finally:
                            servers.undo(scenario)
                            shutil.rmtree(tmp / name, ignore_errors=True)
                        if made:
                            first["evidence"] = made
                        if full:
                            first["evidence"] = {"landed": first["disk"] in (["ENOSPC"], ["EFBIG"])}
                        row = {
                            "impl": label,
                            "nodes": nodes,
                            "per_node": args.per_node,
                            "scenario": scenario,
                            "tier": tier,
                            "first": first,
                            "next": second,
                        }
                        rows.append(row)
                        print_row(row, flush=True)
    return {
        "benchmark": "cluster_job",
        "cpus": os.cpu_count(),
        "model": args.model,
        "compile_s": args.compile_s if args.model == "synthetic" else None,
        "ideal_compiles": IDEAL,
        "full_disk": full_node,
        "rows": rows,
        "bounds": bounds(rows),
    }


def bounds(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each row against what it is held to. Compiles: 13 (13 per node with the only shared tier
    stopped), plus one for each build lock the killed primary held (a build in flight when
    its lock died is made again), and the next job 0, or on a cluster alone with no replica
    the entries the killed primary held (lost);
    with replicas, whatever the fault, at most 1.5x (a build cut off by the failover may be
    made again) and next 0. Time: a stopped object store at most one timeout more than the
    healthy job (in layers; one timeout and a second alone); with replicas, a kill at most the
    failover plus 2 s more. Waits: behind a stopped object store, each node's processes wait on
    it one timeout plus 2 s at most in all, and the next job not at all (in layers). And every
    fault landed, one digest per job and the same in both, every root verified clean."""
    healthy = {
        (r["impl"], r["nodes"], r["tier"]): r["first"]["makespan_s"]
        for r in rows
        if r["scenario"] == "healthy"
    }
    checked = []
    for r in rows:
        first, second = r["first"], r["next"]
        evidence = first.get("evidence", {"landed": True})
        killed = r["scenario"].startswith("killed")
        most, most_next = IDEAL + evidence.get("locks_held", 0), 0
        if r["tier"] == "s3" and r["scenario"] == "stopped-s3":  # no shared tier left: each
            most = most_next = r["nodes"] * IDEAL  # node builds each variant once
        elif r["tier"] == "replicas" and r["scenario"] != "healthy":
            most = int(1.5 * IDEAL)
        elif r["tier"] == "cluster":
            most_next = evidence.get("entries_held", 0)
        extra = None
        base = healthy.get((r["impl"], r["nodes"], r["tier"]))
        if base is not None:
            extra = round(first["makespan_s"] - base, 2)
        allowed = None
        if r["scenario"] == "stopped-s3":
            allowed = TIMEOUT_S if r["tier"] == "layered" else TIMEOUT_S + 1.0
        elif r["tier"] == "replicas" and killed and evidence.get("failover_s") is not None:
            allowed = evidence["failover_s"] + 2.0
        clean = all(v["problems"] == 0 for job in (first, second) for v in job["verify"])
        checks = {
            "compiles": first["compiles"] <= most and second["compiles"] <= most_next,
            "landed": bool(evidence.get("landed")),
            "one_module": len(first["digests"]) == 1 and first["digests"] == second["digests"],
            "verified": clean,
        }
        if allowed is not None and extra is not None:
            checks["time"] = extra <= allowed
        if r["scenario"] == "stopped-s3":
            node_wait = first["waits"]["per_node"]["objstore"]["max"]
            checks["store_wait"] = node_wait <= TIMEOUT_S + WAIT_SLACK_S
            if r["tier"] == "layered":
                checks["next_wait"] = second["waits"]["per_node"]["objstore"]["max"] <= 0.05
        checked.append(
            {
                "impl": r["impl"],
                "job": f"{r['nodes']}x{r['per_node']}",
                "scenario": r["scenario"],
                "tier": r["tier"],
                "most_compiles": [most, most_next],
                "extra_s": extra,
                "allowed_extra_s": allowed,
                "checks": checks,
                "ok": all(checks.values()),
            }
        )
    return checked


HEADER = (
    f"{'impl':<6} {'job':>4} {'scenario':<25} {'tier':<8} {'builds':>6} {'x ideal':>7} "
    f"{'span s':>6} {'wait s':>6} {'next':>4} {'landed':<6} {'redis/p':>7} {'s3/p':>5} "
    f"{'R wait/n':>8} {'S3 wait/n':>9} {'S3 max':>6} {'next S3':>7} {'verify':>6}"
)


def print_row(row: dict[str, Any], flush: bool = False) -> None:
    first = row["first"]
    size = f"{row['nodes']}x{row['per_node']}"
    landed = first.get("evidence", {}).get("landed")
    shown = "-" if landed is None else ("yes" if landed else "NO")
    requests = first["requests"]["per_process"]
    waits, next_waits = first["waits"]["per_node"], row["next"]["waits"]["per_node"]
    problems = sum(v["problems"] or 0 for job in (first, row["next"]) for v in job["verify"])
    print(
        f"{row['impl']:<6} {size:>4} {row['scenario']:<25} {row['tier']:<8} "
        f"{first['compiles']:>6} {first['compiles'] / IDEAL:>6.2f}x "
        f"{first['makespan_s']:>6.1f} {first['max_wait_s']:>6.1f} "
        f"{row['next']['compiles']:>4} {shown:<6} {requests['redis']['median']:>7.0f} "
        f"{requests['objstore']['median']:>5.0f} {waits['redis']['max']:>8.2f} "
        f"{waits['objstore']['max']:>9.2f} {first['waits']['longest']['objstore']:>6.2f} "
        f"{next_waits['objstore']['max']:>7.2f} {'clean' if not problems else problems:>6}",
        flush=flush,
    )


def print_bounds(checked: list[dict[str, Any]]) -> None:
    print("\nbounds (extra: makespan beyond the healthy job's, same impl, size and tier):")
    for c in checked:
        failed = [name for name, ok in c["checks"].items() if not ok]
        allowed = "" if c["allowed_extra_s"] is None else f" (allowed {c['allowed_extra_s']:.1f})"
        extra = "" if c["extra_s"] is None else f"extra {c['extra_s']:+.1f} s{allowed}"
        verdict = "ok" if c["ok"] else "FAILED: " + ", ".join(failed)
        most = "builds <= {}, next <= {}".format(*c["most_compiles"])
        print(
            f"  {c['impl']:<6} {c['job']:>4} {c['scenario']:<25} {c['tier']:<8} {most:<22} "
            f"{extra:<28} {verdict}"
        )


def main(argv: list[str] | None = None) -> int:
    if argv is None and len(sys.argv) == 3 and sys.argv[1] == "--worker":
        worker(json.loads(sys.argv[2]))
        return 0
    sys.path.insert(0, str(REPO))
    sys.path.insert(0, str(REPO / "tests" / "helpers"))
    from common import emit_summary

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", default="4", help="node counts, e.g. 4,8 (default 4)")
    parser.add_argument("--per-node", type=int, default=2, help="processes per node (2)")
    parser.add_argument("--model", choices=("synthetic", "triton"), default="synthetic")
    parser.add_argument("--compile-s", type=float, default=0.5, help="a synthetic compile (0.5)")
    parser.add_argument("--tiers", default=",".join(TIERS), help=",".join(TIERS))
    parser.add_argument("--scenarios", default=",".join(SCENARIOS), help=",".join(SCENARIOS))
    parser.add_argument("--peer", action="append", default=[], help="LABEL=PATH (repeatable)")
    parser.add_argument("--job-timeout", type=float, default=600.0, help="seconds per job")
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    args = parser.parse_args(argv)
    args.nodes = [int(n) for n in args.nodes.split(",")]
    args.tiers = args.tiers.split(",")
    args.scenarios = args.scenarios.split(",")
    for wanted, known in ((args.tiers, TIERS), (args.scenarios, SCENARIOS)):
        unknown = set(wanted) - set(known)
        if unknown:
            raise SystemExit(f"unknown: {', '.join(sorted(unknown))}; known: {', '.join(known)}")
    for peer in args.peer:
        label, sep, path = peer.partition("=")
        if not sep or not label or not Path(path).is_dir():
            raise SystemExit(f"--peer {peer!r}: expected LABEL=PATH to a checkout")
    print(f"ideal: {IDEAL} compiles per job; 'next': compiles of the job after it; per process")
    print("(median): redis commands and object-store requests of the first job; per node (most):")
    print("seconds the job's threads waited on Redis and on the object store (summed over the")
    print("node's processes), the longest single wait on the store, the next job's store wait")
    print(HEADER, flush=True)
    summary = run(args)
    print_bounds(summary["bounds"])
    emit_summary(summary, args.out)
    return 0 if all(c["ok"] for c in summary["bounds"] if c["impl"] == "this") else 1


if __name__ == "__main__":
    sys.exit(main())
