"""A call's variants made into jaxlib's config messages: each variant specialized (its kernel
key computed without compiling), its kernel taken from the cache when first asked for (compiled
only on a miss, once across processes), and the lowering assembled from those chosen.

Invariants: the variants are specialized once per lowering, in their order; a kernel is fetched
at most once per process for a key, target and cache root (:data:`FETCHED`), but by the audit
of a lowering hit (:mod:`bridge.compile.hit_audit`), which fetches its kernels again; the opaque
is byte-identical for the same call, target, software and embedding.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .. import versions
from ..call import kernel_objects
from ..call.tracing import CallSpec
from ..compile import variants
from ..entries import lowerings
from ..entries.lowerings import Lowered
from ..exceptions import KernelArgumentError
from ..identity import specialize
from ..tune import select
from ..vendors import targets
from . import messages, proto, record

if TYPE_CHECKING:
    from ..settings import BridgeSettings

#: kernels already fetched in this process: (key, target, cache root) -> the KernelBinary, or
#: why it cannot compile
FETCHED: variants.Memo = {}


class Configs:
    """The variants of a call specialized, with their kernels (compiled here or by another
    process when first asked), ready to become config messages."""

    def __init__(
        self,
        call: CallSpec,
        every_variant: list[kernel_objects.Variant],
        target: targets.Target,
        jaxlib: str,
        mode: str,
        cache: Any,
        device: Any,
        memo: variants.Memo | None = None,
    ) -> None:
        self.call, self.target, self.jaxlib, self.mode, self.cache = (
            call,
            target,
            jaxlib,
            mode,
            cache,
        )
        strict = len(every_variant) == 1  # (of several configs, one over a limit is left out)
        self.every = [
            specialize.specialize(call.parts, call.named, variant, target, cache, strict=strict)
            for variant in every_variant
        ]

        def usable(spec: specialize.Specialization) -> specialize.Usable | None:
            n = messages.host_descriptor_count(call, spec.bound, spec.target, jaxlib)
            name, target = call.parts.qualname, spec.target

            def ok(meta: Any) -> bool:  # (else compiled again: its own metadata is what counts)
                if n and messages.descriptor_meta(meta, n) is None:
                    return False
                return messages.launch_refusal(name, meta, target, jaxlib) is None

            return ok

        self.found = variants.Variants(
            self.every, cache, device=device, usable=usable, memo=FETCHED if memo is None else memo
        )

    def config(self, index: int) -> tuple[proto.Config, bool]:
        """Variant ``index``'s config message, and whether it needs a module image."""
        call, spec = self.call, self.every[index]
        bound = spec.bound
        n_desc = messages.host_descriptor_count(call, bound, self.target, self.jaxlib)
        kb = self.found.kernel(index)
        desc_meta = messages.descriptor_meta(kb.meta, n_desc) if n_desc else []
        if desc_meta is None:
            raise KernelArgumentError(
                f"{call.parts.qualname}: Triton compiled its {n_desc} tensor descriptor(s) for "
                f"{self.target} without TMA metadata; pass the arrays as pointers"
            )
        grid = kernel_objects.eval_grid(call.grid, bound.bound_args)
        kernel = messages.kernel_message(call, self.target, self.mode, kb, self.cache, self.jaxlib)
        kernel_call = messages.kernel_call(call, kernel, bound, desc_meta, grid)
        image = bool(n_desc) or kernel.global_scratch_size is not None
        return proto.Config(kernel_call=kernel_call, description=spec.variant.description), image

    def alone(self, index: int) -> bytes:
        """The opaque of variant ``index`` alone (what measuring it launches)."""
        one = messages.any_kernel_call(self.call, [self.config(index)[0]], self.mode)
        return proto.compress(proto.encode(one))


def assemble(
    call: CallSpec,
    every_variant: list[kernel_objects.Variant],
    target: targets.Target,
    platform: str,
    jaxlib: str,
    mode: str,
    cache: Any,
    autotune: str,
    device: Any,
    ours: BridgeSettings,
    memo: variants.Memo | None = None,
) -> tuple[Lowered, str, list[str]]:
    """Lower ``call`` from its kernels (``every_variant``: its variants, ``ours``: the
    bridge's settings; ``memo``: the kernels fetched before, default :data:`FETCHED`): the
    lowering, its state (see :mod:`bridge.entries.lowerings`) and the kernel keys of its
    variants."""
    configs: list[proto.Config] = []
    needs = versions.MODULE_IMAGE if mode == "inline" else (0,)
    made = Configs(call, every_variant, target, jaxlib, mode, cache, device, memo)
    every, found = made.every, made.found
    # the kernels select needs (every variant at once, compiled here or by another process)
    chosen = select.select(call, found, target, platform, cache, autotune, made.alone)
    for index in chosen:
        config, image = made.config(index)
        if image:
            needs = versions.MODULE_IMAGE
        configs.append(config)
    if call.choice is None and record.wanted(ours):  # every variant: a later tune measures them
        for spec in every:
            grid = kernel_objects.eval_grid(call.grid, spec.bound.bound_args)
            record.emit(record.build(call, target, spec.key, spec.bound, grid), ours)
    anycall = messages.any_kernel_call(call, configs, mode)
    opaque = proto.compress(proto.encode(anycall))
    reads = (made.found.kernel(i).meta.get("reads") for i in chosen)
    done = Lowered(
        opaque,
        mode,
        anycall.autotuned_kernel_call is not None,
        tuple(needs),
        tuple(dict.fromkeys(r for r in reads if isinstance(r, str))),
    )
    state = lowerings.EVERY if len(chosen) != 1 or len(every) == 1 else str(chosen[0])
    return done, state, [spec.key for spec in every]
