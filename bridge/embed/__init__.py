"""Embedding: how a compiled kernel rides in jaxlib's Triton custom call.

In: a kernel's machine code (and its PTX on CUDA), its target and the jaxlib the module is lowered
for. Out: the embedding mode a call uses (:mod:`.modes`: inline machine code, PTX that jaxlib
assembles, or a file path), PTX rewritten for the ptxas jaxlib runs (:mod:`.ptxisa`: which PTX ISA
that ptxas assembles, found once per machine), and on ROCm with a jaxlib that takes code objects
by path only, the file jaxlib reads, handed over so that no process consumes another's
(:mod:`.handoff`). Nothing here compiles or looks a kernel up; the lowering
(:mod:`bridge.lowering`) calls it with what it fetched.
"""
