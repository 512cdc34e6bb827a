"""The bridge's own cache entries: one module per kind of entry, declared in one place.

In: a key (a kernel key, a lowering key, a decision key) and what to store under it. Out: the
entry's extension, its derived key, its document (encoded and checked when read back) and the
counters and metadata it carries. :mod:`.kinds` declares every kind of entry the bridge stores
(:class:`~.kinds.EntryKind`: its extension, how its key is derived, how a lookup is counted, how
long a put waits, whether it is usually absent) with the verbs through which each of its entries
is stored and looked up; :mod:`.metadata` declares the metadata fields to kernelcache's schema.
Every other bridge module asks these modules for entries and never names an extension itself.
"""
