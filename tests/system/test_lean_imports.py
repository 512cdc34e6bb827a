"""A process imports what it uses: ``import kernelcache`` imports its errors alone and resolves
every other public name (and module) at first use, and a process that lowers calls
(``import bridge``, ``bridge.triton_call``) imports none of what only a miss, the operator's
commands or a remote tier need. Fresh processes: what matters is what a process has imported."""

from __future__ import annotations

import importlib
import json

import pytest
from support import not_for_a_hit, run_py

import kernelcache


def test_import_kernelcache_imports_only_its_version_and_errors():
    done = run_py(
        "import json, sys, kernelcache\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('kernelcache'))))"
    )
    loaded = json.loads(done.stdout.strip().splitlines()[-1])
    assert loaded == ["kernelcache", "kernelcache._version", "kernelcache.errors"]


@pytest.mark.parametrize("name", kernelcache.__all__)
def test_every_public_name_of_kernelcache_is_its_modules_own(name):
    value = getattr(kernelcache, name)
    module = getattr(value, "__module__", None)
    if isinstance(module, str) and module.startswith("kernelcache."):
        assert getattr(importlib.import_module(module), name.split(".")[-1], value) is value
    assert name in dir(kernelcache)


def test_a_module_of_kernelcache_is_an_attribute_once_used_and_an_unknown_name_is_not():
    done = run_py(
        "import kernelcache\n"
        "print(kernelcache.config.settings is kernelcache.settings)\n"
        "print(kernelcache.stats.process_stats is kernelcache.process_stats)\n"
        "try:\n"
        "    kernelcache.no_such_name\n"
        "except AttributeError as e:\n"
        "    print(e)\n"
    )
    assert done.stdout.split("\n")[:3] == [
        "True",
        "True",
        "module 'kernelcache' has no attribute 'no_such_name'",
    ]


def test_a_lowering_process_imports_neither_the_miss_nor_the_operator_machinery():
    done = run_py(
        "import json, sys\n"
        "import jax, triton\n"
        "import bridge\n"
        "bridge.triton_call\n"
        "cache = bridge.settings.as_cache(None)\n"
        "print(json.dumps({'modules': sorted(sys.modules), 'remote': cache.remote is None}))\n",
        JAX_PLATFORMS="cpu",
        timeout=300,
    )
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert "kernelcache.cache" in result["modules"] and result["remote"]
    assert not_for_a_hit(result["modules"]) == []


def test_a_cache_imports_the_remote_tier_and_the_size_cap_when_it_has_them(tmp_path):
    done = run_py(
        "import json, sys, kernelcache\n"
        f"plain = kernelcache.Cache(root={str(tmp_path / 'a')!r}, remote='', max_size=0)\n"
        "before = [m for m in ('kernelcache.remote', 'kernelcache.capacity') if m in sys.modules]\n"
        f"capped = kernelcache.Cache(root={str(tmp_path / 'b')!r}, remote='', max_size='1M')\n"
        "print(json.dumps({'before': before, 'capped': type(capped.capacity).__name__,\n"
        "                  'plain': plain.capacity is None}))\n"
    )
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {"before": [], "capped": "SizeCap", "plain": True}
