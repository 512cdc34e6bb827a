"""Tuning: choosing one variant of an autotuned call.

In: a call's variants with their kernels (:mod:`bridge.compile.variants`). Out: the chosen
variant, from a decision stored in the cache, from measuring on this GPU, or every variant for
jaxlib to autotune at run time (:mod:`.select`). Decisions themselves are entries
(:mod:`bridge.entries.decisions`).
"""
