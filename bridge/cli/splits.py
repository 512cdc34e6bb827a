"""Why one call is lowered more than once: ``kernelcache explain --lowerings``.

Each stored lowering records the named steps its key is the digest of
(:data:`bridge.lowering.lowering_keys.STEPS`): the context every lowering of a setup shares
(:data:`~bridge.lowering.lowering_keys.CONTEXT_STEPS`: software, target, local device,
embedding), then the call's own (code, arguments, layout, ...). Lowerings of one kernel and
target whose call steps are the same but whose context differs are one call lowered apart, a
cache split: the ranks of a job that each see another device, two images with other jaxlibs.
:func:`splits` finds them and names the context steps that tell them apart, with their values
where short ("local device 'NVIDIA H100', 'NVIDIA H200'"); lowerings that differ in the call's
own steps are other calls, not a split.

Nothing is compiled, counted or changed: the layers are scanned once and each lowering's
metadata read without a trace (:func:`bridge.lowering.misses.stored_lowerings`). Linear in
entries.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..lowering.lowering_keys import CONTEXT_STEPS, STEPS, digested
from ..lowering.misses import stored_lowerings

if TYPE_CHECKING:
    from kernelcache import Cache

#: distinct values of a step shown by the text (the JSON has them all)
SHOWN = 4


@dataclass(frozen=True)
class Split:
    """One call of ``kernel`` for ``target`` stored as ``count`` lowerings, and the context
    steps (name, the distinct values recorded) that differ among them."""

    kernel: str
    target: str
    count: int
    steps: tuple[tuple[str, tuple[str, ...]], ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "kernel": self.kernel,
            "target": self.target,
            "lowerings": self.count,
            "steps": [{"step": n, "label": STEPS[n], "values": list(v)} for n, v in self.steps],
        }

    def line(self) -> str:
        said = []
        for name, values in self.steps:
            if any(digested(v) for v in values) or len(values) > SHOWN:
                said.append(f"{STEPS[name]} ({len(values)} values)")
            else:
                said.append(f"{STEPS[name]} ({', '.join(values)})")
        return (
            f"split {self.kernel} {self.target}: {self.count} lowerings of one call differ in "
            + "; ".join(said)
        )


@dataclass(frozen=True)
class Splits:
    """What :func:`splits` found: the splits, the lowering entries scanned (a lowering may be
    stored as several, one per state), and those that record no steps (written by an earlier
    version) or could not be read."""

    splits: tuple[Split, ...]
    entries: int
    unrecorded: int


def splits(cache: Cache) -> Splits:
    """The calls stored as several lowerings that differ in their context (see the module
    docstring), by kernel and target."""
    #: the contexts each call (kernel, target, its own steps) is stored under
    calls: dict[tuple[str, str, tuple[Any, ...]], set[tuple[str, ...]]] = {}
    found = stored_lowerings(cache)
    unrecorded = 0
    for kernel, target, steps in found:
        if not steps:
            unrecorded += 1
            continue
        own = tuple(str(steps.get(name)) for name in STEPS if name not in CONTEXT_STEPS)
        context = tuple(str(steps.get(name)) for name in CONTEXT_STEPS)
        calls.setdefault((kernel, target, own), set()).add(context)
    out = []
    for (kernel, target, _), contexts in sorted(calls.items(), key=lambda item: item[0][:2]):
        if len(contexts) < 2:  # (the entries of one lowering's states share their steps)
            continue
        differing = []
        for at, name in enumerate(CONTEXT_STEPS):
            values = sorted({context[at] for context in contexts})
            if len(values) > 1:
                differing.append((name, tuple(values)))
        out.append(Split(kernel, target, len(contexts), tuple(differing)))
    return Splits(tuple(out), len(found), unrecorded)
