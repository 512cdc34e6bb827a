"""Whether the cache's keys still describe the code: ``kernelcache audit MANIFEST``.

For every specialization of every call of a recorded manifest, for each target, the audit keys
the call exactly as a lowering does (:mod:`bridge.warm.planning`), runs Triton's frontend, and
compares the IR it gives today with the IR the cached entry under that key was compiled from
(every kernel entry records its digest, ``ir``):

- ``exact``: the entry a lowering would use (the one under the key, or where its frontend's
  reads find something else today, the one kept for what they find: see
  :mod:`bridge.readsets.witness`) was built from today's IR;
- ``hole``: the entry a lowering would use was built from other IR: a change neither the key nor
  the read set saw (a lowering would serve a stale kernel). The audit fails;
- ``uncached``: nothing is stored under the key (nothing to compare; the kernel is exact);
- ``unrecorded``: the entry predates IR digests;
- ``problem``: the call does not fit the kernel any more, or its frontend fails (or, with
  ``recompile``, its compile).

With ``recompile``, each cached kernel that is ``exact`` is also compiled (in a
compiler process, kept in memory) and its machine code compared with the entry's, byte for
byte; one that differs is ``differs``: the entry was compiled from today's IR, yet a compile
today gives other machine code, so something after the frontend (the backend, its tools, what
they read) changed that the key does not see. The audit fails then too.

Nothing here writes: keys are computed without the cache's memos, entries are read without
counting a hit or touching them. Exit status 1 when there is a hole or a difference (and, with
``--strict``, anything it could not check: :data:`UNCHECKED`); without ``--strict`` the summary
says how many it could not check.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from kernelcache import Artifact

from ..compile import fetch
from ..exceptions import BridgeError, KernelArgumentError
from ..identity import frontend
from ..identity.specialize import Specialization
from ..readsets import read_sets
from ..vendors.targets import Target, recorded_targets
from ..warm.manifest import load_manifest
from ..warm.planning import kernel_parts, specializations
from .explain import targets_of
from .lookups import inspected

if TYPE_CHECKING:
    from kernelcache import Cache

#: statuses, in the order a summary lists them
STATUSES = ("exact", "hole", "differs", "uncached", "unrecorded", "problem")
#: statuses of specializations whose entry the audit could not compare with today's code
UNCHECKED = ("uncached", "unrecorded", "problem")


@dataclass(frozen=True)
class Audited:
    """One specialization of a recorded call for one target, audited."""

    kernel: str
    target: str
    config: str
    status: str  # one of STATUSES
    key: str | None = None
    ir: str | None = None  # the digest of the IR the frontend gives today
    entry_ir: str | None = None  # the digest of the IR the entry was compiled from
    reason: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "kernel": self.kernel,
            "target": self.target,
            "config": self.config,
            "status": self.status,
            "key": self.key,
            "ir": self.ir,
            "entry_ir": self.entry_ir,
            "reason": self.reason,
        }

    def line(self) -> str:
        where = f"{self.kernel} {self.target}" + (f" ({self.config})" if self.config else "")
        text = {
            "exact": "the entry was compiled from today's IR",
            "hole": (
                f"HOLE: the entry under its key {str(self.key)[:16]} was compiled from IR "
                f"{str(self.entry_ir)[:16]}, the frontend gives {str(self.ir)[:16]} today: a "
                "change its key does not see"
            ),
            "differs": (
                f"DIFFERS: the entry under its key {str(self.key)[:16]} was compiled from "
                f"today's IR, yet a compile today gives other machine code ({self.reason}): a "
                "change after the frontend its key does not see"
            ),
            "uncached": "nothing cached under its key",
            "unrecorded": "the entry does not record the IR it was compiled from",
            "problem": str(self.reason),
        }[self.status]
        return f"{self.status:<10} {where}: {text}"


def _entry(cache: Cache, spec: Specialization) -> Artifact | None:
    """The entry a lowering of ``spec`` would use: the one under its key or, where that
    entry's reads find something else today, the one under the key chained from it (as
    :func:`bridge.compile.fetch.fetch_each` follows them)."""
    _, found = read_sets.follow(
        spec.key,
        lambda key: inspected(cache, key, spec.ext),
        lambda _, art: fetch.stale(spec, art.meta),
    )
    return found


def _one(kernel: str, spec: Specialization, cache: Cache, recompile: bool) -> Audited:
    target, config = str(spec.target), spec.variant.description
    try:
        today = frontend.ir_digest(spec.source, spec.target, spec.backend, spec.bound.options)
    except Exception as e:  # the kernel's own error: reported, as a compile would
        why = f"its frontend fails: {type(e).__name__}: {e}"
        return Audited(kernel, target, config, "problem", spec.key, reason=why)
    art = _entry(cache, spec)
    if art is None:
        return Audited(kernel, target, config, "uncached", spec.key, today)
    recorded = art.meta.get("ir")
    if not isinstance(recorded, str):
        return Audited(kernel, target, config, "unrecorded", spec.key, today)
    status = "exact" if recorded == today else "hole"
    found = Audited(kernel, target, config, status, spec.key, today, recorded)
    return _compared(found, spec, art) if recompile and status == "exact" else found


def _compared(found: Audited, spec: Specialization, art: Artifact) -> Audited:
    """``found`` (an entry built from today's IR) after compiling ``spec`` and comparing the
    machine code with the entry's: ``differs`` where it is not the same, byte for byte."""
    from ..compile.compiler import compile_source

    try:
        binary = compile_source(spec.source, spec.target, spec.backend, spec.bound.options).binary
    except Exception as e:  # the kernel's own error, or its compiler's: reported
        why = f"its compile fails: {type(e).__name__}: {e}"
        return replace(found, status="problem", reason=why)
    if binary == art.data:
        return found
    at = next((i for i, (a, b) in enumerate(zip(binary, art.data, strict=False)) if a != b), None)
    why = f"{len(binary):,} bytes against the entry's {len(art.data):,}" + (
        f", first different at byte {at:,}" if at is not None else ""
    )
    return replace(found, status="differs", reason=why)


def audit(
    manifest: str, cache: Cache, targets: Sequence[str | Target] = (), *, recompile: bool = False
) -> list[Audited]:
    """Audit every specialization of every call of ``manifest`` for ``targets`` (names, and
    patterns that select among the recorded ones; default: each call's recorded targets);
    ``recompile``: compile each cached kernel built from today's IR, and compare.

    Raises:
        ManifestError: the manifest cannot be read or is not a manifest.
        TargetError: a target given is malformed, or a pattern matches no recorded target.
    """
    loaded = load_manifest(manifest)
    recorded = (t for call in loaded.calls for t in call.targets)
    choose = recorded_targets([str(t) for t in targets], recorded, manifest)
    out = [
        Audited(f.kernel or "(manifest)", "", "", "problem", reason=f.detail)
        for f in loaded.failures
    ]
    for call in loaded.calls:
        wanted, bad = targets_of(call, choose(call.targets))
        out += [Audited(call.kernel, "", "", "problem", reason=detail) for detail in bad]
        try:
            parts = kernel_parts(call)
        except KernelArgumentError as e:
            out += [Audited(call.kernel, str(t), "", "problem", reason=str(e)) for t in wanted]
            continue
        for target in wanted:
            try:
                # keyed without the cache: its memos are not written
                specs = specializations(call, parts, target, None)  # type: ignore[arg-type]
            except Exception as e:  # the call does not fit the kernel/target: reported
                why = "does not fit the kernel" if isinstance(e, BridgeError) else "failed to bind"
                reason = f"the recorded call {why}: {type(e).__name__}: {e}"
                out.append(Audited(call.kernel, str(target), "", "problem", reason=reason))
                continue
            out += [_one(call.kernel, spec, cache, recompile) for spec in specs]
    return out
