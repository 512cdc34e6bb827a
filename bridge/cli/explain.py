"""Why the cache hits or misses: ``kernelcache explain MANIFEST``.

Every entry the bridge compiles records the components of its key
(:func:`bridge.identity.kernel_keys.key_components`). :func:`explain` keys each call of a manifest for
each target exactly as a lowering (and ``warm``) does (:mod:`bridge.warm.planning`) and says, per
specialization, whether a lowering would use an entry of the cache: the lookup a lowering makes
is followed (:mod:`.lookups`): the entry under the key, or where its reads find something else
now, the one chained from it; for a hit, which entry, and what its reads find, and the stored
lowerings that embed it (those holding its read set: a warm lowering of a call stored so is
served from one of them, its read sets checked as here, and looks up no kernel entry); for an
entry passed, which reads differ. For a miss with nothing under its key, it finds the nearest entry of
the same kernel (the fewest differing components, among entries of the same kernel name) and
names the components that differ, worded for a person ("triton version 3.6.0 here vs 3.9.0 in
the entry", "code digest differs"). An entry written before components were recorded is still
a hit; as the nearest entry it is compared by what it does record (target, Triton version) and
says "components not recorded".

Nothing here compiles, counts a hit or a miss, or changes the cache (keys are computed without
its memos, as ``audit`` computes them; entries are read without a trace, and their reads made
as a lookup makes them): layers are scanned once
(metadata, through the scan index) and the candidates of a kernel are read without a trace
(``Store.inspect``). Linear in entries.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kernelcache import Artifact
from kernelcache.cli import scan

from ..call.plain import source_digest
from ..entries.lowerings import LOWERING, decode
from ..exceptions import BridgeError, KernelArgumentError, TargetError
from ..identity.kernel_keys import COMPONENTS
from ..identity.specialize import Specialization, components
from ..vendors.targets import Target, parse_target, recorded_targets
from ..warm.manifest import RecordedCall, load_manifest
from ..warm.planning import kernel_parts, specializations
from . import lookups

if TYPE_CHECKING:
    from kernelcache import Cache, Store

#: components whose values are worth showing ("3.6.0 here vs 3.9.0 in the entry"); the others
#: are digests
_SHOWN = frozenset({"pipeline", "triton", "target", "language"})
#: components that another one differing implies (not reported again): another Triton is
#: another compiler, backend, specialization of the signature, options class and environment
#: of variables; another target another backend and options
_IMPLIED = {
    "compiler": {"triton"},
    "backend": {"target", "triton"},
    "options": {"target", "triton"},
    "signature": {"triton"},
    "environment": {"triton"},
}


@dataclass(frozen=True)
class Difference:
    """One component of a key that differs between this machine and an entry."""

    component: str
    here: str | None
    entry: str | None

    def text(self) -> str:
        label = COMPONENTS.get(self.component, self.component)
        if self.entry is None:
            return f"{label}: not recorded in the entry"
        if self.component in _SHOWN:
            return f"{label} {self.here} here vs {self.entry} in the entry"
        return f"{label} differs"

    def to_json(self) -> dict[str, Any]:
        return {
            "component": self.component,
            "here": self.here,
            "entry": self.entry,
            "detail": self.text(),
        }


def differences(here: Mapping[str, str], entry: Mapping[str, Any]) -> list[Difference]:
    """The components of ``here`` that ``entry`` (an entry's ``components``) records otherwise,
    in :data:`COMPONENTS` order; one implied by another that differs is left out (another
    Triton version is another compiler identity)."""
    found = {
        name: Difference(name, value, _str_or_none(entry.get(name)))
        for name, value in here.items()
        if entry.get(name) != value
    }
    return [
        d
        for name, d in sorted(found.items(), key=lambda item: _order(item[0]))
        if not _IMPLIED.get(name, set()) & found.keys()
    ]


def _order(name: str) -> int:
    names = list(COMPONENTS)
    return names.index(name) if name in names else len(names)


def _str_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def recorded_components(meta: Mapping[str, Any]) -> dict[str, str] | None:
    """The components an entry records, or None (an entry of an earlier version)."""
    found = meta.get("components")
    if not isinstance(found, dict):
        return None
    return {k: v for k, v in found.items() if isinstance(k, str) and isinstance(v, str)}


def fallback_components(meta: Mapping[str, Any]) -> dict[str, str]:
    """What an entry without components still says about its key: target and Triton version."""
    out = {}
    if isinstance(meta.get("target"), str):
        out["target"] = meta["target"]
    producer = meta.get("producer")
    if isinstance(producer, dict) and isinstance(producer.get("triton"), str):
        out["triton"] = producer["triton"]
    return out


# -- explain ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Nearest:
    """The entry of the same kernel closest to a missed key."""

    key: str
    target: str | None
    layer: str  # "local" or "readonly"
    differences: tuple[Difference, ...]
    recorded: bool  # whether the entry records its components

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "target": self.target,
            "layer": self.layer,
            "components_recorded": self.recorded,
            "differences": [d.to_json() for d in self.differences],
        }

    def text(self) -> str:
        parts = [d.text() for d in self.differences]
        if not self.recorded:
            parts.append("components not recorded (an entry of an earlier version)")
        if not parts:
            parts.append("same components (its key differs in what no component names)")
        return "; ".join(parts)


@dataclass(frozen=True)
class Explained:
    """One specialization of a recorded call for one target: hit or miss, and why.

    For a hit, ``entry`` is the key of the entry a lowering uses, ``hops`` how many keys it
    is chained from the call's ``key`` (0: the entry under it), ``reads`` what each read of
    its read set finds (None: it records none) and ``partial`` why that read set is partial
    (then the IR decides). ``differs``: the entries a lowering finds and passes on the way,
    their reads finding something else now (for a miss too: why the entry under the key is
    not used)."""

    kernel: str
    target: str
    config: str
    status: str  # "hit", "miss", "left-out" or "problem"
    key: str | None = None
    layer: str | None = None
    nearest: Nearest | None = None
    notes: tuple[str, ...] = ()
    entry: str | None = None
    hops: int | None = None
    reads: tuple[lookups.Read, ...] | None = None
    partial: tuple[str, ...] = ()
    differs: tuple[lookups.Passed, ...] = ()
    lowerings: tuple[tuple[str, str], ...] = ()  # (key, layer) of each stored lowering

    def to_json(self) -> dict[str, Any]:
        return {
            "kernel": self.kernel,
            "target": self.target,
            "config": self.config,
            "status": self.status,
            "key": self.key,
            "layer": self.layer,
            "entry": self.entry,
            "hops": self.hops,
            "reads": lookups.reads_json(self.reads),
            "partial": list(self.partial),
            "differs": [p.to_json() for p in self.differs],
            "lowerings": [{"key": key, "layer": layer} for key, layer in self.lowerings],
            "nearest": None if self.nearest is None else self.nearest.to_json(),
            "notes": list(self.notes),
        }

    def line(self, reads: bool = False) -> str:
        """The explanation for a person; ``reads``: each read on a line of its own."""
        where = f"{self.kernel} {self.target}" + (f" ({self.config})" if self.config else "")
        if self.status == "hit":
            assert self.entry is not None and self.hops is not None
            text = (
                f"hit   {where}: {self.layer}, entry {self.entry[:16]} {lookups.where(self.hops)}"
            )
        elif self.status == "miss":
            if self.differs:
                why = "its reads find something else now"
            elif self.nearest is None:
                why = "no entry of this kernel in the cache"
            else:
                why = (
                    f"nearest entry {self.nearest.key[:16]} ({self.nearest.layer}"
                    f"{', ' + self.nearest.target if self.nearest.target else ''}): "
                    f"{self.nearest.text()}"
                )
            text = f"miss  {where}: {why}"
        else:
            text = f"{self.status:<5} {where}"
        said = lookups.lines(
            self.status == "hit", self.reads, self.partial, self.differs, every=reads
        )
        if self.lowerings:
            stored = ", ".join(f"{key[:16]} ({layer})" for key, layer in self.lowerings)
            said.append(
                f"embedded by stored lowerings {stored}: a warm lowering of a call stored so "
                "is served from one, its read sets checked as here, and looks up no kernel entry"
            )
        return "\n".join([text, *(f"      {n}" for n in (*said, *self.notes))])


@dataclass
class _Candidates:
    """The entries of the cache's layers by kernel name (one scan per layer)."""

    cache: Cache
    by_name: dict[str, list[tuple[Store, str, str]]] = field(default_factory=dict)
    #: the stored lowerings by kernel (``module:name``) and target
    lowered: dict[tuple[str, str], list[tuple[Store, str, str]]] = field(default_factory=dict)
    #: the read sets each stored lowering holds, by its key (read at the first ask)
    held: dict[str, frozenset[str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for index, store in enumerate(self.cache.layers):
            layer = "local" if index == 0 else "readonly"
            for e in scan(store.root, trust=store.trust).entries:
                if e.kind is None and e.kernel is not None:
                    self.by_name.setdefault(e.kernel, []).append((store, layer, e.key))
                elif e.kind == LOWERING.ext and e.qualname is not None and e.target is not None:
                    found = self.lowered.setdefault((e.qualname, e.target), [])
                    found.append((store, layer, e.key))

    def lowerings(self, spec: Specialization, reads: str | None) -> tuple[tuple[str, str], ...]:
        """The stored lowerings of ``spec``'s kernel and target that hold ``reads``, the read
        set of the entry its lookup uses (compared as data; a lowering that does not decode
        holds none). Each lowering is read once, whatever number of specializations ask."""
        if reads is None:
            return ()
        out = []
        for store, layer, key in self.lowered.get((spec.parts.qualname, str(spec.target)), ()):
            if key not in self.held:
                art = store.inspect(key, LOWERING.ext)
                lowered = decode(art.data) if isinstance(art, Artifact) else None
                self.held[key] = frozenset(lowered.reads) if lowered is not None else frozenset()
            if reads in self.held[key]:
                out.append((key, layer))
        return tuple(out)

    def nearest(self, spec: Specialization, here: Mapping[str, str]) -> Nearest | None:
        best: tuple[tuple[int, ...], Nearest] | None = None
        for store, layer, key in self.by_name.get(spec.parts.name, ()):
            art = store.inspect(key)
            if not isinstance(art, Artifact):
                continue
            meta = art.meta
            if meta.get("kernel") not in (None, spec.parts.qualname):
                continue  # another kernel of the same name
            recorded = recorded_components(meta)
            against = recorded if recorded is not None else fallback_components(meta)
            diffs = differences(
                here if recorded is not None else {k: here[k] for k in against}, against
            )
            target = meta.get("target") if isinstance(meta.get("target"), str) else None
            found = Nearest(key, target, layer, tuple(diffs), recorded is not None)
            rank = (recorded is None, len(diffs), target != str(spec.target), layer != "local")
            if best is None or rank < best[0]:
                best = (rank, found)
        return None if best is None else best[1]


def targets_of(call: RecordedCall, chosen: list[str]) -> tuple[list[Target], list[str]]:
    out: list[Target] = []
    bad: list[str] = []
    for name in chosen:
        try:
            target = parse_target(name)
        except TargetError as e:
            bad.append(f"recorded target {name!r:.40}: {e}")
            continue
        if target not in out:
            out.append(target)
    return out, bad


def explain(manifest: str, cache: Cache, targets: Sequence[str | Target] = ()) -> list[Explained]:
    """Explain every specialization of every call of ``manifest`` for ``targets`` (names, and
    patterns that select among the recorded ones: :func:`~bridge.vendors.targets.recorded_targets`;
    default: each call's recorded targets) against ``cache``.

    Raises:
        ManifestError: the manifest cannot be read or is not a manifest.
        TargetError: a target given is malformed, or a pattern matches no recorded target.
    """
    loaded = load_manifest(manifest)
    recorded = (t for call in loaded.calls for t in call.targets)
    choose = recorded_targets([str(t) for t in targets], recorded, manifest)
    candidates = _Candidates(cache)
    out: list[Explained] = []
    for failure in loaded.failures:
        out.append(
            Explained(failure.kernel or "(manifest)", "", "", "problem", notes=(failure.detail,))
        )
    for call in loaded.calls:
        wanted, bad = targets_of(call, choose(call.targets))
        for detail in bad:
            out.append(Explained(call.kernel, "", "", "problem", notes=(detail,)))
        try:
            parts = kernel_parts(call)
        except KernelArgumentError as e:
            for target in wanted:
                out.append(Explained(call.kernel, str(target), "", "problem", notes=(str(e),)))
            continue
        notes: tuple[str, ...] = ()
        if call.sources and source_digest(parts.fn) not in call.sources:
            notes = ("the kernel's source changed since the manifest was recorded",)
        for target in wanted:
            try:
                # keyed without the cache: its memos are not written
                specs = specializations(call, parts, target, None)  # type: ignore[arg-type]
            except Exception as e:  # the call does not fit the kernel/target: reported
                why = "does not fit the kernel" if isinstance(e, BridgeError) else "failed to bind"
                out.append(
                    Explained(
                        call.kernel,
                        str(target),
                        "",
                        "problem",
                        notes=(f"the recorded call {why}: {type(e).__name__}: {e}",),
                    )
                )
                continue
            for spec in specs:
                out.append(_one(call.kernel, spec, cache, candidates, notes))
    return out


def _one(
    kernel: str,
    spec: Specialization,
    cache: Cache,
    candidates: _Candidates,
    notes: tuple[str, ...],
) -> Explained:
    target, config = str(spec.target), spec.variant.description
    found = lookups.follow(spec, cache)
    if found.status == "hit":
        lowered = candidates.lowerings(spec, found.text)
        return Explained(
            kernel,
            target,
            config,
            "hit",
            spec.key,
            found.layer,
            notes=notes,
            entry=found.key,
            hops=found.hops,
            reads=found.reads,
            partial=found.partial,
            differs=found.passed,
            lowerings=lowered,
        )
    if found.status == "left-out":
        notes = (*notes, f"known not to compile: {found.note}")
        return Explained(
            kernel, target, config, "left-out", spec.key, notes=notes, differs=found.passed
        )
    if found.note is not None:
        notes = (*notes, found.note)
    nearest = None if found.passed else candidates.nearest(spec, components(spec))
    return Explained(
        kernel, target, config, "miss", spec.key, nearest=nearest, notes=notes, differs=found.passed
    )
