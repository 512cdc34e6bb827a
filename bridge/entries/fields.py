"""What the bridge stores in an entry's metadata, declared to kernelcache's schema: each field's
type and range, and which of them the entry digest covers (everything a kernel is launched or
embedded with, so that a damaged value is a corrupt entry, never a wrong launch).

``components`` (the ingredients of the entry's key, see :func:`bridge.identity.keys.key_components`)
only explains misses: nothing is launched with it, so the digest does not cover it, and an entry
without it (written by an earlier version) is served all the same.
"""

from __future__ import annotations

import re
from typing import Any

from kernelcache import schema

from ..vendors.registry import parse_name

_U32 = (1 << 32) - 1
_SHA256 = re.compile(r"[0-9a-f]{64}")


def _target(value: Any) -> str | None:
    try:
        parse_name(value)
    except (ValueError, AttributeError, TypeError):
        return f"must be a target name such as cuda:90 or hip:gfx942, not {value!r:.40}"
    return None


def _components(value: Any) -> str | None:
    if not isinstance(value, dict) or len(value) > 32:
        return f"must be an object of at most 32 named components, not {value!r:.40}"
    for name, part in value.items():
        bad = schema.text(64)(name) or schema.text(128)(part)
        if bad:
            return f"must map component names to short strings ({name!r:.40}: {bad})"
    return None


#: the bridge's fields and what each must be
FIELDS: dict[str, schema.Check] = {
    "target": _target,
    "kernel": schema.text(1024),
    "language": schema.text(64),
    "arch": schema.text(64),
    "warp_size": schema.integer(1, 1024),
    "num_warps": schema.integer(1, 1024),
    "num_ctas": schema.integer(1, 1024),
    "num_stages": schema.integer(0, 1024),
    "shared": schema.integer(0, _U32),
    "global_scratch_size": schema.integer(0, _U32),
    "global_scratch_align": schema.power_of_two(1 << 20),
    "profile_scratch_size": schema.integer(0, _U32),
    "tmem_size": schema.integer(0, _U32),
    "tensordesc_meta": schema.objects(64),
    "ptx_sha256": schema.pattern(_SHA256, "64 lowercase hexadecimal digits"),
    "components": _components,
}
#: what a kernel is launched or embedded with (besides its name and target, which kernelcache
#: covers itself): covered by the entry digest
LAUNCH_FIELDS = frozenset(
    {
        "arch",
        "warp_size",
        "num_warps",
        "num_ctas",
        "shared",
        "global_scratch_size",
        "global_scratch_align",
        "profile_scratch_size",
        "tmem_size",
        "tensordesc_meta",
        "ptx_sha256",
    }
)
schema.register_fields(FIELDS, covered=LAUNCH_FIELDS)
