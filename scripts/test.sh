#!/usr/bin/env bash
# Set up .venv (first run) with every extra the tests use, then run the whole test suite.
# triton is pinned to the GPU machine's release so CPU and GPU test the same compiler.
# Arguments are passed to pytest, e.g. `bash scripts/test.sh -k store -x`.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$python" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[bridge,redis,zstd,progress,test]' 'triton==3.6.0'
# jaxlib's Triton bindings (they import without a GPU): tests compare our protos with jaxlib's.
jaxlib_version=$(.venv/bin/python -c 'import jaxlib; print(jaxlib.__version__)')
.venv/bin/python -m pip install -q --no-deps "jax-cuda13-plugin==${jaxlib_version}"
# two workers: the suite spends much of its time waiting on child processes
exec .venv/bin/python -m pytest -n 2 "$@"
