"""A command that needs an optional package that is not installed says which, and the command
that installs it, as a usage error (exit 2), in text and with ``--json``, before doing any work;
``doctor`` says the same of a remote tier whose client is missing. The commands run in a real
process where the packages cannot be imported."""

from __future__ import annotations

import json

import pytest
from cli_support import kc_code, put

# the kernelcache command, in a process where the optional packages cannot be imported
WITHOUT_EXTRAS = """
import sys
for name in ("obstore", "redis", "zstandard"):
    sys.modules[name] = None  # importing it raises ImportError, as where it is not installed
from kernelcache.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize(
    "args, remote, said",
    [
        (["export", "--to", "s3://bucket/x.tar"], "", "--to s3://bucket/x.tar needs obstore"),
        (["export", "--to", "gs://bucket/x.tar"], "", "--to gs://bucket/x.tar needs obstore"),
        (["import", "--from", "s3://bucket/x.tar"], "", "--from s3://bucket/x.tar needs obstore"),
        (["import", "--from", "gs://bucket/x.tar"], "", "--from gs://bucket/x.tar needs obstore"),
        (["stats", "--remote"], "s3://bucket/kc", "stats --remote (s3://bucket/kc) needs obstore"),
        (["stats", "--remote"], "redis://localhost:1/0", "needs redis"),
        (["export", "OUT.tar.zst"], "", "a zstd bundle needs zstandard"),
    ],
)
@pytest.mark.parametrize("as_json", [False, True])
def test_a_missing_optional_package_is_a_usage_error_naming_the_install(
    tmp_path, args, remote, said, as_json
):
    root = tmp_path / "root"
    put(root, "matmul")
    args = [a.replace("OUT", str(tmp_path / "out")) for a in args]
    extra = {"redis": "redis", "obstore": "s3", "zstandard": "zstd"}[said.split()[-1]]
    env = {"KERNELCACHE_REMOTE": remote} if remote else {}
    flags = ["--json"] if as_json else []
    proc = kc_code("--root", str(root), *flags, *args, code=2, prelude=WITHOUT_EXTRAS, **env)
    install = f"pip install 'kernelcache[{extra}]'"
    assert said in proc.stderr and install in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and "ModuleNotFoundError" not in proc.stderr
    if as_json:
        doc = json.loads(proc.stdout)
        assert doc["command"] == args[0] and said in doc["error"] and install in doc["error"]
    else:
        assert proc.stdout == ""  # nothing done: no table, no export
    assert not (tmp_path / "out.tar.zst").exists()


def test_doctor_says_which_client_a_remote_tier_needs(tmp_path):
    root = tmp_path / "root"
    put(root, "matmul")
    proc = kc_code(
        "--root",
        str(root),
        "--json",
        "doctor",
        code=1,
        prelude=WITHOUT_EXTRAS,
        KERNELCACHE_REMOTE="s3://bucket/kc redis://localhost:1/0",
    )
    checks = {c["name"]: c for c in json.loads(proc.stdout)["checks"]}
    s3 = checks["remote s3://bucket/kc"]
    assert s3["status"] == "fail" and "pip install 'kernelcache[s3]'" in s3["detail"]
    assert "start the server" not in s3["detail"]  # nothing to start: a package to install
    assert "pip install 'kernelcache[redis]'" in checks["remote redis://localhost:1/0"]["detail"]
