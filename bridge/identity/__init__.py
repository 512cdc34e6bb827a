"""Identity: from a bound call to the keys that name its compiled kernels.

In: a kernel taken apart and bound for a target (:mod:`bridge.call`). Out: the kernel key of each
variant, computed without compiling (:mod:`.kernel_keys`, its ingredients listed once), from the
compiler's identity (:mod:`.compiler_identity`), the code's identity (:mod:`.jit`) and the options; the
specializations that carry those keys to the compile stage (:mod:`.specialize`); and values
described by content (:mod:`.exact_values`, :mod:`.namespaces`: also the namespace reads a check makes), which the read sets of
:mod:`bridge.readsets` are made of. The same call gives the same keys in every process with the
same software.
"""
