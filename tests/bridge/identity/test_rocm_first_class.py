"""AMD as a first-class target (issue 77): what holds on cuda:90 holds on hip:gfx942 and
hip:gfx950, cross-compiled here, in fresh processes sharing a root.

- Kernels of the shapes real ROCm code has: a ``constexpr_function`` and a JIT helper that ask
  a dtype ``is_int()`` (a recurrent kernel keeping its state in the accumulator type), and an
  autotuned kernel doing the same, lowered for two dtypes (several specializations). Their read
  sets are partial (the IR decides): a second process builds nothing and lowers byte-identical
  modules, under the default embedding (PTX on CUDA, the hand-off path on ROCm, on a jaxlib that
  ignores ``module_image``) and inline.
- A read set made partial by a module's ``__getattr__``, and globals named by non-ASCII letters
  (a Greek alpha, and ``fix`` spelled with the ligature U+FB01, which Python normalizes to
  ``fix``): three processes, one compile in all, byte-identical modules.
- The hand-off path names the machine code (its SHA-256): a kernel served from a key chained
  from a stale entry's, and the same code served from its first key in another root, are handed
  over by one path, in one module.
- The IR decides for every backend's options: the options of each backend Triton ships (its
  defaults, and option sets programs pass) are recorded with a specialization and made again
  equal, so a partial read set can be checked on every vendor.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import pytest
import triton
import triton.language as tl
from bridge_helpers import run_child
from identity_targets import rocm_targets
from support import HELPERS

#: every target of this file: CUDA as it always was, and each ROCm architecture Triton has
ALL = ("cuda:90", *rocm_targets())
EMBEDS = ("default", "inline")

RECURRENT = '''
import triton
import triton.language as tl


@triton.constexpr_function
def state_dtype(dtype):
    """The type a recurrent state is kept in: int32 for integer inputs, float32 else."""
    return tl.int32 if dtype.is_int() else tl.float32


@triton.jit
def decay(c, x):
    if x.dtype.is_int():
        out = c + x
    else:
        out = c * 0.5 + x
    return out


@triton.jit
def recurrent(x_ptr, n, out_ptr, BLOCK: tl.constexpr, STEPS: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0).to(state_dtype(x_ptr.dtype.element_ty))
    c = tl.zeros([BLOCK], dtype=state_dtype(x_ptr.dtype.element_ty))
    for _ in tl.static_range(STEPS):
        c = decay(c, x)
    tl.store(out_ptr + offs, c.to(out_ptr.dtype.element_ty), mask=mask)


def call(bridge, x, **kw):
    return bridge.triton_call(
        x, x.size, kernel=recurrent, out_shape=x, grid=(4,), BLOCK=1024, STEPS=3, **kw
    )
'''
TUNED = """
import triton
import triton.language as tl
from rfc_recurrent import state_dtype


@triton.autotune(
    configs=[
        triton.Config({"BLOCK": 256}, num_warps=2),
        triton.Config({"BLOCK": 512}, num_warps=4),
    ],
    key=["n"],
)
@triton.jit
def top_scores(x_ptr, n, out_ptr, SCALE: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0)
    s = x.to(state_dtype(x.dtype)) * SCALE
    if x.dtype.is_int():
        s = s + 1
    tl.store(out_ptr + offs, s.to(out_ptr.dtype.element_ty), mask=mask)


def call(bridge, x, **kw):
    grid = lambda meta: (triton.cdiv(x.size, meta["BLOCK"]),)
    return bridge.triton_call(x, x.size, kernel=top_scores, out_shape=x, grid=grid, SCALE=2, **kw)
"""
ALPHA = "\N{GREEK SMALL LETTER ALPHA}"
#: ``fix`` as a compatibility character spells it (NFKC: ``fix``)
FIX = "\N{LATIN SMALL LIGATURE FI}x"
#: a kernel module (``{name}`` its kernel, ``{head}`` what it imports or defines, ``{body}``
#: what it stores)
SCALED = """
import triton
import triton.language as tl
{head}


@triton.jit
def {name}(x_ptr, n, out_ptr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, {body}, mask=mask)


def call(bridge, x, **kw):
    return bridge.triton_call(x, x.size, kernel={name}, out_shape=x, grid=(4,), BLOCK=1024, **kw)
"""
LAZY_CFG = """
import triton.language as tl


def __getattr__(name):
    if name == "SCALE":
        return tl.constexpr(2.0)
    raise AttributeError(name)
