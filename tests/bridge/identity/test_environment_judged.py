"""The compiler's environment, by evidence (bridge.identity.compiler_identity; docs/bridge.md,
"The compiler's environment, judged"): a variable that cannot change what the bridge compiles
splits no key.

Real processes share one root, as the ranks of a job or the runs of a pipeline do: a process
that sets a variable which only times, dumps or prints, that sets a boolean knob's variable to
its default, or that asks for Triton's override files (which the bridge does not apply) finds
the kernel a plain process compiled, under the same key, and compiles nothing; a variable that
changes code (``TRITON_DEBUG``, a boolean knob set against its default) still has a kernel of
its own. An LLVM pass plugin counts by the content of its file, not by its path.
"""

from __future__ import annotations

import json

import pytest
from bridge_helpers import kernel_source, run_child
from identity_targets import TARGETS
from support import HELPERS

#: variables that only time, dump or print (every one the installed Triton's native library
#: lists as cache-invalidating for that reason), with a value that turns each on
TIMING_AND_DUMPS = {
    "MLIR_ENABLE_TIMING": "1",
    "LLVM_ENABLE_TIMING": "1",
    "MLIR_ENABLE_DUMP": "1",
    "LLVM_IR_ENABLE_DUMP": "1",
    "NVPTX_ENABLE_DUMP": "1",
    "AMDGCN_ENABLE_DUMP": "1",
    "MLIR_ENABLE_DIAGNOSTICS": "warnings",
    "TRITON_ENABLE_LLVM_DEBUG": "1",
    "TRITON_LLVM_DEBUG_ONLY": "tritongpu-remove-layout-conversions",
    "MLIR_DISABLE_MULTITHREADING": "1",
}

CHILD = """
import hashlib, json, logging, os, sys
sys.path[:0] = [os.environ["JUDGED_SRC"], {tests!r}]
import jax, jax.numpy as jnp
import bridge
from bridge.compile import compiler
from bridge.lowering import proto
from bridge_helpers import custom_calls, kernels_of, lowered_module
from identity_targets import machine_ext, platform_of

class Kept(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []
    def emit(self, record):
        self.messages.append(record.getMessage())

kept = Kept()
logging.getLogger("bridge").addHandler(kept)
import j_env_k as mod
x = jax.ShapeDtypeStruct((4096,), jnp.float32)
root = os.environ["KERNELCACHE_DIR"]
out = {{}}
for target in json.loads(os.environ["KC_TARGETS"]):
    compiles, said = compiler.compile_count(), len(kept.messages)
    fn = lambda x: bridge.triton_call(
        x, x.size, kernel=mod.kernel, out_shape=x, grid=(4,), BLOCK=1024, target=target,
        embed="inline")
    (call,) = custom_calls(lowered_module(fn, x, platform=platform_of(target)))
    code = [k.module_image.object_file for k in kernels_of(proto.decode_opaque(call["opaque"]))]
    ext = "." + machine_ext(target)
    out[target] = {{
        "code": hashlib.sha256(b"".join(code)).hexdigest(),
        "compiles": compiler.compile_count() - compiles,
        "keys": sorted(n.split(".")[0] for n in os.listdir(root) if n.endswith(ext)),
        "warnings": kept.messages[said:],
    }}
print(json.dumps(out))
"""


@pytest.fixture
def child(runs, tmp_path):
    """Lower the kernel in a fresh process for every target (or ``targets``), with a cache
    root under the test's folder and variables set: for ``target``, the machine code it
    embeds, how many kernels it compiled, the kernel keys its root holds for the target
    afterwards, the warnings it logged while lowering for it. ``alone``: a process of this
    instance's own, for ``target`` alone (roots under its ``tmp_path``)."""
    src = runs.dir / "src"
    src.mkdir(exist_ok=True)
    (src / "j_env_k.py").write_text(kernel_source("", "tl.exp(x) * x + tl.sin(x)"))
    code = CHILD.format(tests=str(HELPERS))

    def run(
        root: str, target: str, targets: tuple[str, ...] = TARGETS, alone: bool = False, **env: str
    ) -> dict:
        if alone:
            only = json.dumps([target])
            where = str(tmp_path / root)
            found = run_child(
                code, KERNELCACHE_DIR=where, JUDGED_SRC=str(src), KC_TARGETS=only, **env
            )
        else:
            where = str(runs.dir / root)
            found = runs.child(
                code, KERNELCACHE_DIR=where, JUDGED_SRC=str(src), targets=targets, **env
            )
        return found[target]

    return run


