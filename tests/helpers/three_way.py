"""The three-way attack on the cache: process 1 lowers version A of some code into root R,
process 2 lowers version B from R, process 3 lowers version B into a fresh root. A hit must be
what a compile gives, so process 2 must embed exactly what process 3 compiled (and, for the case
to be one, process 1 something else).

A case is the files of version A and those version B replaces (``site/`` names a file of the
installed tree, the user site of each child: ``PYTHONUSERBASE``; text, or bytes written as
they are), the kernel's module, the
call's keywords (Python text evaluated in that module), version B's variables and the Python it
runs before lowering. Cases with the same variables share child processes; each child lowers
every case for every target it is given (:data:`identity_targets.TARGETS`: one process start,
a lowering per target), and the results are keyed by target, then by case."""

from __future__ import annotations

import json
import os
import sys
import textwrap
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bridge_helpers import machine_code, run_child
from identity_targets import TARGETS
from support import HELPERS

SITE = f"lib/python{sys.version_info[0]}.{sys.version_info[1]}/site-packages"


@dataclass(frozen=True)
class Case:
    """Files of version A and those version B replaces, the kernel's module, the call's
    keywords, version B's variables and setup; ``same_stat``: version B's files keep the size
    and modification time of version A's (an edit that a file's identity cannot tell);
    ``shared_env``: the variables of both versions."""

    a: dict[str, str | bytes]
    b: dict[str, str | bytes]
    module: str
    params: str = ""
    env: dict[str, str] = field(default_factory=dict)
    setup: str = ""
    same_stat: bool = False
    #: variables of both versions (paths are formatted with ``{src}``, the modules' folder)
    shared_env: dict[str, str] = field(default_factory=dict)


CHILD = """
import hashlib, json, os, site, sys
sys.path[:0] = [os.environ["WITNESS_SRC"], site.getusersitepackages(), {tests!r}]
import jax, jax.numpy as jnp
import bridge, kernelcache
from bridge.lowering import proto
from bridge_helpers import custom_calls, kernels_of, lowered_module
from identity_targets import platform_of, target_params
cases = json.loads(os.environ.pop("WITNESS_CASES"))
targets = json.loads(os.environ.pop("WITNESS_TARGETS"))
x = jax.ShapeDtypeStruct((4096,), jnp.float32)
out = {{target: {{}} for target in targets}}
for name, (module, params, setup) in cases.items():
    exec(setup, {{}})
    mod = __import__(module, fromlist=["kernel"])
    kw = eval("dict(" + params + ")", vars(mod))
    for target in targets:
        fn = lambda x: bridge.triton_call(
            x, x.size, kernel=mod.kernel, out_shape=x, grid=(4,), BLOCK=1024, target=target,
            embed="inline", **target_params(mod.kernel, target), **kw)
        (call,) = custom_calls(lowered_module(fn, x, platform=platform_of(target)))
        code = kernels_of(proto.decode_opaque(call["opaque"]))
        assert [k.module_image.object_file for k in code]
        out[target][name] = hashlib.sha256(call["opaque"]).hexdigest()
print(json.dumps(out))
"""

#: what :func:`three_way` gives: per process (1, 2, 3), target -> case -> digest
Results = tuple[dict[str, dict[str, str]], ...]


def write(base: Path, files: Mapping[str, str | bytes], same_stat: bool = False) -> None:
    """Write ``files`` under ``base`` (``site/...`` into the user site, a module name into
    ``src``); ``same_stat``: each replaced file keeps its size and modification time."""
    for name, text in files.items():
        if name.startswith("site/"):
            path = base / "user" / SITE / name[len("site/") :]
        elif "." in name:  # (a data file beside the modules)
            path = base / "src" / name
        else:
            path = base / "src" / f"{name}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        data = text if isinstance(text, bytes) else textwrap.dedent(text).encode()
        before = os.stat(path) if same_stat else None
        path.write_bytes(data)
        if before is not None:
            assert before.st_size == len(data), f"{name}: version B must keep the size"
            os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))


def three_way(base: Path, cases: dict[str, Case], targets: tuple[str, ...] = TARGETS) -> Results:
    """The digest of the whole opaque each case embeds (its machine code, launch parameters
    and everything else a process runs) for each of ``targets``: process 1 (A into R), 2 (B
    from R), 3 (B into a fresh root); each keyed by target, then by case."""
    for c in cases.values():
        write(base, c.a)
    child = CHILD.format(tests=str(HELPERS))
    groups: dict[str, list[str]] = {}
    for name, c in cases.items():
        env = [sorted(c.env.items()), sorted(c.shared_env.items())]
        groups.setdefault(json.dumps(env), []).append(name)

    def run(root: Path, names: list[str], with_b: bool) -> dict[str, dict[str, str]]:
        todo = {
            n: [cases[n].module, cases[n].params, cases[n].setup if with_b else ""] for n in names
        }
        shared = cases[names[0]].shared_env
        env = {k: v.format(src=base / "src") for k, v in shared.items()}
        env.update(cases[names[0]].env if with_b else {})
        return run_child(
            child,
            KERNELCACHE_DIR=str(root),
            PYTHONDONTWRITEBYTECODE="1",
            PYTHONUSERBASE=str(base / "user"),
            WITNESS_SRC=str(base / "src"),
            WITNESS_CASES=json.dumps(todo),
            WITNESS_TARGETS=json.dumps(list(targets)),
            **env,
        )

    def merged(runs: list[dict[str, dict[str, str]]]) -> dict[str, dict[str, str]]:
        return {t: {n: d for r in runs for n, d in r[t].items()} for t in targets}

    first = merged([run(base / f"R{i}", names, False) for i, names in enumerate(groups.values())])
    for c in cases.values():
        write(base, c.b, c.same_stat)
    second, fresh = [], []
    for i, names in enumerate(groups.values()):
        second.append(run(base / f"R{i}", names, True))
        fresh.append(run(base / f"F{i}", names, True))
    return first, merged(second), merged(fresh)


def assert_second_gets_a_compile(results: Results, name: str, target: str) -> None:
    """Case ``name`` of :func:`three_way`'s ``results`` on ``target``: process 2 embeds what
    process 3 compiled, and process 1 something else (else the change is no case)."""
    first, second, fresh = (r[target] for r in results)
    assert first[name] != fresh[name], "the change does not change the kernel: not a case"
    assert second[name] == fresh[name], "process 2 embedded process 1's kernel"


def assert_warm_change(
    kernel: Any, tmp_path: Path, change: Callable[[], None], target: str = "cuda:90"
) -> None:
    """One process lowers ``kernel`` for ``target`` into a root twice (the same machine code),
    runs ``change()``, then lowers it again: what a fresh root compiles now, and a third time
    the same again from the cache (nothing compiled)."""
    from bridge.compile import compiler

    root = tmp_path / "root"
    before = machine_code(kernel, root, target=target)
    assert machine_code(kernel, root, target=target) == before
    change()
    after = machine_code(kernel, root, target=target)
    assert after != before
    assert machine_code(kernel, tmp_path / "fresh", target=target) == after
    compiles = compiler.compile_count()
    assert machine_code(kernel, root, target=target) == after
    assert compiler.compile_count() == compiles
