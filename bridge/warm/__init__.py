"""Warming: compile recorded specializations for any target, without a GPU and without the
program that recorded them.

A manifest (written by ``$KERNELCACHE_RECORD``, see :mod:`bridge.lowering.record` and docs/warm.md) holds
one record per lowered specialization. :func:`warm` groups its records into distinct calls
(kernel, abstract arguments, options), imports each kernel, and for every target does what a
lowering there does: rebuild the call with placeholder arrays, expand the autotune and heuristics
layers (every config), bind with Triton's binder and compute the kernel key. Keys already in the
cache are "present"; the others are compiled by a pool of worker processes into the writable
root, under exactly the keys a later lowering for that target computes, so that lowering is a
hit and runs no Triton compile.

Plan, then execute: the plan (keys, what is present, what cannot be warmed and why) is made in
this process without compiling anything; only the missing kernels go to the workers. A re-run
over a warm root therefore compiles nothing and starts no worker.

Across processes: workers publish through the cache (atomic, first writer wins, one builder per
key across every process sharing the root), so several warms, or a warm and running jobs, may
share a root at the same time.

A record whose kernel no longer exists, whose source text changed since it was recorded, or that
no longer fits the kernel is reported with the reason and makes the run fail; nothing stale can be
served, because the kernel key covers the kernel's source.

The parts: :mod:`.manifest` reads and validates the records and imports kernels; :mod:`.planning`
keys every call for every target (through :mod:`bridge.identity.specialize`, as a lowering does) and
finds what is present; :mod:`.pool` compiles the jobs in forked workers; :mod:`.outcomes` holds
what a run reports; :mod:`.warming` ties them into :func:`warm` (``kernelcache warm`` is
:mod:`bridge.cli.warm`).
"""

from __future__ import annotations

from ..exceptions import ManifestError, RootError
from .manifest import (
    Manifest,
    RecordedCall,
    import_kernel,
    load_manifest,
    read_manifest,
)
from .outcomes import KINDS, SCHEMA, WarmOutcome, WarmProblem, WarmReport
from .planning import Job, WarmPlan, make_plan, present, specializations
from .pool import can_fork, compile_job, default_workers, execute
from .warming import compile_manifest, compile_record, warm

__all__ = [
    "KINDS",
    "SCHEMA",
    "Job",
    "Manifest",
    "ManifestError",
    "RecordedCall",
    "RootError",
    "WarmOutcome",
    "WarmPlan",
    "WarmProblem",
    "WarmReport",
    "can_fork",
    "compile_job",
    "compile_manifest",
    "compile_record",
    "default_workers",
    "execute",
    "import_kernel",
    "load_manifest",
    "make_plan",
    "present",
    "read_manifest",
    "specializations",
    "warm",
]
