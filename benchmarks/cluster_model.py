"""What each process of ``cluster_job.py`` runs: the model it lowers through the cache (a
synthetic one, or the real bridge lowering Triton kernels), and the remote requests it sends,
counted where they leave the process (each Redis command as redis-py packs it; each object-store
request as obstore is asked for it), so that the count holds for any checkout on the path."""

from __future__ import annotations

import hashlib
import time
from collections import Counter
from typing import Any

#: variants per kernel of the model: 8 kernels, 13 variants
MODEL = (1, 1, 1, 1, 2, 2, 2, 3)
IDEAL = sum(MODEL)
#: the object-store operations counted, by obstore's function names
OBJECT_OPERATIONS = ("get", "get_range", "get_ranges", "head", "put", "delete", "list", "copy")


def keep_warnings() -> list[str]:
    """The warnings kernelcache logs in this process from now on (each cut to 300
    characters); the returned list fills as they are logged."""
    import logging

    warnings: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            warnings.append(record.getMessage()[:300])

    logging.getLogger("kernelcache").addHandler(Keep(logging.WARNING))
    return warnings


def count_requests() -> dict[str, Counter[str]]:
    """Count, from now on in this process, every Redis command (by name) and every
    object-store request (by operation); the returned counters fill as requests are made."""
    counts: dict[str, Counter[str]] = {"redis": Counter(), "objstore": Counter()}

    def count(tier: str, kind: str, _args: tuple[Any, ...]) -> None:
        counts[tier][kind] += 1

    watch_requests(count)
    return counts


def watch_requests(seen: Any) -> None:
    """Call ``seen(tier, kind, args)`` for every Redis command (tier "redis", kind its name,
    args what redis-py packs) and every object-store request (tier "objstore", kind its
    operation) this process makes from now on, in the thread that makes it."""
    try:
        import redis.connection as connection
    except ImportError:
        connection = None
    for name in ("PythonRespSerializer", "HiredisRespSerializer"):
        serializer = getattr(connection, name, None)
        if serializer is None:
            continue

        def pack(self: Any, *args: Any, _pack: Any = serializer.pack) -> Any:
            command = args[0].decode() if isinstance(args[0], bytes) else str(args[0])
            seen("redis", command.split()[0].upper(), args)
            return _pack(self, *args)

        serializer.pack = pack
    try:
        import obstore
    except ImportError:
        return
    for operation in OBJECT_OPERATIONS:
        call = getattr(obstore, operation, None)
        if call is None:
            continue

        def counted(*args: Any, _call: Any = call, _op: str = operation, **kw: Any) -> Any:
            seen("objstore", _op.split("_")[0].upper(), args)
            return _call(*args, **kw)

        setattr(obstore, operation, counted)


#: what a job's thread calls on a tier, each call timed (a release returned by a lock's try is
#: timed when it is called); a layered tier's lookup of a usually absent entry is timed as a
#: wait on the tier it asks
TIMED = ("get", "put", "put_outcome", "try_acquire", "acquire")


def tier_kind(tier: Any) -> str:
    """ "redis" or "objstore": the kind of a built-in tier, by its class."""
    return "objstore" if "ObjectStore" in type(tier).__name__ else "redis"


def time_tiers(remote: Any) -> dict[str, list[float]]:
    """Time, from now on in this process, what the job's (main) thread waits on each tier of
    ``remote`` (a tier, or layers of them): the seconds of each outermost call into a tier,
    by kind; the returned lists fill as calls are made. Calls of other threads (background
    copies, renewals) are not the job's waits and are not counted."""
    import threading

    waits: dict[str, list[float]] = {"redis": [], "objstore": []}
    inside = threading.local()

    def timed(fn: Any, kind: str) -> Any:
        def call(*args: Any, **kw: Any) -> Any:
            if threading.current_thread() is not threading.main_thread() or getattr(
                inside, "busy", False
            ):
                return fn(*args, **kw)
            inside.busy = True
            started = time.monotonic()
            try:
                out = fn(*args, **kw)
            finally:
                inside.busy = False
                waits[kind].append(time.monotonic() - started)
            return (
                timed(out, kind)
                if fn.__name__ in ("try_acquire", "acquire") and callable(out)
                else out
            )

        call.__name__ = getattr(fn, "__name__", "call")
        return call

    for tier in getattr(remote, "tiers", [remote]):
        for name in TIMED:
            method = getattr(tier, name, None)
            if callable(method):
                setattr(tier, name, timed(method, tier_kind(tier)))
    briefly = getattr(remote, "_briefly", None)
    if callable(briefly):  # a layered lookup of a usually absent entry: (tier, key, ext, ...)

        def sparse(tier: Any, *args: Any) -> Any:
            return timed(briefly, tier_kind(tier))(tier, *args)

        remote._briefly = sparse
    return waits


