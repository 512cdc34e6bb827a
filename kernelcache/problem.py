"""Why an entry cannot be served: a value returned by readers and checks, never raised.

Every reader (a root, a remote value, a bundle member) reports a damaged, untrusted or outdated
entry as a :class:`Problem`; the caller decides what to do (quarantine, skip, rebuild).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    """Why an entry (in a root, a remote value or a bundle) cannot be served: a value returned,
    never raised. ``corrupt`` problems get the entry quarantined; ``untrusted`` ones (written or
    writable by users the trust policy excludes) are skipped; ``outdated`` ones (written by an
    older kernelcache) are misses, replaced by the next put."""

    key: str
    reason: str
    corrupt: bool = True
    untrusted: bool = False
    outdated: bool = False
    ext: str | None = None  #: the stored artifact's extension, where the metadata names one


__all__ = ["Problem"]
