"""Which entries this machine's software would look up: a hook for the packages that compute
keys.

kernelcache gives keys no meaning. A package that computes them (the bridge) registers a
*toolchain* here: a factory returning a judge, which says of an entry's metadata None (keys
computed here can name it) or why not ("Triton 3.9.0 (here 3.6.0)", "target hip:gfx942 (here
cuda:90)"). ``kernelcache import --dry-run`` counts a bundle's entries by these answers.
Registering imports nothing heavy: the factory runs only when a command asks, and raises
ImportError when what it needs is missing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

#: None: this machine would look the entry up; else why not
Judge = Callable[[Mapping[str, Any]], "str | None"]
#: what a toolchain is registered as: a judge, and a one-line description of the toolchain
Factory = Callable[[], tuple[Judge, str]]

_factories: dict[str, Factory] = {}


def register_toolchain(name: str, factory: Factory) -> None:
    """Register the toolchain of the package ``name`` (registering it again replaces it)."""
    _factories[name] = factory


def registered() -> dict[str, Factory]:
    """The registered toolchains, by package name."""
    return dict(_factories)