"""
FILES = {
    "rfc_recurrent": RECURRENT,
    "rfc_tuned": TUNED,
    "rfc_lazy_cfg": LAZY_CFG,
    "rfc_lazy": SCALED.format(
        name="lazy_scaled", head="import rfc_lazy_cfg as cfg", body="x * cfg.SCALE"
    ),
    "rfc_alpha": SCALED.format(
        name="alpha_scaled", head=f"{ALPHA} = tl.constexpr(2.0)", body=f"x * {ALPHA}"
    ),
    "rfc_fix": SCALED.format(
        name="fix_scaled", head=f"{FIX} = tl.constexpr(3.0)", body=f"x * {FIX}"
    ),
}
#: the calls each process lowers: case -> (module, dtype, kernel name)
REAL = {
    "dtype-is-int-float32": ("rfc_recurrent", "float32", "recurrent"),
    "dtype-is-int-int32": ("rfc_recurrent", "int32", "recurrent"),
    "autotuned-dtype-is-int-float32": ("rfc_tuned", "float32", "top_scores"),
    "autotuned-dtype-is-int-int32": ("rfc_tuned", "int32", "top_scores"),
}
NAMES = {
    "partial-through-a-module-getattr": ("rfc_lazy", "float32", "lazy_scaled"),
    "non-ascii-global": ("rfc_alpha", "float32", "alpha_scaled"),
    "compatibility-normalized-global": ("rfc_fix", "float32", "fix_scaled"),
}

CHILD = """
import hashlib, json, os, sys
sys.path[:0] = [os.environ["RFC_SRC"], {helpers!r}]
import jax, jax.numpy as jnp
import bridge, kernelcache
from bridge.compile import compiler
from bridge_helpers import lowered_module
from identity_targets import platform_of

cases = json.loads(os.environ["RFC_CASES"])
out = {{}}
for target in json.loads(os.environ["KC_TARGETS"]):
    compiles, builds = compiler.compile_count(), kernelcache.process_stats()["builds"]
    modules = {{}}
    for embed in ("default", "inline"):
        for name, (module, dtype, _) in cases.items():
            call = __import__(module).call
            x = jax.ShapeDtypeStruct((4096,), getattr(jnp, dtype))
            fn = lambda x: call(bridge, x, target=target, embed=None if embed == "default" else embed)
            text = lowered_module(fn, x, platform=platform_of(target)).as_text()
            modules[embed + ":" + name] = hashlib.sha256(text.encode()).hexdigest()
    out[target] = {{
        "modules": modules,
        "compiles": compiler.compile_count() - compiles,
        "builds": kernelcache.process_stats()["builds"] - builds,
    }}
print(json.dumps(out))
"""


def _write(src: Path, files: dict[str, str]) -> None:
    src.mkdir(parents=True, exist_ok=True)
    for module, text in files.items():
        (src / f"{module}.py").write_text(text, encoding="utf-8")


def _lower(src: Path, root: Path, cases: dict[str, Any], targets: tuple[str, ...]) -> dict:
    """A fresh process lowering every case for every target and embedding, with the cache at
    ``root``: by target, the digest of each lowered module (``embed:case``) and what it
    compiled and built."""
    return run_child(
        CHILD.format(helpers=str(HELPERS)),
        KERNELCACHE_DIR=str(root),
        PYTHONDONTWRITEBYTECODE="1",
        RFC_SRC=str(src),
        RFC_CASES=json.dumps(cases),
        KC_TARGETS=json.dumps(list(targets)),
    )


def _entries(root: Path, target: str) -> list[dict[str, Any]]:
    """The metadata of ``target``'s machine code entries under ``root``."""
    docs = [json.loads(p.read_text()) for p in root.glob("*.json")]
    return [d for d in docs if d.get("ext") in ("cubin", "hsaco") and d.get("target") == target]


@pytest.fixture(scope="module")
def shared(tmp_path_factory) -> dict[str, Any]:
    """Three fresh processes lowering every case for every target and embedding, one after the
    other, into one root: what each lowered, and the root."""
    base = tmp_path_factory.mktemp("rocm_first_class")
    _write(base / "src", FILES)
    root = base / "root"
    runs = [_lower(base / "src", root, {**REAL, **NAMES}, ALL) for _ in range(3)]
    return {"runs": runs, "root": root}


def _params(cases: dict[str, Any]) -> list[Any]:
    return [pytest.param(t, e, c, id=f"{t}-{e}-{c}") for c in cases for t in ALL for e in EMBEDS]


