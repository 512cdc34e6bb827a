"""The bridge's variables and metadata fields: declared to kernelcache, parsed by the bridge."""

from __future__ import annotations

import subprocess
import sys

import pytest

from bridge.settings import BridgeSettings, settings
from kernelcache.config import variables
from kernelcache.errors import ConfigError


def test_defaults_and_values():
    assert settings({}) == BridgeSettings()
    s = settings({"KERNELCACHE_TARGET": " sm_90a ", "KERNELCACHE_EMBED": "PTX"})
    assert s.target == "sm_90a" and s.embed == "ptx" and s.record is None


@pytest.mark.parametrize(
    "name, value",
    [
        ("KERNELCACHE_EMBED", "cubin"),
        ("KERNELCACHE_TARGET", "cuda:9000"),
        ("KERNELCACHE_TARGET", "gfx942"),
    ],
)
def test_bad_values_name_the_variable(name, value):
    with pytest.raises(ConfigError, match=name):
        settings({name: value})


def test_importing_bridge_declares_its_variables_to_kernelcache():
    names = {var.name for var in variables()}
    assert {"KERNELCACHE_TARGET", "KERNELCACHE_EMBED", "KERNELCACHE_RECORD"} <= names


def test_kernelcache_alone_declares_none_of_them():
    code = (
        "import sys, kernelcache.config as c; "
        "print(sorted(v.name for v in c.variables())); print('bridge' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert "KERNELCACHE_TARGET" not in out[0] and out[1] == "False"
