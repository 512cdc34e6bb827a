"""JAX's persistent compilation cache, beside the kernel cache.

In: where the kernel cache is (its root) and what the user set for JAX (``JAX_*`` variables,
``jax.config``). Out: JAX's cache turned on in this process (:mod:`.enable`,
``bridge.enable_jax_cache``), and JAX's directory as an operator sees it: its entries listed
and pruned the way JAX itself evicts (:mod:`.directory`), through ``kernelcache jax-cache`` and a
section of ``kernelcache doctor`` (:mod:`bridge.cli.jax_cache`). Only :mod:`.enable` imports jax, when it
is called: the command runs on a box with neither jax nor triton.
"""
