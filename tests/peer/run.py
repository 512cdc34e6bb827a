"""Run jax-triton 0.4.1's own test suite against the bridge, and say which results are expected.

    python tests/peer/run.py /path/to/jax-triton/tests [--out peer.json] [-- pytest args]

The peer's test files (``triton_call_test.py``, ``gluon_test.py``, ``cluster_test.py`` of
jax-ml/jax-triton at its 0.4.1 commit) import ``jax_triton``: with ``tests/peer`` first on the
path, that is the shim in ``tests/peer/jax_triton``, which is the bridge. They need a GPU, Python
3.12 and absl-py. The summary sorts every failure into: cannot pass by design (the bridge does
something else on purpose, or the test reads jax-triton's internals), needs another Triton (the
peer's Gluon kernels use an API only Triton 3.7 and 3.8 have), or unexpected. The exit status is
1 if anything failed unexpectedly (or nothing ran), else 0.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent

#: peer tests (file::class::method, a prefix of parameterized names) that cannot pass, and why
CANNOT_PASS = {
    "triton_call_test.py::TritonKernelCallTest::test_batching_exception": (
        "the bridge supports jax.vmap (one launch per batch element) instead of raising"
    ),
    "triton_call_test.py::TritonKernelCallTest::test_non_hashable_backend_options": (
        "the bridge accepts backend options whose values are not hashable"
    ),
    "triton_call_test.py::TritonKernelCallTest::test_autodiff_exception": (
        "the bridge raises bridge.UnsupportedTransformation (a NotImplementedError) with its own "
        "message, which names the kernel instead of jax_triton.triton_call"
    ),
    "triton_call_test.py::TritonKernelCallTest::test_autotune_pre_hook_error": (
        "the bridge runs a config's pre_hook at lowering, as Triton's autotuner runs it before a "
        "launch: the peer's hook (lambda _: None) does nothing, so the call works instead of "
        "raising"
    ),
    "triton_call_test.py::TritonKernelCallTest::test_kwarg_scalar_operand_stays_static": (
        "reads eqn.params['metaparams'], a parameter of jax-triton's primitive; ported as "
        "tests/bridge/call/test_call_api.py::test_keyword_operands_any_order_and_static_scalars"
    ),
    "triton_call_test.py::TritonKernelCallTest::test_kernel_cache_equivalent_kernels": (
        "reads jax-triton's in-memory kernel cache (TritonFunction, compile_ttir_inplace); the "
        "bridge's cache is tested in tests/bridge/lowering/test_lowering.py"
    ),
    "triton_call_test.py::TritonKernelCallTest::test_kernel_cache_same_kernel_different_params": (
        "mocks jax-triton's TritonFunction.get_or_create_kernel"
    ),
    "triton_call_test.py::TritonKernelCallTest::test_callable_constexpr_and_cache": (
        "reads TritonFunction._kernel_cache; ported as "
        "tests/bridge/call/test_call_api.py::test_callable_constexprs_key_the_kernel"
    ),
    "cluster_test.py::ClusterTest::test_cluster_not_available": (
        "expects num_ctas=2 to fail on every GPU but an H100 (by device name); the H200 has "
        "thread-block clusters"
    ),
}
#: peer Gluon tests whose kernels use mbarrier.allocate_mbarrier (Triton >= 3.7) and
#: tma.async_copy_* (removed in Triton 3.9)
GLUON_TMA = (
    "gluon_test.py::GluonTest::test_device_desc_tma_copy",
    "gluon_test.py::GluonTest::test_host_desc_tma_copy",
)


def classify(nodeid: str, triton: str) -> str | None:
    """Why a failure of ``nodeid`` is expected under Triton ``triton``, or None."""
    for prefix, why in CANNOT_PASS.items():
        if nodeid.startswith(prefix):
            return f"by design: {why}"
    release = tuple(int(p) for p in triton.split(".")[:2] if p.isdigit())
    if nodeid.startswith(GLUON_TMA) and not (3, 7) <= release <= (3, 8):
        return f"needs Triton 3.7 or 3.8: the peer's Gluon TMA kernels do not compile on {triton}"
    return None


def results(junit: Path) -> list[tuple[str, str, str]]:
    """(nodeid, outcome, message) of every test case in a pytest JUnit XML report."""
    out = []
    for case in ET.parse(junit).getroot().iter("testcase"):
        module = case.get("classname", "").split(".")
        name = f"{module[-2]}.py::{module[-1]}::{case.get('name')}" if len(module) >= 2 else ""
        outcome, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            found = case.find(tag)
            if found is not None:
                outcome = "skipped" if tag == "skipped" else "failed"
                message = (
                    (found.get("message") or "").splitlines()[0][:200]
                    if found.get("message")
                    else ""
                )
                break
        out.append((name, outcome, message))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tests", type=Path, help="jax-triton's tests/ directory")
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    parser.add_argument("pytest_args", nargs="*", help="passed to pytest (after --)")
    args = parser.parse_args(argv)
    import triton

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(HERE), str(REPO), *filter(None, [env.get("PYTHONPATH")])]
    )
    with tempfile.TemporaryDirectory() as tmp:
        junit = Path(tmp) / "junit.xml"
        cmd = [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-q",
            f"--junitxml={junit}",
            *(str(p) for p in sorted(args.tests.glob("*_test.py"))),
            *args.pytest_args,
        ]
        subprocess.run(cmd, env=env, cwd=str(args.tests))
        rows = results(junit) if junit.exists() else []
    table = []
    for nodeid, outcome, message in rows:
        why = classify(nodeid, triton.__version__) if outcome == "failed" else None
        kind = outcome if why is None else "expected failure"
        table.append({"test": nodeid, "outcome": kind, "message": why or message})
    counts: dict[str, int] = {}
    for row in table:
        counts[row["outcome"]] = counts.get(row["outcome"], 0) + 1
    print(f"\njax-triton 0.4.1's suite against the bridge (Triton {triton.__version__}):")
    for row in table:
        if row["outcome"] in ("failed", "expected failure"):
            print(f"  {row['outcome']:17} {row['test']}: {row['message']}")
    print("  " + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())))
    if args.out:
        args.out.write_text(
            json.dumps({"triton": triton.__version__, "counts": counts, "tests": table}, indent=1)
        )
    return 1 if counts.get("failed", 0) or not counts.get("passed", 0) else 0


if __name__ == "__main__":
    sys.exit(main())
