"""What ``kernelcache doctor`` reports: :class:`Check` (a status, what was found, what to do),
:class:`Report` (the checks and the facts beside them), and the contributions packages built on
kernelcache add (:func:`register_report`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Check:
    """One finding: ``status`` is ``ok``, ``warn`` or ``fail``."""

    name: str
    status: str
    detail: str

    def to_json(self) -> dict[str, str]:
        return {"name": self.name, "status": self.status, "detail": self.detail}


#: what packages built on kernelcache add to the diagnosis: name -> a function returning
#: (information for the ``--json`` document under ``name``, or None; its checks)
Contribution = Callable[[], "tuple[dict[str, Any] | None, list[Check]]"]
CONTRIBUTIONS: dict[str, Contribution] = {}


def register_report(name: str, contribute: Contribution) -> None:
    """Add a package's findings to every diagnosis (the bridge adds JAX's cache settings).
    ``contribute`` runs at each :func:`diagnose`; registering a name again replaces it."""
    CONTRIBUTIONS[name] = contribute


@dataclass(frozen=True)
class Report:
    root: str | None
    info: dict[str, Any]
    checks: tuple[Check, ...] = field(default_factory=tuple)

    @property
    def ok(self) -> bool:
        return all(c.status != "fail" for c in self.checks)
