"""The diagnosis behind ``kernelcache doctor``.

What enters: the settings, the roots and remote tiers they name, and the installed packages.
What leaves: a report of checks, each with a status and what to do, to which packages built on
kernelcache add their own contributions (:func:`register_report`). Diagnosing never changes a
root.
"""

from __future__ import annotations

from .checks import (
    LOW_FREE_BYTES,
    LOW_FREE_FRACTION,
    MIN_FILELOCK,
    NETWORK_FILESYSTEMS,
    PACKAGES,
    SHOWN_LOCK_WAITS,
    filelock_check,
    filesystem,
    readonly_checks,
    remote_checks,
    setting_checks,
    versions,
)
from .diagnose import diagnose
from .report import (
    Check,
    Contribution,
    Report,
    register_report,
)

__all__ = [
    "LOW_FREE_BYTES",
    "LOW_FREE_FRACTION",
    "MIN_FILELOCK",
    "NETWORK_FILESYSTEMS",
    "PACKAGES",
    "SHOWN_LOCK_WAITS",
    "Check",
    "Contribution",
    "Report",
    "diagnose",
    "filelock_check",
    "filesystem",
    "readonly_checks",
    "register_report",
    "remote_checks",
    "setting_checks",
    "versions",
]
