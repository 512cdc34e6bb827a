"""The tests' children run as forks of a server (tests/helpers/command_server.py): each must be
what a fresh interpreter given the same arguments, variables, folder and umask would be, or be
one."""

from __future__ import annotations

import json
import os
import sys
import textwrap

import command_server
from cli_support import KERNELCACHE
from support import child_env

#: what a child reports of itself, after importing jax first
REPORT = textwrap.dedent(
    """
    import jax
    import json, os, site, sys
    print(json.dumps({
        "argv": sys.argv, "cwd": os.getcwd(), "umask": os.umask(0), "path": sys.path,
        "bytecode": sys.dont_write_bytecode, "user_site": site.getusersitepackages(),
        "var": os.environ.get("KC_SERVER_TEST"), "pid": os.getpid(), "jax": jax.__file__,
        "main": __name__, "started_as": sys.orig_argv,
    }))
    sys.exit(3)
    """
)


def _fresh(code: str, env: dict[str, str], cwd: str) -> dict:
    proc = command_server.fresh([sys.executable, "-c", code, "a", "b"], env, timeout=120, cwd=cwd)
    assert proc.returncode == 3, proc.stderr
    return json.loads(proc.stdout)


def test_a_served_child_is_what_a_fresh_interpreter_is(tmp_path):
    extra = tmp_path / "extra"
    extra.mkdir()
    env = child_env(
        KC_SERVER_TEST="seen",
        PYTHONDONTWRITEBYTECODE="1",
        PYTHONUSERBASE=str(tmp_path / "user"),
        PYTHONPATH=f"{extra}{os.pathsep}{child_env()['PYTHONPATH']}",
    )
    old = os.umask(0o027)
    try:
        proc = command_server.run_python(REPORT, ["a", "b"], env, timeout=120, cwd=tmp_path)
        fresh = _fresh(REPORT, env, str(tmp_path))
    finally:
        os.umask(old)
    assert proc.returncode == 3, proc.stderr
    served = json.loads(proc.stdout)
    assert served.pop("pid") != fresh.pop("pid")
    # (the one difference: the fork was started as the server was, not with this code)
    assert served.pop("started_as")[2] != REPORT and fresh.pop("started_as")[2] == REPORT
    assert served == fresh
    assert served["umask"] == 0o027 and served["var"] == "seen" and str(extra) in served["path"]


def test_children_that_jax_would_see_otherwise_are_fresh_interpreters(tmp_path):
    """A variable jax reads at import, a folder on the path holding a module the server
    imported, and code that sets a variable before importing jax: each a fresh process (the
    server's own jax is not the one such a child imports)."""
    fake = tmp_path / "fake"
    (fake / "jax").mkdir(parents=True)
    (fake / "jax" / "__init__.py").write_text("__file__ = 'the fake jax'\n")
    base = child_env()
    cases = {
        "variable": (REPORT, child_env(JAX_ENABLE_X64="1")),
        "shadow": (REPORT, child_env(PYTHONPATH=f"{fake}{os.pathsep}{base['PYTHONPATH']}")),
        "set-first": ("import os\nos.environ['JAX_ENABLE_X64'] = '1'\n" + REPORT, base),
    }
    for name, (code, env) in cases.items():
        proc = command_server.run_python(code, [], env, timeout=120)
        out = json.loads(proc.stdout) if proc.returncode == 3 else None
        if name == "shadow":  # the fake jax has no __file__ of jax's own
            assert out is not None and out["jax"] == "the fake jax", proc.stderr
        assert out is not None and out["started_as"][2] == code, (name, proc.stderr)


def test_a_served_command_exits_and_says_what_the_script_does(tmp_path):
    root = tmp_path / "root"
    args = ["--root", str(root), "frobnicate"]
    env = child_env()
    served = command_server.run(KERNELCACHE, args, env, timeout=60, cwd=tmp_path)
    fresh = command_server.fresh([KERNELCACHE, *args], env, timeout=60, cwd=tmp_path)
    assert (served.returncode, served.stdout, served.stderr) == (
        fresh.returncode,
        fresh.stdout,
        fresh.stderr,
    )
    assert served.returncode == 2 and "frobnicate" in served.stderr
