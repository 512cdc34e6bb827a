"""The call: what a user's ``triton_call`` or ``@bridge.kernel`` call becomes before anything
is keyed.

In: a kernel object (``triton.jit``, autotune and heuristics layers, Gluon), its arguments in
either jax-triton convention (``out_shape=`` or ``out_type=``), tensor descriptors and the
traced arrays. Out: the kernel taken apart and the variants its layers make of the call
(:mod:`.kernel_objects`); the call traced (:mod:`.tracing`): its arguments as Triton values,
arrays as placeholders (:mod:`.placeholders`), its outputs placed by a convention
(:mod:`.conventions`), its buffers, and the JAX primitive that carries them to the lowering;
and each variant bound by Triton's own binder to a specialization, with its runtime arguments
as jaxlib passes them (:mod:`.binding`). Nothing here reads the cache or compiles.
"""
