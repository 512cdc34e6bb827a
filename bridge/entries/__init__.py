"""The bridge's own cache entries: one module per kind of entry, each declaring its kind.

In: a key (a kernel key, a lowering key, a decision key) and what to store under it. Out: the
entry's extension, its derived key, its document (encoded and checked when read back) and the
counters and metadata it carries. Each module declares the kinds whose documents it owns
(``PTX = EntryKind("ptx", ...)`` in :mod:`.kernels`); :mod:`.kinds` is what a kind is
(:class:`~.kinds.EntryKind`: its extension, how its key is derived, how a lookup is counted, how
long a put waits, whether it is usually absent, and the verbs through which each of its entries
is stored and looked up) and the registry of every kind declared
(:func:`~.kinds.declared_kinds`); :mod:`.metadata` declares the metadata fields to kernelcache's
schema. Every other bridge module asks these modules for entries and never names an extension
itself.
"""
