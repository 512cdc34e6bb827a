#!/usr/bin/env bash
# Set up a virtual environment (first run) with every extra the tests use, then run the test
# suite in it. Arguments are passed to pytest, e.g. `bash scripts/test.sh -k store -x`.
#
# By default the environment is .venv-test with triton pinned to the GPU machine's release, so
# CPU and GPU test the same compiler; it is not the README's .venv (whose Triton is whatever
# `pip install -e '.[bridge]'` chose), so neither set-up changes the other's compiler and a
# re-run of the main job after the tests compiles nothing. TRITON=3.9.0 VENV=.venv-triton39 sets
# up another supported Triton beside it (see .ci/run, which runs the bridge's tests there too).
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
triton=${TRITON:-3.6.0}
venv=${VENV:-.venv-test}
unset TRITON VENV # not for the tests
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
# What is installed is done again only when what decides it changed (this script, the
# project's dependencies, the Triton asked for): a re-run does not ask pip about each package.
stamp="$venv/.installed"
wanted=$(cat "$0" pyproject.toml | sha256sum | cut -c1-64)-$triton
if [ "$(cat "$stamp" 2>/dev/null)" != "$wanted" ]; then
    rm -f "$stamp"
    "$venv/bin/python" -m pip install -q --upgrade pip
    # (setuptools announces every editable install with a warning banner, "Editable installation
    # ... folders in your working directory with the same name": expected here, so not shown)
    PYTHONWARNINGS="ignore:Editable installation" \
        "$venv/bin/python" -m pip install -q -e '.[bridge,redis,s3,zstd,test]' "triton==$triton"
    # jaxlib's Triton bindings (they import without a GPU): tests compare our protos with jaxlib's.
    jaxlib_version=$("$venv/bin/python" -c 'import jaxlib; print(jaxlib.__version__)')
    "$venv/bin/python" -m pip install -q --no-deps "jax-cuda13-plugin==${jaxlib_version}"
    # the ptxas jaxlib runs on PTX (what `jax[cuda13]` installs beside the plugin): tests assemble
    # the PTX the bridge lowers for jaxlib with it
    "$venv/bin/python" -m pip install -q --no-deps 'nvidia-cuda-nvcc==13.0.88'
    echo "$wanted" >"$stamp"
fi
# The tests start about 1,700 Python processes that import this checkout: its bytecode is
# compiled here once (checked against each source's hash at import, so an edited file is
# compiled again), not by every one of them where PYTHONDONTWRITEBYTECODE is set.
"$venv/bin/python" -m compileall -q --invalidation-mode checked-hash kernelcache bridge examples \
    tests/helpers
# pytest rewrites each test module's asserts and keeps the result as bytecode beside it, but
# where PYTHONDONTWRITEBYTECODE is set it keeps nothing and every worker rewrites every module
# (about 6 s of CPU each): one collection with it unset writes them first; the workers read them.
if [ -n "${PYTHONDONTWRITEBYTECODE:-}" ]; then
    PYTHONDONTWRITEBYTECODE= "$venv/bin/python" -m pytest --collect-only -q -p no:cacheprovider \
        tests >/dev/null 2>&1 || true # a module that fails to collect is reported by the run
fi
# One worker more than there are CPUs (at most 8): most of the suite's time is CPU time in
# the processes its tests start, the rest waiting on servers and timeouts, which one more
# worker fills (more only slow each other down). Each test file runs on one worker (--dist
# loadfile), so a module's fixtures (a three-way set-up, a cluster of servers) are set up once,
# not on every worker that gets one of its tests.
workers=$(( $(nproc) + 1 ))
exec "$venv/bin/python" -m pytest -n "$(( workers < 8 ? workers : 8 ))" --dist loadfile "$@"
