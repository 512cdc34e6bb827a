"""Installed code is never trusted by its name: what the frontend reads of an installed
distribution is described by content, and calls of its ``constexpr_function`` are made again,
as the application's own are (bridge.readsets.witness).

A package imported from a zip archive that lies in ``site-packages`` (as an egg does) has its
modules' ``__file__`` inside the archive, no file to digest; a portion of a namespace package
spread over two directories is a module of its own. In the three-way attack of
:mod:`three_way`, version B changes a constant of the installed code: the second process
embeds what a compile of version B gives.
"""

from __future__ import annotations

import io
import zipfile

import pytest
from bridge_helpers import kernel_source
from identity_targets import each_target
from three_way import Case, assert_second_gets_a_compile
from three_way import three_way as three_way_code

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


@pytest.mark.parametrize("target,name", each_target(CASES))
def test_a_second_process_embeds_what_a_compile_of_the_new_installed_code_gives(
    three_way, target, name
):
    assert_second_gets_a_compile(three_way, name, target)
