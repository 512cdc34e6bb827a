"""What zstd compression saves and costs: of remote values and bundles (on by default), and of a
root's own entries (``kernelcache -o compression=zstd``; off by default), in one run.

1. Sizes: the examples' compiled kernels (``examples/manifest.jsonl`` warmed for cuda:90 and
   hip:gfx942, or the kernels of ``--kernels ROOT``): each artifact plain and packed
   (:mod:`kernelcache.store.compression`), each remote value plain and compressed
   (:func:`kernelcache.remote.make_value`), by extension, and a bundle of them as a tar and as
   tar+zstd.
2. The hot path: a verified 64 KiB hit (``Cache.get`` of a cubin whose body is the examples'
   machine code) in a root that does not compress (the default) and in one that does, against
   its floor measured on the same file in the same rounds: ``open(path, "rb").read()`` of the
   plain root's artifact. The default must stay within 1.5x of the floor (docs/benchmarks.md).
3. A put of that entry into either root.

Each get is measured against the floor in rounds of their own, alternating (so the machine's
load falls on both alike, and a compressing root's inflation does not touch the default's
figures); medians of each, and each get's over its own floor's.
Prints a table, then one JSON line; ``--out FILE`` also writes the JSON there.

    python benchmarks/compression.py [--kernels ROOT] [--reads 3000] [--out results.json]
"""

from __future__ import annotations

import argparse
import io
import os
import platform
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "helpers"))

from artifact_images import LAUNCH, elf_image
from common import REPO, emit_summary

import kernelcache
from kernelcache.remote import encode_value, make_value
from kernelcache.store import Store
from kernelcache.store.compression import packed

#: the size of the hit measured (the hot path's figure in docs/benchmarks.md)
HIT_BYTES = 64 << 10
KEYS = 32


def warmed(into: str) -> str:
    """A root holding the examples' kernels for cuda:90 and hip:gfx942 (warmed into ``into``)."""
    argv = [sys.executable, "-m", "kernelcache.cli", "--root", into, "warm"]
    argv += ["examples/manifest.jsonl", "--target", "cuda:90", "--target", "hip:gfx942"]
    subprocess.run(argv, cwd=REPO, check=True, stdout=subprocess.DEVNULL)
    return into


def entries(root: str) -> list[kernelcache.Artifact]:
    """Every entry of ``root``, read and verified."""
    store = Store(root, readonly=True)
    found = []
    for name in sorted(os.listdir(root)):
        if name.endswith(".json"):
            art = store.read(name[: -len(".json")])
            if isinstance(art, kernelcache.Artifact):
                found.append(art)
    return found


def sizes(arts: list[kernelcache.Artifact]) -> dict:
    """Plain and compressed sizes by extension: artifacts, remote values; and a bundle."""
    by: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for art in arts:
        row = by[art.ext]
        row["entries"] += 1
        row["artifact"] += len(art.data)
        row["artifact_zstd"] += len(packed(art.data, "zstd"))
        row["value"] += len(encode_value(art.meta, art.data))
        row["value_zstd"] += len(make_value(art.key, art.ext, art.data, art.meta, None))
    total: dict[str, int] = defaultdict(int)
    for row in by.values():
        for name, n in row.items():
            total[name] += n
    tar = io.BytesIO()
    with tarfile.open(fileobj=tar, mode="w") as bundle:
        for art in arts:
            info = tarfile.TarInfo(f"entries/{art.key}.{art.ext}")
            info.size = len(art.data)
            bundle.addfile(info, io.BytesIO(art.data))
    plain = tar.getvalue()
    import zstandard

    return {
        "by_ext": {ext: dict(row) for ext, row in sorted(by.items())},
        "total": dict(total),
        "bundle": {
            "tar": len(plain),
            "tar_zstd": len(zstandard.ZstdCompressor(level=3).compress(plain)),
        },
    }


