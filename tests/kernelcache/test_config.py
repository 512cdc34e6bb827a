"""Environment variables: parsed in one place, bad values named in the error."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kernelcache.config import (
    VARIABLES,
    ConfigError,
    Settings,
    environment_in_effect,
    parse_variable,
    settings,
)


def test_defaults():
    s = settings({})
    assert s.root is None and s.readonly_roots == () and s.remote is None
    assert s.lock_mode == "auto" and s.lock_timeout == 120.0
    assert s.disable is False and s.stats_log is True


def test_values_parsed():
    s = settings(
        {
            "KERNELCACHE_DIR": "~/kc",
            "KERNELCACHE_READONLY_DIRS": f"/a{os.pathsep}{os.pathsep}/b",
            "KERNELCACHE_REMOTE": " redis://h:1/0 ",
            "KERNELCACHE_LOCK_TIMEOUT": "2.5",
            "KERNELCACHE_LOCK_MODE": "soft",
            "KERNELCACHE_DISABLE": "yes",
        }
    )
    assert s.root == Path("~/kc").expanduser()
    assert s.readonly_roots == (Path("/a"), Path("/b"))
    assert s.remote == "redis://h:1/0"
    assert s.lock_timeout == 2.5 and s.lock_mode == "soft" and s.disable is True


@pytest.mark.parametrize(
    "name, value",
    [
        ("KERNELCACHE_LOCK_TIMEOUT", "soon"),
        ("KERNELCACHE_LOCK_TIMEOUT", "-1"),
        ("KERNELCACHE_LOCK_TIMEOUT", "nan"),
        ("KERNELCACHE_LOCK_MODE", "nfs"),
        ("KERNELCACHE_DISABLE", "maybe"),
        ("KERNELCACHE_LOCK_STALE", "inf"),
        ("KERNELCACHE_LOCK_TIMEOUT", "9" * 400),
        ("KERNELCACHE_DIR", "~no-such-user-here/cache"),
        ("KERNELCACHE_READONLY_DIRS", "/a:~no-such-user-here/b"),
        ("KERNELCACHE_TRUST", "everyone"),
    ],
)
def test_bad_values_name_the_variable(name, value):
    with pytest.raises(ConfigError, match=name):
        settings({name: value})


def test_environment_in_effect_lists_only_known_variables():
    env = {"KERNELCACHE_DIR": "/x", "KERNELCACHE_BOGUS": "1", "HOME": "/root"}
    assert environment_in_effect(env) == {"KERNELCACHE_DIR": "/x"}
    assert all(var.name.startswith("KERNELCACHE_") for var in VARIABLES)


def test_each_variable_declared_once_with_its_default():
    names = [var.name for var in VARIABLES]
    assert len(names) == len(set(names))
    assert settings({}) == Settings(), "declared defaults and the dataclass's defaults agree"
    for var in VARIABLES:
        assert parse_variable(var, {}) == var.default
        if var.required_if_set:  # a secret set but blank fails closed
            with pytest.raises(ConfigError, match=f"{var.name} is set but blank"):
                parse_variable(var, {var.name: "  "})
            continue
        assert parse_variable(var, {var.name: "  "}) == var.default, "empty means the default"


@pytest.mark.parametrize(
    ("name", "value", "field", "expected"),
    [
        ("KERNELCACHE_LOCK_TIMEOUT", "90s", "lock_timeout", 90.0),
        ("KERNELCACHE_LOCK_STALE", "10m", "lock_stale", 600.0),
        ("KERNELCACHE_STATS_LOG", "off", "stats_log", False),
    ],
)
def test_units_are_the_common_ones(name, value, field, expected):
    assert getattr(settings({name: value}), field) == expected


def test_a_package_declares_its_variables_once(monkeypatch):
    from kernelcache import config
    from kernelcache.config import Variable, register_variables, variable, variables

    monkeypatch.setattr(config, "_registered", dict(config._registered))  # undone after the test

    var = Variable("KERNELCACHE_TEST_ONLY", "x", str.strip, None, "(none)", "a test variable")
    register_variables(var)
    register_variables(var)  # again: the same declaration is a no-op
    assert variables().count(var) == 1 and variable(var.name) is var
    assert environment_in_effect({var.name: "v", "KERNELCACHE_DIR": "/x"}) == {
        var.name: "v",
        "KERNELCACHE_DIR": "/x",
    }
    with pytest.raises(ValueError, match="KERNELCACHE_TEST_ONLY"):
        register_variables(Variable(var.name, "y", str.strip, None, "(none)", "another meaning"))
    with pytest.raises(ValueError, match="KERNELCACHE_DIR"):
        register_variables(Variable("KERNELCACHE_DIR", "z", str.strip, None, "", "taken"))


def test_settings_are_parsed_again_only_when_a_value_changes(monkeypatch):
    monkeypatch.setenv("KERNELCACHE_LOCK_TIMEOUT", "7")
    first = settings()
    assert settings() is first and first.lock_timeout == 7.0
    monkeypatch.setenv("KERNELCACHE_LOCK_TIMEOUT", "8")
    assert settings().lock_timeout == 8.0
    monkeypatch.setenv("KERNELCACHE_LOCK_TIMEOUT", "never")
    with pytest.raises(ConfigError, match="KERNELCACHE_LOCK_TIMEOUT"):
        settings()
