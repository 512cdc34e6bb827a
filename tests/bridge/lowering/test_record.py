"""The record seam: appends from many processes are whole and deduplicated, a manifest's existing
lines are never written again, and kernels another process cannot import are recorded, marked and
reported once, never dropped."""

from __future__ import annotations

import fcntl
import importlib.util
import json
import logging
import os
import subprocess
import sys
import threading
import time

import pytest
from bridge_helpers import REPO
from support import child_env

from bridge.call import plain
from bridge.lowering import record
from bridge.warm import load_manifest

WRITER = """
import json, os, random, sys, time
from bridge.lowering import record

path, go, me = sys.argv[1], sys.argv[2], int(sys.argv[3])
pad = "x" * 9000  # lines longer than PIPE_BUF: only a single O_APPEND write keeps them whole
shared = [{"key": f"{i:064x}", "target": "cuda:90", "kernel": "m:k", "pad": pad} for i in range(30)]
own = [{"key": f"{1000 * (me + 1) + i:064x}", "target": "hip:gfx942", "kernel": "m:k", "pad": pad}
       for i in range(20)]
todo = shared + own + shared  # every shared record offered twice by every process
random.Random(me).shuffle(todo)
while not os.path.exists(go):
    time.sleep(0.005)
written = sum(record.append(path, rec) for rec in todo)
print(json.dumps({"written": written}))
"""


def test_concurrent_appends_are_whole_and_deduplicated(tmp_path):
    manifest, go = tmp_path / "manifest.jsonl", tmp_path / "go"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, str(manifest), str(go), str(i)],
            env=child_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(4)
    ]
    time.sleep(1.5)  # let every writer import and reach the start line
    go.touch()
    written = 0
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        written += json.loads(out)["written"]
    lines = manifest.read_bytes().split(b"\n")
    assert lines[-1] == b""
    recs = [json.loads(line) for line in lines[:-1]]  # every line parses: none torn or mixed
    idents = [(r["key"], r["target"]) for r in recs]  # one kernel path in this test
    assert len(idents) == len(set(idents)) == written == 30 + 4 * 20
    assert {k for k, t in idents if t == "cuda:90"} == {f"{i:064x}" for i in range(30)}


def _rec(i: int, target: str = "cuda:90") -> dict:
    return {"key": f"{i:064x}", "target": target, "kernel": "m:k", "version": 1}


def test_existing_lines_are_never_written_again(tmp_path, monkeypatch):
    manifest = tmp_path / "sub" / "manifest.jsonl"  # the directory is created
    assert record.append(manifest, _rec(1)) and record.append(manifest, _rec(2))
    assert not record.append(manifest, _rec(1))
    before = manifest.read_bytes()
    monkeypatch.setattr(record, "_files", {})  # as a fresh process sees it
    assert not record.append(manifest, _rec(2)) and not record.append(manifest, _rec(1))
    assert manifest.read_bytes() == before
    assert record.append(manifest, _rec(1, "hip:gfx942"))  # same key, another target
    # a file replaced under the same name is read again from its start
    replacement = tmp_path / "new.jsonl"
    replacement.write_text(json.dumps(_rec(2)) + "\n")
    os.replace(replacement, manifest)
    assert record.append(manifest, _rec(1)) and not record.append(manifest, _rec(2))
    assert [json.loads(x)["key"][-1] for x in manifest.read_text().splitlines()] == ["2", "1"]


def test_a_torn_line_stays_apart_and_is_reported(tmp_path):
    manifest = tmp_path / "manifest.jsonl"
    examples = (REPO / "examples" / "manifest.jsonl").read_text().splitlines()
    manifest.write_text(examples[0] + "\n" + examples[1][:50])  # a writer died mid-line
    assert record.append(manifest, json.loads(examples[1]))
    loaded = load_manifest(manifest)
    assert loaded.records == 2 and len(loaded.calls) == 2
    (bad,) = loaded.failures
    assert bad.kind == "bad-record" and bad.lines == (2,) and "not a JSON record" in bad.detail