def _hit_cubin(arts: list[kernelcache.Artifact], seed: int) -> bytes:
    """A whole 64 KiB cubin whose body is the examples' machine code (rotated by ``seed``)."""
    code = b"".join(a.data for a in arts if a.ext in ("cubin", "hsaco")) or os.urandom(HIT_BYTES)
    room = HIT_BYTES - len(elf_image(sections=0))
    start = (seed * 4099) % len(code)
    body = (code[start:] + code[:start]) * (room // len(code) + 1)
    return elf_image(body[:room], sections=0)


def hot_path(arts: list[kernelcache.Artifact], reads: int) -> dict:
    """Medians (us) of a verified 64 KiB hit in a plain root, in a compressing one, and of the
    floor; and of a put into each."""
    import hashlib

    with tempfile.TemporaryDirectory() as tmp:
        caches = {
            "plain": kernelcache.Cache(os.path.join(tmp, "plain"), readonly_roots=(), remote=""),
            "zstd": kernelcache.Cache(os.path.join(tmp, "zstd"), readonly_roots=(), remote=""),
        }
        caches["zstd"].store.compression = "zstd"  # (as the root's file would say)
        keys = [hashlib.sha256(f"hit-{i}".encode()).hexdigest() for i in range(KEYS)]
        puts: dict[str, list[float]] = {name: [] for name in caches}
        for i, key in enumerate(keys):
            data = _hit_cubin(arts, i)
            for name, cache in caches.items():
                t0 = time.perf_counter_ns()
                cache.put(key, "cubin", data, LAUNCH)
                puts[name].append((time.perf_counter_ns() - t0) / 1000)
        paths = [caches["plain"].store.path(key, "cubin") for key in keys]
        packed_bytes = sum(os.path.getsize(caches["zstd"].store.path(k, "cubin")) for k in keys)

        def floor(i: int) -> bytes:
            with open(paths[i], "rb") as f:
                return f.read()

        ops = {
            "floor: open().read()": floor,
            "get, plain root (default)": lambda i: caches["plain"].get(keys[i], "cubin").data,
            "get, zstd root": lambda i: caches["zstd"].get(keys[i], "cubin").data,
        }
        for op in ops.values():  # the page cache warm, the bytes checked once
            assert all(len(op(i)) == HIT_BYTES for i in range(KEYS))
        samples: dict[str, list[float]] = {name: [] for name in ops}
        floors: dict[str, list[float]] = {name: [] for name in ops}
        for name in list(ops)[1:]:  # each against the floor, in rounds of their own
            pair = {name: samples[name], "floor": floors[name]}
            for round_ in range(reads // KEYS):
                order = [name, "floor"] if round_ % 2 == 0 else ["floor", name]
                for which in order:
                    op = ops[name] if which == name else floor
                    for i in range(KEYS):
                        t0 = time.perf_counter_ns()
                        op(i)
                        pair[which].append((time.perf_counter_ns() - t0) / 1000)
        samples["floor: open().read()"] = floors[list(ops)[1]]
    medians = {name: round(statistics.median(s), 2) for name, s in samples.items()}
    ratios = {
        name: statistics.median(s) / statistics.median(floors[name])
        for name, s in samples.items()
        if floors[name]
    }
    return {
        "hit_bytes": HIT_BYTES,
        "packed_ratio": round(packed_bytes / (KEYS * HIT_BYTES), 3),
        "get_median_us": medians,
        "vs_floor": {"floor: open().read()": 1.0, **{n: round(r, 2) for n, r in ratios.items()}},
        "put_median_us": {name: round(statistics.median(s), 1) for name, s in puts.items()},
    }


def _pct(part: int, whole: int) -> str:
    return f"{100 * part / whole:.0f}%" if whole else "-"


def table(doc: dict) -> str:
    lines = ["Sizes (plain -> zstd level 3):"]
    for ext, row in [*doc["sizes"]["by_ext"].items(), ("total", doc["sizes"]["total"])]:
        lines.append(
            f"  {ext:6} {row['entries']:3} entries  artifacts {row['artifact']:9,} -> "
            f"{row['artifact_zstd']:9,} ({_pct(row['artifact_zstd'], row['artifact'])})   remote "
            f"values {row['value']:9,} -> {row['value_zstd']:9,} "
            f"({_pct(row['value_zstd'], row['value'])})"
        )
    bundle = doc["sizes"]["bundle"]
    lines.append(
        f"  bundle  tar {bundle['tar']:,} -> tar+zstd {bundle['tar_zstd']:,} "
        f"({_pct(bundle['tar_zstd'], bundle['tar'])})"
    )
    hot = doc["hot_path"]
    lines.append(
        f"A verified {hot['hit_bytes'] // 1024} KiB hit (medians; packed to "
        f"{100 * hot['packed_ratio']:.0f}%):"
    )
    for name, median in hot["get_median_us"].items():
        lines.append(f"  {name:28} {median:8.2f} us  {hot['vs_floor'][name]:5.2f}x the floor")
    for name, median in hot["put_median_us"].items():
        lines.append(f"  put, {name} root{'':16} {median:8.1f} us")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kernels", help="a root of compiled kernels (default: warm the examples)")
    parser.add_argument("--reads", type=int, default=3000, help="hits measured per kind")
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        arts = entries(args.kernels or warmed(os.path.join(tmp, "examples")))
        doc = {
            "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
            "python": platform.python_version(),
            "sizes": sizes(arts),
            "hot_path": hot_path(arts, args.reads),
        }
    print(table(doc))
    emit_summary(doc, args.out)


if __name__ == "__main__":
    main()
