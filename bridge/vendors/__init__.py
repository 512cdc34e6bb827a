"""GPU vendors: everything that differs between NVIDIA and AMD, one object per vendor.

In: a vendor's name as a target spells it (``cuda``, ``hip``) or as JAX names a platform. Out: its
:class:`~.base.Vendor` object: target-name grammar, limits, the machine code it writes, what its
compiler identity hashes, how pointers are specialized and how machine code is embedded. A new
vendor is one module (like :mod:`.cuda` or :mod:`.hip`) and its line in :mod:`.registry`.
"""
