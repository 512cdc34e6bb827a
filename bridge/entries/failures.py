"""Configs that cannot compile for their target, and how the cache remembers them.

Triton's autotuner leaves a config out when compiling or loading it raises one of
``CompileTimeAssertionFailure`` (a ``tl.static_assert`` that fails for this config),
``OutOfResources`` or ``PTXASError`` (Triton 3.6 to 3.9, both backends; the AMD backend raises
nothing more specific: its code generation errors are plain ``RuntimeError``). The bridge leaves
out the same ones, and one more: a compiler process that died
(:class:`~bridge.exceptions.CompilerCrash`), where Triton's autotuner dies with it. Any
other exception still fails the call. A compile whose output is cut short, or that ran out of
disk space (:class:`~bridge.exceptions.IncompleteOutput`, whatever the compiler raised underneath),
is the environment's failure: it fails the call and is never remembered.

Of those left out, a failure is remembered when the same compile would fail again: a compiler
process that crashed by itself (SIGABRT, SIGSEGV, ...) or exited is; a ptxas killed by a signal,
or a compiler process killed from outside (SIGKILL: out of memory), is left out of this call
only.

Such a failure is remembered as an entry keyed by the kernel key (``derived_key(key,
"failure")``, extension ``failure``, metadata ``kind: failure``): a JSON document with the
reason. It goes through tiers, bundles and prune like any entry. Read back, it is untrusted: a
document that is not exactly what :func:`remember` writes for that key is ignored (the kernel
is compiled again).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..exceptions import CompilerCrash, IncompleteOutput
from .kinds import EntryKind

if TYPE_CHECKING:
    from kernelcache import Cache

#: a kernel that cannot compile for its target
FAILURE = EntryKind("failure", role="failure", sparse=True)

logger = logging.getLogger(__name__)

FORMAT = 1
#: the longest reason kept (one line)
MAX_REASON = 500


def _one_line(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= MAX_REASON else line[: MAX_REASON - 3] + "..."


def reason_of(error: BaseException) -> str | None:
    """Why a config cannot compile, when ``error`` is what Triton's autotuner leaves a config
    out for (a static assertion, also one failing in a function the kernel calls; out of
    resources; ptxas failing) or a crash of the compiler process; else None."""
    from triton.compiler.errors import CompileTimeAssertionFailure
    from triton.runtime.errors import OutOfResources, PTXASError

    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, IncompleteOutput):  # the environment's failure, not the config's
            return None
        if isinstance(seen, CompilerCrash):
            return _one_line(seen.reason)
        if isinstance(seen, CompileTimeAssertionFailure):
            return _one_line(f"static assertion failed: {seen.error_message or ''}")
        if isinstance(seen, OutOfResources):
            return _one_line(str(seen))
        if isinstance(seen, PTXASError):
            lines = (seen.error_message or "").splitlines()
            said = [ln for ln in lines[1:] if "error" in ln.lower() or "fatal" in ln.lower()]
            return _one_line("; ".join(lines[:1] + said[:1]) or "ptxas failed")
        seen = seen.__cause__
    return None


def lasting(error: BaseException) -> bool:
    """Whether the failure will happen again for the same kernel key: not when ptxas was killed
    by a signal (a crash, or out of memory), nor when the compiler process was killed from
    outside (see :class:`~bridge.exceptions.CompilerCrash`); such a failure is not
    remembered."""
    from triton.runtime.errors import PTXASError

    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, CompilerCrash):
            return seen.lasting
        if isinstance(seen, PTXASError):
            return not re.search(r"SIGSEGV|error code -\d", seen.error_message or "")
        seen = seen.__cause__
    return True


def remembered(cache: Cache, key: str) -> str | None:
    """The reason the kernel ``key`` cannot compile, if the cache remembers one."""
    try:
        art = FAILURE.get(cache, key)
    except ValueError:
        return None
    if art is None:
        return None
    found = parse(art.data, key)
    if found is None:
        logger.debug("kernelcache: ignoring a malformed failure entry of %s", key)
    return found


def parse(data: bytes, key: str) -> str | None:
    """The reason in a failure document of kernel ``key``; None if it is not one."""
    if len(data) > 4 * MAX_REASON:
        return None
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError):
        return None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or doc.get("of") != key:
        return None
    reason = doc.get("reason")
    if not isinstance(reason, str) or not 0 < len(reason) <= MAX_REASON or "\n" in reason:
        return None
    return reason


def remember(cache: Cache, key: str, reason: str, about: Mapping[str, Any]) -> None:
    """Store that the kernel ``key`` cannot compile, and why. ``about`` adds metadata (kernel,
    name, target). A cache that cannot take it is logged, never raised."""
    from kernelcache import CacheError

    doc = {"format": FORMAT, "of": key, "reason": _one_line(reason)}
    meta = {**{k: v for k, v in about.items() if v is not None}, "kind": FAILURE.ext, "of": key}
    data = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    try:
        FAILURE.put(cache, key, data, meta)
    except (CacheError, ValueError) as e:
        logger.warning("kernelcache: cannot remember that %s does not compile: %s", key, e)
