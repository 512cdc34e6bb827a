"""What a warm run reports: the outcome of each specialization, what could not be warmed and
why, and the run as a whole (its ``--json`` document and its human summary)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from kernelcache.cli import plural

#: version of the ``--json`` document (the CLI's schema)
SCHEMA = 1
#: problem kinds, in the order the summary lists them
KINDS = (
    "bad-record",
    "not-importable",
    "missing-kernel",
    "source-changed",
    "configs-changed",
    "invalid",
    "compile",
    "store",
    "crash",
)


@dataclass(frozen=True)
class WarmProblem:
    """Something that could not be warmed, or changed since recording, and why (``kind`` is one
    of :data:`KINDS`)."""

    kind: str
    detail: str
    kernel: str | None = None
    target: str | None = None  # None: every target
    config: str = ""
    lines: tuple[int, ...] = ()

    def as_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "kernel": self.kernel,
            "target": self.target,
            "config": self.config,
            "lines": list(self.lines),
            "detail": self.detail,
        }

    def where(self) -> str:
        """The kernel, target, config and manifest lines, for people."""
        parts = [self.kernel or "(manifest)"]
        if self.target:
            parts.append(f"for {self.target}")
        if self.config:
            parts.append(f"({self.config})")
        if self.lines:
            shown = ", ".join(map(str, self.lines[:5])) + (", ..." if len(self.lines) > 5 else "")
            parts.append(f"[line{'s' if len(self.lines) > 1 else ''} {shown}]")
        return " ".join(parts)


def merged(problems: Iterable[WarmProblem]) -> tuple[WarmProblem, ...]:
    """One problem per (kind, kernel, target, config, detail), with the lines of all."""
    out: dict[tuple[Any, ...], WarmProblem] = {}
    for p in problems:
        ident = (p.kind, p.kernel, p.target, p.config, p.detail)
        seen = out.get(ident)
        if seen is None:
            out[ident] = p
        else:
            lines = tuple(sorted(set(seen.lines) | set(p.lines)))
            out[ident] = WarmProblem(p.kind, p.detail, p.kernel, p.target, p.config, lines)
    return tuple(out.values())


@dataclass(frozen=True)
class WarmOutcome:
    """What became of one specialization for one target."""

    kernel: str
    target: str
    config: str
    key: str
    ext: str
    status: (
        str  # "compiled", "present", "left-out" (cannot compile: ``error`` says why) or "failed"
    )
    seconds: float = 0.0
    layer: str | None = None  # where a present entry was found: "local" or "readonly"
    error: str | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            "kernel": self.kernel,
            "target": self.target,
            "config": self.config,
            "key": self.key,
            "ext": self.ext,
            "status": self.status,
            "seconds": round(self.seconds, 3),
            "layer": self.layer,
            "error": self.error,
        }


@dataclass(frozen=True)
class WarmReport:
    """The outcome of a warm run (see :meth:`as_json` for the stable fields)."""

    manifest: str
    root: str
    readonly_roots: tuple[str, ...]
    targets: tuple[str, ...]
    records: int
    calls: int
    kernels: int
    results: tuple[WarmOutcome, ...]
    failures: tuple[WarmProblem, ...]
    changed: tuple[WarmProblem, ...]
    workers: int
    seconds: float

    def count(self, status: str) -> int:
        return sum(1 for r in self.results if r.status == status)

    @property
    def ok(self) -> bool:
        return not self.failures

    def as_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "command": "warm",
            "manifest": self.manifest,
            "root": self.root,
            "readonly_roots": list(self.readonly_roots),
            "targets": list(self.targets),
            "records": self.records,
            "calls": self.calls,
            "kernels": self.kernels,
            "specializations": len(self.results),
            "compiled": self.count("compiled"),
            "present": self.count("present"),
            "left_out": self.count("left-out"),
            "failed": len(self.failures),
            "workers": self.workers,
            "seconds": round(self.seconds, 3),
            "results": [r.as_json() for r in self.results],
            "failures": [f.as_json() for f in self.failures],
            "changed": [f.as_json() for f in self.changed],
            "ok": self.ok,
        }

    def summary(self) -> str:
        """The human-readable summary."""
        lines = [
            f"Warmed {self.manifest} into {self.root}",
            f"  {plural(self.records, 'record')}: {plural(self.calls, 'call')} of "
            f"{plural(self.kernels, 'kernel')}; "
            f"targets {', '.join(self.targets)}",
            f"  compiled         {self.count('compiled'):5d}"
            + (
                f"  ({self.seconds:.1f} s, {plural(self.workers, 'process')})"
                if self.workers
                else ""
            ),
            f"  already present  {self.count('present'):5d}",
            f"  failed           {len(self.failures):5d}",
        ]
        left = [r for r in self.results if r.status == "left-out"]
        if left:
            lines.insert(
                -1, f"  left out         {len(left):5d}  (cannot compile: not tried again)"
            )
            lines.append(
                "Left out (configs that cannot compile, as Triton's autotuner skips them):"
            )
            lines += [f"  {r.kernel} for {r.target} ({r.config}): {r.error}" for r in left]
        if self.changed:
            lines.append("Compiled the current source of kernels that changed since recording:")
            lines += [f"  {f.where()}: {f.detail}" for f in self.changed]
        if self.failures:
            lines.append("Failed:")
            for f in sorted(self.failures, key=lambda f: KINDS.index(f.kind)):
                detail = f.detail.replace("\n", "\n      ")
                lines.append(f"  [{f.kind}] {f.where()}: {detail}")
        return "\n".join(lines)
