"""The call: what a user's ``triton_call`` or ``@bridge.kernel`` call becomes before anything
is keyed.

In: a kernel object (``triton.jit``, autotune and heuristics layers, Gluon), its arguments in
either jax-triton convention (``out_shape=`` or ``out_type=``), tensor descriptors and the
traced arrays. Out: the kernel taken apart (:mod:`.kernel_objects`), the arguments bound by
Triton's own binder to a specialization (:mod:`.binding`), with its runtime arguments as jaxlib
passes them (:mod:`.leaves`), the buffers and outputs of the traced call (:mod:`.tracing`,
:mod:`.conventions`) and the JAX primitive that carries them to the lowering
(:mod:`.primitive`). Nothing here reads the cache or compiles.
"""
