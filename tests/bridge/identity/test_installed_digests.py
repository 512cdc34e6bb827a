"""Installed code is never trusted beyond what was digested (bridge.identity.file_digests): code
of an installed distribution is described by name and the digest of its module's own file, and
code of a module with no such file to read makes the kernel open (keyed by its IR).

A package imported from a zip archive that lies in ``site-packages`` (as an egg does) has its
modules' ``__file__`` inside the archive: no file can be read, and its code was described by
name with no digest, so an archive changed kept the kernel's key. Now the kernel is open. The
three-way attack of :mod:`three_way` (version B changes a constant of the code in the archive)
holds end to end, the kernel's read set and its key alike. A portion of a namespace package
spread over two directories is described by its own file. A module made at run time, under an
installed package's name, has no file of its own: it is not trusted by its package's file.
"""

from __future__ import annotations

import hashlib
import io
import sys
import types
import zipfile

import pytest
from bridge_helpers import kernel_source, run_child
from three_way import Case, assert_second_gets_a_compile, write
from three_way import three_way as three_way_code

from bridge.exceptions import Undescribable
from bridge.identity import jit, static_reads

#: a module whose ``constexpr_function`` returns a constant of its own code
TUNE = """
import triton


@triton.constexpr_function
def scale(t):
    return {factor}
"""
#: the kernel's module: the archive beside it goes on the import path, then the package in it
#: is imported
FROM_ZIP = """
import os, sys
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "deps.zip"))
from zscale.tune import scale
"""


def archive(factor: float) -> bytes:
    """A zip archive holding the package ``zscale`` whose ``constexpr_function`` ``scale``
    returns ``factor``."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        z.writestr("zscale/__init__.py", "")
        z.writestr("zscale/tune.py", TUNE.format(factor=factor))
    return out.getvalue()


CASES: dict[str, Case] = {
    "installed-package-in-a-zip": Case(
        {
            "site/zk1/__init__.py": "",
            "site/zk1/deps.zip": archive(2.0),
            "site/zk1/k.py": kernel_source(FROM_ZIP, "x * scale(x)"),
        },
        {"site/zk1/deps.zip": archive(9.0)},
        "zk1.k",
    ),
    "installed-portion-of-a-namespace-package": Case(
        {
            "site/nsk2/tune.py": TUNE.format(factor=2.0),  # (no __init__.py: a namespace)
            "nsk2/other.py": "OTHER = 1\n",  # (its other portion, in the application's folder)
            "site/nsk2k/__init__.py": "",
            "site/nsk2k/k.py": kernel_source("from nsk2.tune import scale", "x * scale(x)"),
        },
        {"site/nsk2/tune.py": TUNE.format(factor=9.0)},
        "nsk2k.k",
    ),
}


@pytest.fixture(scope="module")
def three_way(tmp_path_factory):
    return three_way_code(tmp_path_factory.mktemp("installed-digests"), CASES)


@pytest.mark.parametrize("name", list(CASES))
def test_a_second_process_embeds_what_a_compile_of_the_new_installed_code_gives(three_way, name):
    assert_second_gets_a_compile(three_way, name)


CODE_CHILD = """
import json, os, site, sys
sys.path.insert(0, site.getusersitepackages())
from bridge.exceptions import Undescribable
from bridge.identity import kernel_keys
mod = __import__(os.environ["CODE_MODULE"], fromlist=["kernel"])
try:
    print(json.dumps(["described", kernel_keys.code_digest(mod.kernel)]))
except Undescribable as e:
    print(json.dumps(["open", str(e)]))
"""


def test_code_in_a_zip_makes_the_kernel_open(tmp_path):
    """The kernel's code step, in a process of each version: code of the package in the zip
    is not described by its name alone (it was, with no digest, so version B had version A's
    key); the kernel is open, and says which module and why. The namespace portion is
    described by its own file, and version B by another digest."""
    files = {**CASES["installed-package-in-a-zip"].a}
    files.update(CASES["installed-portion-of-a-namespace-package"].a)
    write(tmp_path, files)

    def code(module: str) -> list[str]:
        return run_child(CODE_CHILD, CODE_MODULE=module, PYTHONUSERBASE=str(tmp_path / "user"))

    for version in (2.0, 9.0):
        write(tmp_path, {"site/zk1/deps.zip": archive(version)})
        kind, why = code("zk1.k")
        assert kind == "open" and "zscale.tune" in why and "zip archive" in why
    first = code("nsk2k.k")
    write(tmp_path, CASES["installed-portion-of-a-namespace-package"].b)
    second = code("nsk2k.k")
    assert first[0] == second[0] == "described" and first[1] != second[1]


#: a module's source, made a module at run time (no file of its own) under an installed name
MADE = """
import triton


@triton.constexpr_function
def scale(t):
    return 2.0
"""


def test_code_of_an_installed_module_with_no_file_of_its_own_is_not_trusted(tmp_path, monkeypatch):
    """A module made at run time under an installed package's name has no file: its code is
    not trusted by the file of the package (which holds none of it), whatever its origin."""
    import numpy

    tag = hashlib.sha256(str(tmp_path).encode()).hexdigest()[:8]
    name = f"numpy._made_at_run_time_{tag}"
    source = tmp_path / "made.py"
    source.write_text(MADE)
    module = types.ModuleType(name)  # (no __file__)
    monkeypatch.setitem(sys.modules, name, module)
    exec(compile(MADE, str(source), "exec"), module.__dict__)
    assert static_reads.origin(name) == "installed" and numpy.__file__
    with pytest.raises(Undescribable, match=f"{name}, which has no file of its own"):
        jit.constant(module.scale)
