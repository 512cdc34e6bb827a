"""What the bridge stores in an entry's metadata, declared to kernelcache's schema: each field's
type and range, and which of them the entry digest covers (everything a kernel is launched or
embedded with, so that a damaged value is a corrupt entry, never a wrong launch).
"""

from __future__ import annotations

import re
from typing import Any

from kernelcache import schema

from .vendors import parse_name

_U32 = (1 << 32) - 1
_SHA256 = re.compile(r"[0-9a-f]{64}")


def _target(value: Any) -> str | None:
    try:
        parse_name(value)
    except (ValueError, AttributeError, TypeError):
        return f"must be a target name such as cuda:90 or hip:gfx942, not {value!r:.40}"
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
