"""The names of compile targets: ``cuda:<compute capability>`` and ``hip:<gfx arch>``.

The cache stores a target name in each kernel's metadata and operators filter by it; the bridge
compiles for it. Both read it with :func:`parse_target_name`, which needs neither jax nor
triton. Accepted spellings: ``cuda:90``, ``sm_90``, ``sm90a``, ``hip:gfx942``, ``rocm:gfx90a``,
``rocm:gfx90a:sramecc+:xnack-`` (feature suffixes are dropped); case-insensitive.
"""

from __future__ import annotations

import re

_CUDA = re.compile(r"(?:cuda|sm)[:_]?(\d{2,3})a?")
_HIP = re.compile(r"(?:hip|rocm)[:_]?(gfx[0-9a-f]{3,5})(?::[a-z0-9+:-]*)?")
#: the oldest compute capability Triton compiles for
MIN_COMPUTE_CAPABILITY = 50
EXAMPLES = "cuda:90, cuda:80, hip:gfx942, hip:gfx90a"


def parse_target_name(text: str) -> tuple[str, int | str]:
    """``(backend, arch)``: ``("cuda", 90)`` or ``("hip", "gfx942")``.

    Raises:
        ValueError: not a target name; the message shows valid examples.
    """
    value = text.strip().lower()
    m = _CUDA.fullmatch(value)
    if m:
        cc = int(m.group(1))
        if cc < MIN_COMPUTE_CAPABILITY:
            raise ValueError(
                f"target {text!r}: compute capability {cc} is older than Triton supports"
            )
        return "cuda", cc
    m = _HIP.fullmatch(value)
    if m:
        return "hip", m.group(1)
    raise ValueError(
        f"invalid target {text!r}: use cuda:<compute capability> or hip:<gfx arch>, e.g. {EXAMPLES}"
    )
