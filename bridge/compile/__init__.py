"""Compiling: from keyed specializations to machine code, fetched from the cache or compiled.

In: specializations (:mod:`bridge.identity.specialize`). Out: kernel binaries, with their PTX
on CUDA. :mod:`.fetch` is the one way in: it reads the cache and compiles on a miss, once across
the processes sharing the cache; :mod:`.compiler` runs Triton's stages in a forked compiler
process (:mod:`.compiler_process`); :mod:`.variants` holds an autotuned call's variants and those left out.
"""