def test_an_unwritable_record_file_warns_once_and_never_raises(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="bridge")
    target = tmp_path / "a-directory"
    target.mkdir()
    assert not record.append(target, _rec(1)) and not record.append(target, _rec(2))
    warnings = [r.getMessage() for r in caplog.records if "record file" in r.getMessage()]
    assert len(warnings) == 1 and str(target) in warnings[0]


def _complete(kernel: str, **fields) -> dict:
    return record.complete({"kernel": kernel, "target": "cuda:90", "arguments": {}, **fields})


def test_importable_kernels_carry_their_source_digest():
    from examples import kernels as K

    rec = _complete("examples.kernels:matmul_kernel")  # behind an autotune layer
    assert rec["importable"] is True and "problem" not in rec
    assert rec["source"] == plain.source_digest(K.matmul_kernel.fn)
    assert rec["producer"]["triton"] and rec["producer"]["kernelcache"]
    assert rec["version"] == record.RECORD_VERSION


def test_kernels_defined_in_a_function_are_marked_and_warned_once(caplog):
    caplog.set_level(logging.WARNING, logger="bridge")
    path = "examples.kernels:build.<locals>.kernel"
    first, second = _complete(path), _complete(path)
    assert first["importable"] is False and "inside a function" in first["problem"]
    assert second == first
    warned = [r.getMessage() for r in caplog.records if path in r.getMessage()]
    assert len(warned) == 1 and "define the kernel at module level" in warned[0]


def test_arguments_recorded_only_by_repr_are_reported(caplog):
    caplog.set_level(logging.WARNING, logger="bridge")
    rec = _complete("examples.kernels:scale_kernel", arguments={"scale": {"repr": "<object>"}})
    assert rec["importable"] is True and "scale" in rec["problem"] and "repr" in rec["problem"]
    assert any("cannot be warmed" in r.getMessage() for r in caplog.records)


def test_a_module_not_importable_from_sys_path_is_marked(tmp_path, monkeypatch):
    hidden = tmp_path / "kc_hidden_kernels.py"
    hidden.write_text(
        "import triton\n\n@triton.jit\ndef k(x_ptr):\n    pass\n",
    )
    spec = importlib.util.spec_from_file_location("kc_hidden_kernels", hidden)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "kc_hidden_kernels", module)
    spec.loader.exec_module(module)
    rec = _complete("kc_hidden_kernels:k")
    assert rec["importable"] is False and "PYTHONPATH" in rec["problem"]
    assert rec["source"] == plain.source_digest(module.k)  # still checkable if it is found later


@pytest.mark.parametrize(
    ("arguments", "target", "expected"),
    [
        ({"WARP_SIZE": 32, "BLOCK": 32}, "cuda:90", {"WARP_SIZE": "warp_size"}),
        ({"warp_size": 64}, "hip:gfx942", {"warp_size": "warp_size"}),
        ({"THREADS_PER_WARP": 32}, "hip:gfx1100", {"THREADS_PER_WARP": "warp_size"}),
        ({"WARP_SIZE": 32}, "hip:gfx942", {}),  # not the target's: replayed as recorded
        ({"WARP_SIZE": True, "TPW": 32}, "cuda:90", {}),
    ],
)
def test_warp_size_arguments_follow_the_target(arguments, target, expected):
    rec = record.complete(
        {"kernel": "examples.kernels:add_kernel", "target": target, "arguments": arguments}
    )
    assert rec["target_params"] == expected


# A script run as a file, and a module run with -m, both lowering a kernel of their own.
KERNEL_SOURCE = """
import jax, jax.numpy as jnp, triton, triton.language as tl
import bridge


@triton.jit
def twice(x_ptr, n, out_ptr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 2, mask=mask)


def lower(size):
    x = jax.ShapeDtypeStruct((size,), jnp.float32)
    fn = lambda x: bridge.triton_call(
        x, x.size, kernel=twice, out_shape=x, grid=(4,), BLOCK=1024, target="cuda:90"
    )
    jax.jit(fn).trace(x).lower(lowering_platforms=("cuda",))


if __name__ == "__main__":
    lower(4096)
    lower(8192)  # the same specialization: recorded once
    lower(1000)  # another one (n is not a multiple of 16): the warning is not repeated
"""


