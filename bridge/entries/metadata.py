"""What the bridge stores in an entry's metadata, declared to kernelcache's schema: each field's
type and range.

The launch metadata of a kernel (its name, target, warps, CTAs, shared memory, scratch sizes,
the TMA metadata of tensor descriptors, the PTX's digest: everything a kernel is launched or
embedded with) is part of kernelcache's on-disk format: kernelcache declares those fields
itself (:data:`kernelcache.schema.LAUNCH_CHECKS`), covers them by the entry digest
(:data:`kernelcache.schema.LAUNCH_FIELDS`) and requires those a machine-code entry cannot be launched without
(:data:`kernelcache.schema.REQUIRED`), whether or not the bridge is imported. The bridge
declares only what is its own: a stricter check of ``target`` (a target it knows), and the
fields that describe an entry without being launched with.

``components`` (the ingredients of the entry's key, see :func:`bridge.identity.kernel_keys.key_components`)
only explains misses: nothing is launched with it, so the digest does not cover it, and an entry
without it (written by an earlier version) is served all the same.
"""

from __future__ import annotations

from typing import Any

from kernelcache.plugin import FieldCheck, integer, register_fields, text

from ..vendors.vendor import parse_name
from .read_set_form import problem


def _target(value: Any) -> str | None:
    try:
        parse_name(value)
    except (ValueError, AttributeError, TypeError):
        return f"must be a target name such as cuda:90 or hip:gfx942, not {value!r:.40}"
    return None


def _reads(value: Any) -> str | None:
    """A read set's text, whole (:func:`.read_set_form.problem`: what a lookup checks
    before it makes any read, checked here at every door)."""
    bad = text(49 << 10)(value)
    if bad:
        return bad
    why = problem(value)
    return None if why is None else f"must be a read set: it {why}"[:200]


def _components(value: Any) -> str | None:
    if not isinstance(value, dict) or len(value) > 32:
        return f"must be an object of at most 32 named components, not {value!r:.40}"
    for name, part in value.items():
        bad = text(64)(name) or text(128)(part)
        if bad:
            return f"must map component names to short strings ({name!r:.40}: {bad})"
    return None


#: the bridge's own fields and what each must be (``target``: added to kernelcache's check)
FIELDS: dict[str, FieldCheck] = {
    "target": _target,
    "kernel": text(1024),
    "language": text(64),
    "num_stages": integer(0, 1024),
    "components": _components,
    "reads": _reads,
}
#: what a kernel is used on (the reads of its frontend, checked before it is launched): the
#: entry digest covers it
COVERED = frozenset({"reads"})
register_fields(FIELDS, covered=COVERED)