@pytest.mark.parametrize("target", TARGETS)
def test_timing_and_dumps_share_one_compile_and_debug_does_not(child, target):
    """A process that times its compiles or dumps their IR finds the kernel a plain process
    compiled (the same key: its root holds no other), and a fresh root gets the same key
    from it; TRITON_DEBUG changes the code, so it still has a kernel of its own."""
    plain = child("R", target)
    assert plain["compiles"] == 1 and len(plain["keys"]) == 1
    timed = child("R", target, **TIMING_AND_DUMPS)
    assert (timed["code"], timed["compiles"], timed["keys"]) == (plain["code"], 0, plain["keys"])
    fresh = child("fresh", target, **TIMING_AND_DUMPS)
    assert (fresh["code"], fresh["keys"]) == (plain["code"], plain["keys"])
    debug = child("R", target, TRITON_DEBUG="1")
    assert debug["compiles"] == 1 and debug["code"] != plain["code"]
    assert len(debug["keys"]) == 2


def test_a_boolean_knob_at_its_default_is_no_setting(child):
    """``AMDGCN_USE_BUFFER_OPS=1`` is what Triton does unset (the knob's default is true): a
    hip:gfx942 kernel compiled with it has the key and the code of a plain process's; set
    against its default, the variable still counts. (AMD's knob: on gfx942 alone.)"""
    import triton

    assert vars(triton.knobs.amd_knobs)["use_buffer_ops"].default is True
    hip = {"target": "hip:gfx942", "targets": ("hip:gfx942",)}
    plain = child("R", **hip)
    assert plain["compiles"] == 1 and len(plain["keys"]) == 1
    for value in ("1", "true", "on"):
        at_default = child(f"at-{value}", **hip, AMDGCN_USE_BUFFER_OPS=value)
        assert (at_default["code"], at_default["keys"]) == (plain["code"], plain["keys"])
    off = child("off", **hip, AMDGCN_USE_BUFFER_OPS="0")
    assert off["compiles"] == 1 and off["keys"] != plain["keys"]


@pytest.mark.parametrize("target", TARGETS)
def test_kernel_override_is_not_applied_and_says_so(child, target):
    """The bridge runs Triton's stages itself and never reads override files: with
    TRITON_KERNEL_OVERRIDE set, a process finds the plain process's kernel and is told, once,
    that the variable is not applied. (A process of its own per target: the warning is said
    once per process.)"""
    plain = child("R", target, alone=True)
    override = child("R", target, alone=True, TRITON_KERNEL_OVERRIDE="1")
    assert (override["code"], override["compiles"], override["keys"]) == (
        plain["code"],
        0,
        plain["keys"],
    )
    (warning,) = [w for w in override["warnings"] if "TRITON_KERNEL_OVERRIDE" in w]
    assert "override files" in warning and "not apply" in warning
    assert not [w for w in plain["warnings"] if "TRITON_KERNEL_OVERRIDE" in w]


DIGEST_CHILD = """
import json
from bridge.identity import compiler_identity
print(json.dumps(compiler_identity.environment_digest(None)))
"""


def test_a_pass_plugin_counts_by_its_content(tmp_path):
    """LLVM_PASS_PLUGIN_PATH names a library LLVM loads into the compile: the environment a
    key holds differs where the file at that path has other content, and is the same again
    with the same content (another process, another path)."""

    def digest(path: str | None) -> str:
        env = {} if path is None else {"LLVM_PASS_PLUGIN_PATH": path}
        return run_child(DIGEST_CHILD, **env)

    plugin = tmp_path / "plugin.so"
    plugin.write_bytes(b"\x7fELF one plugin")
    first = digest(str(plugin))
    plugin.write_bytes(b"\x7fELF another plugin")
    second = digest(str(plugin))
    (tmp_path / "elsewhere").mkdir()
    copy = tmp_path / "elsewhere" / "plugin.so"
    copy.write_bytes(plugin.read_bytes())
    assert len({first, second, digest(None)}) == 3
    assert digest(str(copy)) == second == digest(str(plugin))


def test_the_native_list_is_judged(monkeypatch):
    """The native library reports every variable it lists that is set; those that only time,
    dump or print are left out of the environment, one that changes code is kept."""
    from triton._C.libtriton import get_cache_invalidating_env_vars

    from bridge.identity import compiler_identity

    plain = compiler_identity.environment_settings(None)
    for name, value in TIMING_AND_DUMPS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("DISABLE_MMA_V3", "1")
    reported = set(get_cache_invalidating_env_vars())
    assert reported >= {"MLIR_ENABLE_TIMING", "LLVM_ENABLE_TIMING", "MLIR_ENABLE_DUMP"}
    variables, knobs = compiler_identity.environment_settings(None)
    assert [n for n, _ in variables] == ["DISABLE_MMA_V3"] and knobs == plain[1]