def test_kernels_of_scripts_are_recorded_marked_and_reported_by_warm(tmp_path):
    from cli_support import KERNELCACHE

    assert KERNELCACHE is not None, "install the project: pip install -e '.[bridge]'"
    manifest, root = tmp_path / "manifest.jsonl", tmp_path / "cache"
    (tmp_path / "script.py").write_text(KERNEL_SOURCE)
    (tmp_path / "kcpkg").mkdir()
    (tmp_path / "kcpkg" / "__init__.py").write_text("")
    (tmp_path / "kcpkg" / "job.py").write_text(KERNEL_SOURCE)
    env = child_env(KERNELCACHE_RECORD=str(manifest), KERNELCACHE_DIR=str(root))
    script = subprocess.run(
        [sys.executable, "script.py"], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert script.returncode == 0, script.stderr
    warnings = [line for line in script.stderr.splitlines() if "cannot be warmed" in line]
    assert len(warnings) == 1
    assert "__main__:twice" in warnings[0] and "move the kernel into a module" in warnings[0]
    module = subprocess.run(
        [sys.executable, "-m", "kcpkg.job"], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert module.returncode == 0, module.stderr
    assert "cannot be warmed" not in module.stderr
    recs = [json.loads(line) for line in manifest.read_text().splitlines()]
    assert [(r["kernel"], r["importable"]) for r in recs] == [
        ("__main__:twice", False),
        ("__main__:twice", False),
        ("kcpkg.job:twice", True),  # `python -m kcpkg.job`: importable under its real name
        ("kcpkg.job:twice", True),
    ]
    warm = subprocess.run(
        [
            KERNELCACHE,
            "--root",
            str(root),
            "warm",
            str(manifest),
            "--target",
            "hip:gfx942",
            "--json",
            "--jobs",
            "1",
        ],
        cwd=tmp_path,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert warm.returncode == 1, warm.stderr
    doc = json.loads(warm.stdout)
    assert doc["compiled"] == 2 and {r["kernel"] for r in doc["results"]} == {"kcpkg.job:twice"}
    (failure,) = doc["failures"]
    assert failure["kind"] == "not-importable" and failure["lines"] == [1, 2]
    assert "runs as __main__" in failure["detail"]


def test_a_manifest_locked_by_a_reader_delays_an_append_briefly(tmp_path):
    """Anyone who could open the manifest for reading could hold its flock: the job's
    lowering waited for ever."""
    path = tmp_path / "kernels.jsonl"
    path.write_text("")
    holder = os.open(path, os.O_RDONLY)
    fcntl.flock(holder, fcntl.LOCK_EX)
    done: list = []
    thread = threading.Thread(
        target=lambda: done.append(record.append(path, {"key": "1" * 64, "kernel": "m:k"})),
        daemon=True,
    )
    try:
        started = time.monotonic()
        thread.start()
        thread.join(30)
        assert done == [True], "still waiting for the lock"
        assert time.monotonic() - started < record.LOCK_WAIT + 5
    finally:
        os.close(holder)  # (lets a waiter go)
    assert [json.loads(line)["key"] for line in path.read_text().splitlines()] == ["1" * 64]


def test_a_sparse_terabyte_manifest_is_passed_over_not_read(tmp_path):
    """Reading what others appended took the whole file: a 1 TB sparse manifest raised
    MemoryError into the job's lowering."""
    path = tmp_path / "kernels.jsonl"
    path.write_text("")
    os.truncate(path, 1 << 40)
    assert record.append(path, {"key": "2" * 64, "kernel": "m:k"}) is True
    with open(path, "rb") as f:
        f.seek(1 << 40)
        assert json.loads(f.read())["key"] == "2" * 64