@pytest.mark.parametrize("target,embed,case", _params(REAL))
def test_real_code_shapes_a_second_process_builds_nothing(shared, target, embed, case):
    first, second = (run[target] for run in shared["runs"][:2])
    assert second["compiles"] == 0 and second["builds"] == 0, second
    assert second["modules"][f"{embed}:{case}"] == first["modules"][f"{embed}:{case}"]


@pytest.mark.parametrize("target,case", [(t, c) for c in REAL for t in ALL])
def test_real_code_shapes_are_decided_by_their_reads(shared, target, case):
    """A dtype's ``is_int`` is Triton's method of a value Triton describes exactly (in every
    key): the read sets of these kernels are whole, not partial (before, "a call of
    dtype.is_int not witnessed" left the IR to decide at every lookup); each specialization
    is one entry."""
    kernel = REAL[case][2]
    found = [d for d in _entries(shared["root"], target) if d.get("name") == kernel]
    specializations = 2 * (2 if kernel == "top_scores" else 1)  # (dtypes x configs)
    assert len(found) == specializations, [d["key"] for d in found]
    assert not any(json.loads(d["reads"])["partial"] for d in found)


@pytest.mark.parametrize("target,embed,case", _params(NAMES))
def test_partial_and_non_ascii_reads_compile_once_in_three_processes(shared, target, embed, case):
    runs = [run[target] for run in shared["runs"]]
    assert [r["compiles"] for r in runs[1:]] == [0, 0] and runs[0]["compiles"] > 0
    assert len({r["modules"][f"{embed}:{case}"] for r in runs}) == 1
    kernel = NAMES[case][2]
    assert len([d for d in _entries(shared["root"], target) if d.get("name") == kernel]) == 1


# -- the hand-off path: a chained key and a first key -------------------------------------------
CHAIN = SCALED.format(name="chained", head="import rfc_chain_cfg as cfg", body="x * cfg.SCALE")
CHAIN_CFG = "import triton.language as tl\n\nSCALE = tl.constexpr({scale})\n"
HANDOFF_CHILD = """
import hashlib, json, os, sys
sys.path[:0] = [os.environ["RFC_SRC"], {helpers!r}]
import jax, jax.numpy as jnp
import bridge
from bridge.compile import compiler
from bridge.lowering import proto
from bridge_helpers import custom_calls, kernels_of, lowered_module
import rfc_chain

out = {{}}
x = jax.ShapeDtypeStruct((4096,), jnp.float32)
for target in json.loads(os.environ["KC_TARGETS"]):
    compiles = compiler.compile_count()
    lowered = lowered_module(lambda x: rfc_chain.call(bridge, x, target=target, embed="path"), x,
                             platform="rocm")
    (call,) = custom_calls(lowered)
    paths = sorted({{k.ptx for k in kernels_of(proto.decode_opaque(call["opaque"]))}})
    out[target] = {{
        "paths": paths,
        "module": hashlib.sha256(lowered.as_text().encode()).hexdigest(),
        "compiles": compiler.compile_count() - compiles,
    }}
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def handoff(tmp_path_factory) -> dict[str, Any]:
    """The kernel lowered with ``embed="path"`` for each ROCm target by five fresh processes:
    SCALE 2 into root R; SCALE 9 from R (its entry stale: compiled, stored under the chained
    key); SCALE 9 into a fresh root F (stored under the first key); SCALE 9 from R again
    (served from the chained key) and from F again (served from the first key)."""
    base = tmp_path_factory.mktemp("rocm_handoff")
    src = base / "src"
    _write(src, {"rfc_chain": CHAIN})
    child = HANDOFF_CHILD.format(helpers=str(HELPERS))

    def run(root: str, scale: str) -> dict[str, Any]:
        _write(src, {"rfc_chain_cfg": CHAIN_CFG.format(scale=scale)})
        targets = json.dumps(list(rocm_targets()))
        env = {"PYTHONDONTWRITEBYTECODE": "1", "RFC_SRC": str(src), "KC_TARGETS": targets}
        return run_child(child, KERNELCACHE_DIR=str(base / root), **env)

    steps = [("R", "2.0"), ("R", "9.0"), ("F", "9.0"), ("R", "9.0"), ("F", "9.0")]
    return {"runs": [run(root, scale) for root, scale in steps], "base": base}


def _code(root: Path, target: str) -> dict[str, bytes]:
    """``target``'s machine code under ``root``, by entry key."""
    return {d["key"]: (root / f"{d['key']}.hsaco").read_bytes() for d in _entries(root, target)}


