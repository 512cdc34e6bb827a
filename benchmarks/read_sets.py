"""Read sets on real kernels: how many are partial (the IR decides at every lookup) and why.

For each corpus the project carries, a fresh process compiles every kernel into an empty
cache root (no GPU needed: cross-compiled for each target) and the read set each kernel entry
holds is read back: the table counts the kernels, those whose read set is partial, and the
reasons given most often, and the calls that failed to lower. The corpora: ``examples`` (the README's manifest, warmed),
``te-patterns`` (TransformerEngine's calling patterns, ``tests/helpers/te_patterns.py``, each
lowered through ``bridge.triton_call_lowering``) and ``jax-triton`` (the peer's test kernels
as ``tests/helpers/callapi_kernels.py`` holds them, each lowered once). With ``--before
REF_OR_DIR`` the same corpora are compiled by an older bridge in the same run, side by side.

    python benchmarks/read_sets.py --before 2364a66 --json read_sets.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from common import REPO, emit_summary, export

TARGETS = ("cuda:90", "hip:gfx942")
#: each corpus: what a child process runs to compile it into $KERNELCACHE_DIR for $TARGET
CORPORA = {
    "examples": """
from bridge.warm.warming import warm
warm(os.path.join(REPO, "examples", "manifest.jsonl"), [TARGET], cache=os.environ["KERNELCACHE_DIR"], jobs=1)
""",
    "te-patterns": """
import te_patterns as P, te_primitives as T
for name, (fn, avals) in P.patterns(TARGET).items():
    try:
        T.lowered(fn, TARGET, *avals, monkeypatch=T.Env())
    except Exception as e:  # (a pattern this bridge cannot lower: counted, the others go on)
        FAILED.append(f"{name}: {type(e).__name__}")
""",
    "jax-triton": """
import jax, jax.numpy as jnp, bridge, callapi_kernels as K
from bridge_helpers import lowered_module
x = jax.ShapeDtypeStruct((1024,), jnp.float32)
platform = "cuda" if TARGET.startswith("cuda") else "rocm"
def add(kernel, **kw):
    return lambda a, b: bridge.triton_call(a, b, a.size, kernel=kernel, out_shape=a,
                                           grid=(8,), target=TARGET, **kw)
lowered_module(add(K.add_kernel, BLOCK_SIZE=128), x, x, platform=platform)
lowered_module(add(K.add_default_kernel), x, x, platform=platform)
""",
    "witness-cases": """
import importlib, tempfile
from pathlib import Path
import jax, jax.numpy as jnp, bridge, three_way as W
from bridge_helpers import lowered_module
sys.path.insert(0, os.path.join(HERE, "tests", "bridge", "identity"))
base = Path(tempfile.mkdtemp())
sys.path[:0] = [str(base / "src"), str(base / "user" / W.SITE)]  # (the cases' installed tree)
x = jax.ShapeDtypeStruct((4096,), jnp.float32)
platform = "cuda" if TARGET.startswith("cuda") else "rocm"
for test in ("test_witness", "test_witness_more", "test_witness_round3", "test_witness_round4",
             "test_witness_round5"):
    for name, case in importlib.import_module(test).CASES.items():
        try:
            W.write(base, case.a)
            importlib.invalidate_caches()  # (new files in folders already looked in)
            os.environ.update({k: v.format(src=base / "src") for k, v in case.shared_env.items()})
            mod = importlib.import_module(case.module)
            kw = eval("dict(" + case.params + ")", vars(mod))
            fn = lambda x: bridge.triton_call(x, x.size, kernel=mod.kernel, out_shape=x,
                grid=(4,), BLOCK=1024, target=TARGET, embed="inline", **kw)
            lowered_module(fn, x, platform=platform)
        except Exception as e:  # (a case this bridge cannot lower: counted, the others go on)
            FAILED.append(f"{name}: {type(e).__name__}")
""",
}
CHILD = """
import json, os, sys
REPO, TARGET, HERE = {repo!r}, {target!r}, {here!r}
sys.path[:0] = [REPO, os.path.join(HERE, "tests", "helpers")]
FAILED = []
{body}
print(json.dumps({{"failed": FAILED}}))
"""


def _entries(root: Path) -> list[dict[str, Any]]:
    docs = [json.loads(p.read_text()) for p in root.glob("*.json")]
    return [d for d in docs if d.get("ext") in ("cubin", "hsaco") and "reads" in d]


def _measure(tree: Path, corpus: str, target: str, base: Path) -> dict[str, Any]:
    """Compile ``corpus`` for ``target`` with the bridge of ``tree`` into a fresh root."""
    root = Path(tempfile.mkdtemp(prefix=f"{corpus}-", dir=base))
    code = CHILD.format(repo=str(tree), target=target, here=str(REPO), body=CORPORA[corpus])
    env = {**os.environ, "KERNELCACHE_DIR": str(root), "PYTHONPATH": str(tree)}
    env.pop("KERNELCACHE_RECORD", None)
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=1800
    )
    if proc.returncode != 0:
        return {"error": proc.stderr[-2000:]}
    failed = json.loads(proc.stdout.strip().splitlines()[-1])["failed"]
    reasons: Counter[str] = Counter()
    partial = 0
    entries = _entries(root)
    for entry in entries:
        said = json.loads(entry["reads"]).get("partial") or []
        partial += bool(said)
        reasons.update(said)
    return {
        "kernels": len(entries),
        "partial": partial,
        "failed": failed,
        "reasons": reasons.most_common(5),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", help="an older bridge: a git ref or a directory")
    parser.add_argument("--json", type=Path, help="write the results here too")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="read-sets-"))
    trees = {"now": REPO}
    if args.before:
        trees["before"] = export(args.before, base)
    results: dict[str, Any] = {}
    print(f"{'corpus':12} {'target':11} " + " ".join(f"{k + ' partial':>18}" for k in trees))
    for corpus in CORPORA:
        for target in TARGETS[:1] if corpus == "witness-cases" else TARGETS:  # (its 150 cases)
            row = {name: _measure(tree, corpus, target, base) for name, tree in trees.items()}
            results[f"{corpus} {target}"] = row
            cells = []
            for found in row.values():
                cell = "error" if "error" in found else f"{found['partial']}/{found['kernels']}"
                cell += f" ({len(found['failed'])} failed)" if found.get("failed") else ""
                cells.append(f"{cell:>18}")
            print(f"{corpus:12} {target:11} " + " ".join(cells))
    for name, row in results.items():
        for version, found in row.items():
            for reason, count in found.get("reasons", ()):
                print(f"  {name} ({version}): {count} x {reason[:100]}")
    emit_summary({"benchmark": "read_sets", "results": results}, args.json)


if __name__ == "__main__":
    main()
