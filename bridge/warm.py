"""Compiling recorded specializations for any target, without the program that recorded them.

A record (see :mod:`bridge.record`) names the kernel by import path and holds the abstract call
and the variant. :func:`compile_record` rebuilds the call with placeholder arrays, binds it for
the requested target with Triton's binder, and fetches or compiles the kernel into the cache:
exactly the key a lowering for that target computes, so a later lowering there is a hit.
"""

from __future__ import annotations

import functools
import importlib
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from . import backends, binding, keys
from .artifacts import as_cache, entry_metadata, fetch
from .binding import ArgArray
from .compile import compile_source
from .errors import KernelArgumentError
from .kernels import decompose
from .targets import Target, parse_target


def import_kernel(path: str) -> Any:
    """The kernel object named ``module:qualname`` (the autotune/heuristics wrapper if any).

    Raises:
        KernelArgumentError: the module or name cannot be found (e.g. a kernel defined inside
            a function).
    """
    module_name, _, qualname = path.partition(":")
    if "<locals>" in qualname or not qualname:
        raise KernelArgumentError(f"{path} is not importable: define kernels at module level")
    try:
        obj: Any = importlib.import_module(module_name)
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as e:
        raise KernelArgumentError(f"cannot import the kernel {path}: {e}") from None
    return obj


def revive(value: Any, counter: list[int]) -> Any:
    """The inverse of :func:`bridge.record.plain` for what a call can contain."""
    if isinstance(value, list):
        return tuple(revive(v, counter) for v in value)
    if isinstance(value, dict):
        if "array" in value:
            counter[0] += 1
            return ArgArray(value["shape"], value["array"], ("in", counter[0] - 1))
        if "dtype" in value:
            import triton.language as tl

            return tl.dtype(value["dtype"])
        if "jit" in value:
            return import_kernel(value["jit"])
        raise KernelArgumentError(f"a recorded value cannot be rebuilt: {value}")
    return value


def compile_record(record: Mapping[str, Any], target: str | Target, cache: Any = None) -> str:
    """Fetch or compile the kernel of ``record`` for ``target``; returns its key.

    Raises:
        KernelArgumentError / OptionError: the record does not fit the kernel or the target.
    """
    tgt = parse_target(target)
    parts = decompose(import_kernel(record["kernel"]))
    counter = [0]
    named = {k: revive(v, counter) for k, v in record["arguments"].items()}
    variant = binding.Variant(
        kwargs={k: revive(v, counter) for k, v in record["variant"]["kwargs"].items()},
        options={k: revive(v, counter) for k, v in record["variant"]["options"].items()},
        description=record.get("config", ""),
    )
    backends.check_options(tgt, set(variant.options))
    backend = backends.make_backend(tgt)
    bound = binding.bind(parts, backend, named, variant)
    cache = as_cache(cache)
    src = keys.source(parts.fn, parts.is_gluon, bound.signature, bound.constexprs, bound.attrs)
    key = keys.kernel_key(cache, tgt, backend, src, bound.options, parts.language)
    fetch(
        cache,
        key,
        backend.binary_ext,
        build=functools.partial(compile_source, src, tgt, backend, bound.options),
        describe=entry_metadata(parts, tgt, bound),
        need_ptx=tgt.backend == "cuda",
    )
    return key


def read_manifest(path: str | Path) -> list[dict[str, Any]]:
    """The records of a ``$KERNELCACHE_RECORD`` file, one per distinct (kernel, call, variant)."""
    seen: dict[str, dict[str, Any]] = {}
    for line in Path(path).read_text().splitlines():
        if line.strip():
            rec = json.loads(line)
            ident = json.dumps([rec["kernel"], rec["arguments"], rec["variant"]], sort_keys=True)
            seen.setdefault(ident, rec)
    return list(seen.values())


def compile_manifest(
    path: str | Path, targets: Iterable[str | Target], cache: Any = None
) -> dict[str, list[str]]:
    """Compile every record of a manifest for every target; returns the keys per target."""
    records = read_manifest(path)
    return {str(parse_target(t)): [compile_record(r, t, cache) for r in records] for t in targets}
