"""Lowering: from a traced call with its kernels to jaxlib's Triton custom call.

In: the primitive's parameters (:mod:`bridge.call.tracing`), kernels fetched from the cache
(:mod:`bridge.compile.fetch`) and the tuning's choice. Out: the custom call's opaque message
(:mod:`.messages`; the wire format, its messages declared, in :mod:`.proto`; the machine code
embedded as :mod:`bridge.embed` says), assembled from the chosen variants
(:mod:`.configs`) and stored as a lowering entry so that a warm process replays it from one
read (:mod:`.lower`), and the record of each lowered call for
manifests (:mod:`.record`).
"""