def variant_key(kernel: int, variant: int) -> str:
    return hashlib.sha256(f"cluster-job:{kernel}:{variant}".encode()).hexdigest()


def ptx_key(key: str) -> str:
    """The key of a variant's PTX (a companion entry, stored first), as the bridge on the
    worker's path derives it (a peer's own way)."""
    from bridge.entries.kinds import derived_key

    return derived_key(key, "ptx")


def binary_of(key: str) -> bytes:
    """A variant's binary: 64 KiB that do not compress (as a remote tier's zstd would find
    machine code about as dense), the same for a key in every process."""
    return hashlib.shake_256(key.encode()).digest(64 << 10)


def ptx_of(key: str) -> bytes:
    """A variant's PTX: 128 KiB of text (hex digits: it compresses about 2:1)."""
    return hashlib.shake_256(b"ptx:" + key.encode()).hexdigest(64 << 10).encode()


def lower_synthetic(cache: Any, cfg: dict[str, Any], *, prepare: bool = False, **_: Any) -> Any:
    """The model's kernels in order, each one ``get_or_create_each`` call over its variants;
    a compile sleeps, stores its PTX (a companion entry, :func:`ptx_of`), then returns the
    binary (:func:`binary_of`). Returns the
    digest of every binary, in order."""
    if prepare:
        return None
    import kernelcache

    binaries: dict[str, bytes] = {}

    def build(key: str) -> Any:
        def compile_variant() -> tuple[bytes, dict[str, Any]]:
            time.sleep(cfg["compile_s"])
            try:
                cache.put(  # (opaque text: a .ptx must define the kernel it names)
                    ptx_key(key), "txt", ptx_of(key), {"name": "ptx", "target": "cuda:90"}
                )
            except kernelcache.CacheError:
                pass  # as the bridge: a PTX that cannot be stored is not fatal
            return binary_of(key), {"name": "kernel", "target": "cuda:90"}

        return compile_variant

    for kernel, variants in enumerate(MODEL):
        keys = [variant_key(kernel, v) for v in range(variants)]
        items = [kernelcache.BuildItem(k, "bin", build(k)) for k in keys]
        for index, art in cache.get_or_create_each(items):
            if isinstance(art, Exception) or art.data != binary_of(keys[index]):
                raise SystemExit(f"wrong artifact for {keys[index]}: {art!r}")
            binaries[keys[index]] = art.data
    return hashlib.sha256(b"".join(binaries[k] for k in sorted(binaries))).hexdigest()[:16]


