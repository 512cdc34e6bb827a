"""GPU vendors: everything that differs between NVIDIA and AMD, one object per vendor.

In: a vendor's name as a target spells it (``cuda``, ``hip``) or as JAX names a platform. Out: its
:class:`~.vendor.Vendor` object: target-name grammar, limits, the machine code it writes, what its
compiler identity hashes, how pointers are specialized and how machine code is embedded. A new
vendor is one module (like :mod:`.cuda` or :mod:`.hip`) that registers its object
(:func:`.vendor.register`), and its import below: every vendor is registered before any module
of this folder is used.

Beside the vendors: compile targets (``cuda:90``, ``hip:gfx942``) and how a lowering chooses one
(:mod:`.targets`), and Triton's vendor backends, imported only when a kernel needs one
(:mod:`.backends`).
"""

from . import cuda, hip  # noqa: F401  (each registers its vendor)
