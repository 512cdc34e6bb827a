"""The bridge's own cache entries: one module per kind of entry, declared in one place.

In: a key (a kernel key, a lowering key, a decision key) and what to store under it. Out: the
entry's extension, its derived key, its document (encoded and checked when read back) and the
counters and metadata it carries. :mod:`.kinds` declares every extension the bridge stores and
the one function that derives a companion key; :mod:`.fields` declares the metadata fields to
kernelcache's schema. Every other bridge module asks these modules for entries and never names
an extension itself.
"""