@pytest.mark.parametrize("target", rocm_targets())
def test_the_handoff_path_names_the_machine_code_whichever_key_served_it(handoff, target):
    from bridge.embed.handoff import HANDOFF_FD

    old, chained_built, first_built, chained, first = (run[target] for run in handoff["runs"])
    assert (chained["compiles"], first["compiles"]) == (0, 0), "served, not compiled"
    in_r, in_f = _code(handoff["base"] / "R", target), _code(handoff["base"] / "F", target)
    # R holds SCALE 2 under the first key and SCALE 9 under a key chained from it; F holds
    # SCALE 9 under the first key: the same machine code under two keys
    ((first_key, code),) = in_f.items()
    assert first_key in in_r and in_r[first_key] != code
    (chained_key,) = [k for k, data in in_r.items() if data == code]
    assert chained_key != first_key
    path = f"/proc/self/fd/{HANDOFF_FD}/{hashlib.sha256(code).hexdigest()}.hsaco"
    assert chained["paths"] == first["paths"] == chained_built["paths"] == [path]
    assert first_built["paths"] == [path] and old["paths"] != [path]
    assert chained["module"] == first["module"]
    assert os.path.basename(path) != f"{chained_key}.hsaco"


# -- the IR decides for every backend's options -------------------------------------------------
@triton.jit
def _specialized(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * 2.0, mask=offs < n)


#: for each backend Triton ships, targets and the options programs pass for them (none: the
#: backend's defaults); those of :data:`OPTIONAL` only where the installed Triton still has them
OPTION_SETS: dict[str, list[tuple[tuple[str, Any, int], dict[str, Any]]]] = {
    "nvidia": [
        (("cuda", 90, 32), {}),
        (("cuda", 90, 32), {"num_warps": 8, "num_stages": 3, "enable_fp_fusion": False}),
        (("cuda", 90, 32), {"maxnreg": 128, "num_warps": 4, "num_stages": 4}),
        (("cuda", 80, 32), {"num_warps": 2, "num_stages": 2, "debug": True}),
        (("cuda", 100, 32), {"num_ctas": 1, "maxnreg": 255}),
    ],
    "amd": [
        (("hip", "gfx942", 64), {}),
        (("hip", "gfx942", 64), {"num_warps": 8, "num_stages": 2, "enable_fp_fusion": False}),
        (("hip", "gfx942", 64), {"waves_per_eu": 2, "matrix_instr_nonkdim": 16, "kpack": 2}),
        (("hip", "gfx950", 64), {"matrix_instr_nonkdim": 32, "schedule_hint": "attention"}),
        (("hip", "gfx90a", 64), {"waves_per_eu": 1, "num_stages": 1}),
        (("hip", "gfx1100", 32), {"num_warps": 4}),
    ],
}
#: options Triton marks experimental or deprecated (``schedule_hint``; ``kpack`` from gfx950)
OPTIONAL = {"schedule_hint", "kpack"}


def _option_params() -> list[Any]:
    from triton.backends import backends

    unknown = sorted(set(backends) - set(OPTION_SETS))
    assert not unknown, f"Triton ships backends this test has no options for: {unknown}"
    return [
        pytest.param(name, target, given, id=f"{name}-{target[1]}-{i}")
        for name in sorted(backends)
        for i, (target, given) in enumerate(OPTION_SETS[name])
    ]


@pytest.mark.parametrize("backend,target,given", _option_params())
def test_every_backends_options_are_made_again_equal(backend, target, given):
    """``frontend.specialization`` records a specialization's options (the fields its
    constructor takes: ``option_fields``) and they make, through JSON as an entry holds them,
    options equal to the backend's own: for its defaults and for what programs pass."""
    import dataclasses

    from triton.backends import backends
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from bridge.identity import frontend

    compiler = backends[backend].compiler(GPUTarget(*target))
    fields = {f.name for f in dataclasses.fields(compiler.parse_options({}))}
    given = {k: v for k, v in given.items() if k in fields or k not in OPTIONAL}
    options = compiler.parse_options(given)
    assert {k: getattr(options, k) for k in given} == given  # (the options asked for)
    src = ASTSource(
        fn=_specialized,
        signature={"x_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"},
        constexprs={(2,): 1024},
        attrs={},
    )
    doc = frontend.specialization(src, options)
    assert doc is not None, f"{type(options).__name__} is not made again: the IR cannot decide"
    fields_made = json.loads(json.dumps(doc["options"]))
    assert [name for name, _ in fields_made] == [n for n, _ in frontend.option_fields(options)]
    assert frontend._options(type(options), fields_made) == options
