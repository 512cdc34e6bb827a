"""This machine's toolchain, behind ``kernelcache import --dry-run``.

:class:`Toolchain` judges entries without their kernel: whether this machine's keys could name
them at all (Triton version and build, pipeline, target, backend, environment). It is registered
with :mod:`kernelcache.toolchains` by the bridge's command plugin. Nothing here compiles or
changes the cache; finding the GPU (``find_gpu``) asks each registered vendor's platform.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..exceptions import BackendUnavailable, TargetError
from ..identity import compiler_identity
from ..identity.kernel_keys import text_digest
from ..vendors.targets import Target, parse_target
from ..vendors.vendor import registered
from .explain import differences, fallback_components, recorded_components

if TYPE_CHECKING:
    from kernelcache import Cache


class Toolchain:
    """This machine's toolchain as a lookup sees it: which entries its keys could name,
    judged from an entry's metadata alone (no kernel needed). ``target``: the one this
    machine compiles for, or None when it is not known (every target is judged possible)."""

    def __init__(self, target: Target | None, cache: Cache | None = None) -> None:
        from ..versions import triton_version

        self.target = target
        self._cache = cache
        self.here = {
            "pipeline": compiler_identity.PIPELINE_VERSION,
            "triton": triton_version(),
            "compiler": compiler_identity.triton_identity(cache),
            "environment": compiler_identity.environment_digest(cache),
        }
        self._backends: dict[str, str | None] = {}

    def describe(self) -> str:
        target = (
            str(self.target)
            if self.target
            else "KERNELCACHE_TARGET not set (and no GPU found), so entries of every target count"
        )
        return f"Triton {self.here['triton']}, {target}"

    def _backend(self, name: str) -> str | None:
        """The backend component for target ``name`` here; None: no backend for it."""
        if name not in self._backends:
            from ..vendors import backends

            try:
                target = parse_target(name)
                backend = backends.make_backend(target)
                self._backends[name] = text_digest(
                    compiler_identity.backend_identity(self._cache, target, backend)
                )
            except (TargetError, BackendUnavailable):
                self._backends[name] = None
        return self._backends[name]

    def _memo_keys(self, label: Any) -> set[str]:
        """The keys this installation memoizes the identity ``label`` under."""
        from ..entries.memos import memo_key

        if label == "triton_files":
            return {memo_key(label, compiler_identity.triton_fingerprint())}
        if label == compiler_identity.ENVIRONMENT_LABEL:
            return {memo_key(label, compiler_identity.environment_fingerprint())}
        if isinstance(label, str) and label.startswith("backend:"):
            try:
                target = parse_target(label.partition(":")[2])
            except TargetError:
                return set()
            fingerprint = target.vendor.backend_fingerprint(target.arch)
            return set() if fingerprint is None else {memo_key(label, fingerprint)}
        return set()

    def judge(self, meta: Mapping[str, Any]) -> str | None:
        """None if this machine's keys can name the entry ``meta``; else why not."""
        target = meta.get("target") if isinstance(meta.get("target"), str) else None
        if self.target is not None and target is not None and target != str(self.target):
            return f"target {target} (here {self.target})"
        kind = meta.get("kind")
        if kind == "identity":
            if meta.get("key") in self._memo_keys(meta.get("name")):
                return None
            return "memo of another installation's compiler identity (recomputed here)"
        if kind is not None:
            return None  # PTX, decisions, failures: looked up with their kernels
        recorded = recorded_components(meta)
        if recorded is None:
            entry = fallback_components(meta)
            if entry.get("triton") not in (None, self.here["triton"]):
                return f"Triton {entry['triton']} (here {self.here['triton']})"
            return None
        here = dict(self.here)
        if target is not None:
            backend = self._backend(target)
            if backend is None:
                return f"no Triton backend for {target} here"
            here["backend"] = backend
        diffs = differences(here, recorded)
        if not diffs:
            return None
        first = diffs[0]
        if first.component == "triton":
            return f"Triton {first.entry} (here {first.here})"
        return first.text()


def toolchain(find_gpu: bool = True) -> Toolchain:
    """This machine's toolchain: its target from ``$KERNELCACHE_TARGET``, else (with
    ``find_gpu``, which imports jax) its GPU."""
    from ..settings import setting_value
    from ..vendors.targets import detect

    explicit = setting_value("KERNELCACHE_TARGET")
    target: Target | None = None
    if explicit is not None:
        target = parse_target(explicit)
    elif find_gpu:
        for vendor in registered():
            found = detect(vendor.platform)
            if found:
                target = found[0]
                break
    return Toolchain(target)
