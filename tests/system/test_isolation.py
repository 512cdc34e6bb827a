"""The tests touch nothing outside temporary directories: a process a test starts without a
cache root of its own (``KERNELCACHE_DIR`` is never passed on to children) writes its default
root, and Triton its files, under the session's temporary user directories, never the user's."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from support import run_py

CHILD = """
import json, os, platformdirs, kernelcache
cache = kernelcache.Cache(None, readonly_roots=(), remote="")
art = cache.put("ab" * 32, "bin", b"written by a test's child", {})
print(json.dumps({"root": cache.root, "path": art.path,
                  "cache_dir": platformdirs.user_cache_dir("kernelcache", appauthor=False),
                  "triton_home": os.environ.get("TRITON_HOME")}))
"""


def _under(path: str, directory: str) -> bool:
    return Path(os.path.realpath(path)).is_relative_to(os.path.realpath(directory))


def test_a_child_without_a_root_writes_under_the_sessions_temporary_directories():
    out = json.loads(run_py(CHILD).stdout.splitlines()[-1])
    temp = tempfile.gettempdir()
    for name in ("root", "path", "cache_dir", "triton_home"):
        assert out[name] and _under(out[name], temp), (name, out[name])
    assert not _under(out["root"], os.path.expanduser("~")) or _under(os.path.expanduser("~"), temp)