def lower_triton(
    cache: Any, cfg: dict[str, Any], *, prepare: bool = False, prepared: Any = None
) -> Any:
    """Lower a jitted step of 8 Triton kernel calls for cuda:90 (prepare: import, define and
    trace it, without lowering, so that the job's clock starts at the lowering); the digest
    of the lowered module's text."""
    if not prepare:
        text = prepared.lower(lowering_platforms=("cuda",)).as_text()
        return hashlib.sha256(text.encode()).hexdigest()[:16]
    import jax
    import jax.numpy as jnp
    import triton
    import triton.language as tl

    import bridge

    @triton.jit
    def axpy(x_ptr, y_ptr, n, o_ptr, ALPHA: tl.constexpr, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = i < n
        x, y = tl.load(x_ptr + i, mask=m), tl.load(y_ptr + i, mask=m)
        tl.store(o_ptr + i, x * ALPHA + y, mask=m)

    @triton.jit
    def relu(x_ptr, n, o_ptr, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = i < n
        tl.store(o_ptr + i, tl.maximum(tl.load(x_ptr + i, mask=m), 0.0), mask=m)

    @triton.jit
    def gap(x_ptr, y_ptr, n, o_ptr, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = i < n
        tl.store(o_ptr + i, tl.abs(tl.load(x_ptr + i, mask=m) - tl.load(y_ptr + i, mask=m)), m)

    @triton.jit
    def clip(x_ptr, n, o_ptr, LOW: tl.constexpr, HIGH: tl.constexpr, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = i < n
        tl.store(o_ptr + i, tl.clamp(tl.load(x_ptr + i, mask=m), LOW, HIGH), mask=m)

    two = [triton.Config({}, num_warps=w) for w in (2, 4)]

    @triton.autotune(configs=two, key=["cols"])
    @triton.jit
    def row_reduce(x_ptr, cols, o_ptr, BLOCK: tl.constexpr, MAX: tl.constexpr):
        row = tl.program_id(0)
        j = tl.arange(0, BLOCK)
        if MAX:
            x = tl.load(x_ptr + row * cols + j, mask=j < cols, other=float("-inf"))
            tl.store(o_ptr + row, tl.max(x, axis=0))
        else:
            x = tl.load(x_ptr + row * cols + j, mask=j < cols, other=0.0)
            tl.store(o_ptr + row, tl.sum(x, axis=0))

    @triton.autotune(configs=two, key=["cols"])
    @triton.jit
    def row_scale(x_ptr, cols, o_ptr, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        j = tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * cols + j, mask=j < cols, other=0.0)
        tl.store(o_ptr + row * cols + j, x / (tl.sum(tl.abs(x), axis=0) + 1.0), mask=j < cols)

    blocks = [triton.Config({"BM": bm, "BN": 32}, num_warps=4) for bm in (16, 32, 64)]

    @triton.autotune(configs=blocks, key=["size"])
    @triton.jit
    def matmul(a_ptr, b_ptr, size, c_ptr, BM: tl.constexpr, BN: tl.constexpr):
        rm = tl.program_id(0) * BM + tl.arange(0, BM)
        rn = tl.program_id(1) * BN + tl.arange(0, BN)
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for k in range(0, size, 16):
            rk = k + tl.arange(0, 16)
            a = tl.load(a_ptr + rm[:, None] * size + rk[None, :])
            b = tl.load(b_ptr + rk[:, None] * size + rn[None, :])
            acc += tl.dot(a, b)
        tl.store(c_ptr + rm[:, None] * size + rn[None, :], acc)

    n, rows, cols, size = 4096, 64, 128, 128
    flat = jax.ShapeDtypeStruct((n,), jnp.float32)
    column = jax.ShapeDtypeStruct((rows,), jnp.float32)
    table = jax.ShapeDtypeStruct((rows, cols), jnp.float32)
    square = jax.ShapeDtypeStruct((size, size), jnp.float16)
    out_square = jax.ShapeDtypeStruct((size, size), jnp.float32)

    def call(*args: Any, **kw: Any) -> Any:
        return bridge.triton_call(*args, target="cuda:90", cache=cache, **kw)

    def step(x: Any, y: Any, t: Any, a: Any) -> Any:
        grid = (n // 256,)
        out = call(x, y, n, kernel=axpy, out_shape=flat, grid=grid, ALPHA=2.0, BLOCK=256)
        out = call(out, n, kernel=relu, out_shape=flat, grid=grid, BLOCK=256)
        out = call(out, y, n, kernel=gap, out_shape=flat, grid=grid, BLOCK=256)
        out = call(out, n, kernel=clip, out_shape=flat, grid=grid, LOW=0.0, HIGH=4.0, BLOCK=256)
        rowwise = {"kernel": row_reduce, "out_shape": column, "grid": (rows,), "BLOCK": cols}
        sums = call(t, cols, MAX=False, **rowwise)
        maxes = call(t, cols, MAX=True, **rowwise)
        scaled = call(t, cols, kernel=row_scale, out_shape=table, grid=(rows,), BLOCK=cols)
        grid2 = lambda meta: (size // meta["BM"], size // meta["BN"])  # noqa: E731
        prod = call(a, a, size, kernel=matmul, out_shape=out_square, grid=grid2)
        return out, sums, maxes, scaled, prod

    specs = (flat, flat, table, square)
    return jax.jit(step).trace(*specs)
