"""Read sets: what Triton's frontend read while it generated a kernel, recorded at each compile
and checked before a cached kernel or lowering is used again.

In: a JIT function and its keys (:mod:`bridge.identity`). Out: a read set recorded at a compile
(:mod:`.witness`, its hooks in the code generator :mod:`.frontend_hooks`, the code a call runs
:mod:`.guard` and :mod:`.reach`); its verdict now (:func:`.read_sets.stale`), from reads that
run no code of the program (:mod:`bridge.identity.namespaces`, :mod:`.static_access`); and the
one walk of a lookup over chained keys, with the door policy of a remote tier
(:func:`.read_sets.follow`, :func:`.read_sets.door`). The operations a read names are one table,
:data:`bridge.entries.metadata.OPS`.
"""
