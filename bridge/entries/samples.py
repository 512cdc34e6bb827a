"""Samples: one config's screening, shared by the processes that make one autotune decision.

While a decision is missing in job mode, every rank waiting for it screens configs on its own
GPU; each screening is an entry (``derived_key(decision key, "sample:<index>")``, extension
``sample``, metadata ``kind: sample``) built through the cache's work stealing, so each config
is screened once per job, by whichever rank reaches it first, and a rank that dies leaves its
config to the others. The decision is then made from every sample (see
:mod:`bridge.tune.select`).

A sample is a small JSON document: the config's index and kernel key, the device kind, the
seconds per launch (or why it could not run), the launches per timing and in all, the seconds
spent and who measured (host and bus id). Read back it is untrusted: a document that is not a
sample of exactly that config on that device is measured again.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeGuard

from .decisions import is_duration
from .kinds import EntryKind

if TYPE_CHECKING:
    from kernelcache import Cache

#: one config's screening for a decision being made by several GPUs, by its index
SAMPLE = EntryKind("sample", role="sample:{}", sparse=True)

FORMAT = 1
#: the largest sample document read back, and its longest text
MAX_BYTES = 8192
MAX_TEXT = 1024


@dataclass(frozen=True)
class Sample:
    """The screening of one config: seconds per launch (None: it could not run, ``reason``
    says why), the launches per timing, the launches made, the seconds spent and who measured."""

    index: int
    time: float | None
    runs: int
    launches: int
    spent: float
    by: str
    reason: str | None = None


def encode(sample: Sample, variant: str, device: str) -> tuple[bytes, dict[str, Any]]:
    """The document and metadata of ``sample`` of the config with kernel key ``variant``."""
    doc = {
        "format": FORMAT,
        "index": sample.index,
        "variant": variant,
        "device": device,
        "time": sample.time,
        "runs": sample.runs,
        "launches": sample.launches,
        "spent": sample.spent,
        "by": sample.by[:MAX_TEXT],
        "reason": None if sample.reason is None else sample.reason[:MAX_TEXT],
    }
    data = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    return data, {"kind": SAMPLE.ext, "name": f"sample {sample.index}"}


def _count(value: Any) -> TypeGuard[int]:
    return type(value) is int and 0 <= value <= 1 << 40


def _text(value: Any) -> TypeGuard[str]:
    return isinstance(value, str) and 0 < len(value) <= MAX_TEXT


def parse(data: bytes, index: int, variant: str, device: str) -> Sample | str:
    """The sample in ``data`` if it is one of config ``index`` (kernel key ``variant``) on
    ``device``; else why not."""
    if len(data) > MAX_BYTES:
        return f"the sample is too large ({len(data):,} bytes)"
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError):
        return "the sample is not JSON"
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        return "the sample has an unknown format"
    if doc.get("index") != index or doc.get("variant") != variant or doc.get("device") != device:
        return "the sample is of another config or device"
    seconds, reason = doc.get("time"), doc.get("reason")
    if not (seconds is None or is_duration(seconds)) or not (reason is None or _text(reason)):
        return "the sample's time or reason is malformed"
    if (seconds is None) == (reason is None):
        return "the sample has both a time and a reason, or neither"
    runs, launches, spent, by = (doc.get(k) for k in ("runs", "launches", "spent", "by"))
    if not (_count(runs) and _count(launches) and is_duration(spent) and _text(by)):
        return "the sample's counts, seconds or measurer are malformed"
    if seconds is not None and not 1 <= int(runs) <= int(launches):
        return "the sample's launches do not add up"
    return Sample(index, seconds, int(runs), int(launches), float(spent), str(by), reason)


def gather(
    cache: Cache,
    decision: str,
    variants: Sequence[str],
    device: str,
    indices: Sequence[int],
    screen: Callable[[int], Sample],
) -> list[Sample]:
    """The samples of configs ``indices`` (of ``variants``) on ``device`` for the decision
    under key ``decision``: those already stored, and ``screen(i)`` for the others, each
    screened by one process at a time (see the module docstring)."""

    def build(i: int) -> Callable[[], tuple[bytes, dict[str, Any]]]:
        return lambda: encode(screen(i), variants[i], device)

    builds = [(i, build(i)) for i in indices]
    found: list[Sample] = []
    for (i, make), art in zip(
        builds, SAMPLE.get_or_create_many(cache, decision, builds), strict=True
    ):
        made = parse(art.data, i, variants[i], device)
        if isinstance(made, str):  # not a sample of this config: screened again, here
            art = SAMPLE.rebuild(cache, decision, make, stale=art, part=i)
            made = parse(art.data, i, variants[i], device)
        if isinstance(made, str):
            made = screen(i)
        found.append(made)
    return found
