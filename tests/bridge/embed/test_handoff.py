"""The ROCm "path" hand-off, with jaxlib's loader simulated.

There is no AMD GPU here: the loader of jaxlib >= 0.9.1 is simulated exactly as it behaves on
ROCm: read the file named in ``TritonKernel.ptx``, then delete it (before any lock). Real
concurrent processes lower the same kernel and then load at the same moment.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import subprocess
import sys
import tempfile

import jax
import jax.numpy as jnp
import pytest
from bridge_helpers import ELF_MAGIC, decoded, finish_children, run_child, start_child
from support import HELPERS, REPO, run_py

from bridge.embed import handoff
from examples import ops

F32 = jax.ShapeDtypeStruct((4096,), jnp.float32)

# Lower add for gfx942 by path, wait for every peer to have lowered, then load like jaxlib:
# read, delete. Also load through a naive shared path (what a stable path under the cache root
# without per-process hand-off would be), with process 0 loading first.
CHILD = (
    f"HELPERS = {str(HELPERS)!r}\n"
    + r"""
import json, os, sys, time
sys.path.insert(0, HELPERS)
index, peers, barrier = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
import jax, jax.numpy as jnp
from bridge_helpers import decoded, kernels_of
from examples import kernels as K
from examples import ops

def wait_for(name, count):
    deadline = time.time() + 120
    while len([f for f in os.listdir(barrier) if f.startswith(name)]) < count:
        if time.time() > deadline:
            raise SystemExit(f"barrier {name} timed out")
        time.sleep(0.01)

f32 = jax.ShapeDtypeStruct((4096,), jnp.float32)
lower = lambda: decoded(lambda x, y: ops.add(x, y, target="hip:gfx942", embed="path"), f32, f32,
                        platform="rocm")[0]
call = lower()
paths = {k.ptx for k in kernels_of(call)}
(path,) = paths
configs = len(call.autotuned_kernel_call.configs)

# the naive design: one shared file per kernel under the cache root, rewritten at lowering
naive = os.path.join(os.environ["KERNELCACHE_DIR"], "naive.hsaco")
with open(path, "rb") as f:
    data = f.read()
tmp = f"{naive}.{os.getpid()}"
with open(tmp, "wb") as f:
    f.write(data)
os.replace(tmp, naive)

open(os.path.join(barrier, f"lowered-{index}"), "w").close()
wait_for("lowered-", peers)
loaded = open(path, "rb").read()   # jaxlib: ReadFileToString(ptx)
os.unlink(path)                    # jaxlib: DeleteFile(ptx)

# naive: process 0 loads first, the others right after it
if index != 0:
    wait_for("naive-done-", 1)
try:
    with open(naive, "rb") as f:
        f.read()
    os.unlink(naive)
    naive_ok = True
except FileNotFoundError:
    naive_ok = False
if index == 0:
    open(os.path.join(barrier, "naive-done-0"), "w").close()

# a later lowering in the same process hands the file over again
again = lower()
relowered = os.path.exists(kernels_of(again)[0].ptx)
print(json.dumps({"path": path, "configs": configs, "elf": loaded[:4] == b"\x7fELF",
                  "size": len(loaded), "naive_ok": naive_ok, "relowered": relowered,
                  "real": os.path.realpath(os.path.dirname(path))}))
"""
)


def test_concurrent_processes_never_consume_each_others_file(tmp_path):
    root = tmp_path / "cache"
    # warm the kernel cache so the peers only lower
    decoded(
        lambda x, y: ops.add(x, y, target="hip:gfx942", embed="path", cache=str(root)),
        F32,
        F32,
        platform="rocm",
    )
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    peers = 4
    procs = [
        start_child(CHILD, str(i), str(peers), str(barrier), KERNELCACHE_DIR=str(root))
        for i in range(peers)
    ]
    results = finish_children(procs)
    # one path string in every process (so the opaque, and JAX's cache key, are identical) ...
    assert len({r["path"] for r in results}) == 1
    assert results[0]["path"].startswith(f"/proc/self/fd/{handoff.HANDOFF_FD}/")
    # ... resolving to a private directory per process
    assert len({r["real"] for r in results}) == peers
    # every simulated jaxlib load found its file and got the whole HSACO
    assert all(r["elf"] and r["size"] > 1000 for r in results)
    # the naive shared path loses the race for everyone but the first loader
    assert sum(r["naive_ok"] for r in results) == 1
    # one load per process: the call is an autotuned call, so jaxlib loads under its lock
    assert all(r["configs"] == 2 for r in results)
    assert all(r["relowered"] for r in results)
    # the private directories are gone when their processes exit
    mine = f"-{os.getpid()}-"
    left = [d for d in (root / handoff.HANDOFF_DIR).iterdir() if d.is_dir() and mine not in d.name]
    assert left == []


def test_path_mode_opaque_is_a_load_guarded_autotuned_call(tmp_path):
    (call,) = decoded(
        lambda x, y: ops.add(x, y, target="hip:gfx90a", embed="path", cache=str(tmp_path)),
        F32,
        F32,
        platform="rocm",
    )
    configs = call.autotuned_kernel_call.configs
    assert len(configs) == 2
    a, b = (c.kernel_call.kernel for c in configs)
    assert (a.kernel_name, a.shared_mem_bytes, a.ptx, a.compute_capability) == (
        b.kernel_name,
        b.shared_mem_bytes,
        b.ptx,
        b.compute_capability,
    )
    with open(a.ptx, "rb") as f:
        data = f.read()
    (entry,) = tmp_path.glob("*.hsaco")  # the path names the machine code, not its entry
    assert data[:4] == ELF_MAGIC and data == entry.read_bytes()
    assert os.path.basename(a.ptx) == hashlib.sha256(data).hexdigest() + ".hsaco"


FORK_CHILD = (
    f"HELPERS = {str(HELPERS)!r}\n"
    + r"""
import json, os, sys
sys.path.insert(0, HELPERS)
import jax, jax.numpy as jnp
from bridge_helpers import decoded, kernels_of
from examples import kernels as K
from examples import ops
f32 = jax.ShapeDtypeStruct((4096,), jnp.float32)
(call,) = decoded(lambda x, y: ops.add(x, y, target="hip:gfx942", embed="path"), f32, f32,
                  platform="rocm")
path = kernels_of(call)[0].ptx
parent_dir = os.path.realpath(os.path.dirname(path))
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    os.close(r)
    child_dir = os.path.realpath(os.path.dirname(path))
    data = open(path, "rb").read()   # the child loads (reads and deletes) its own copy
    os.unlink(path)
    os.write(w, json.dumps({"dir": child_dir, "elf": data[:4] == b"\x7fELF"}).encode())
    os._exit(0)
os.close(w)
child = json.loads(os.read(r, 10000).decode())
os.waitpid(pid, 0)
print(json.dumps({"parent_dir": parent_dir, "child": child, "parent_still_has_it": os.path.exists(path)}))
"""
)


def test_forked_child_gets_its_own_handoff_directory(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-c", FORK_CHILD],
        env={
            **os.environ,
            "KERNELCACHE_DIR": str(tmp_path),
            "PYTHONPATH": f"{REPO}:{os.environ.get('PYTHONPATH', '')}",
        },
        capture_output=True,
        text=True,
        cwd=str(REPO),
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr

    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["child"]["elf"]
    assert out["child"]["dir"] != out["parent_dir"]
    assert out["parent_still_has_it"]


def test_stale_directories_of_dead_processes_are_reaped(tmp_path):
    base = tmp_path / handoff.HANDOFF_DIR
    stale = base / f"{handoff.HOST}-999999-deadbeef"
    stale.mkdir(parents=True)
    (stale / "owner.lock").touch()
    (stale / "x.hsaco").write_bytes(b"old")
    handoff._reap(base)
    assert not stale.exists()


def test_directories_being_set_up_are_reaped_only_when_their_process_is_gone(tmp_path):
    base = tmp_path / handoff.HANDOFF_DIR
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    )
    dead = base / f".{handoff.HOST}-{gone.stdout.strip()}-deadbeef"
    mine = base / f".{handoff.HOST}-{os.getpid()}-0badf00d"
    for d in (dead, mine):
        d.mkdir(parents=True)
        (d / "owner.lock").touch()  # no lock held yet: being set up
    handoff._reap(base)
    assert not dead.exists()
    assert mine.exists()


# Set up and drop hand-off directories over and over, as processes starting side by side do;
# each set-up reaps first. Every directory must survive until its own process drops it.
SETUPS = r"""
import os, shutil, sys
from bridge.embed import handoff
root, rounds = sys.argv[1], int(sys.argv[2])
for _ in range(rounds):
    state = handoff._setup(root)
    handoff._write(state["dir_fd"], "k.hsaco", b"\x7fELF")  # fails if a peer reaped it
    assert handoff._leads_to(state["dir"], state["dir_fd"]), state["dir"]
    shutil.rmtree(state["dir"])  # then let go of it, as the owner does at exit
    os.close(state["dir_fd"])
    os.close(state["owner"])
print("{}")
"""


def test_processes_setting_up_side_by_side_never_reap_each_other(tmp_path):
    root = str(tmp_path / "cache")
    procs = [start_child(SETUPS, root, "300") for _ in range(6)]
    finish_children(procs, timeout=120)
    assert [d.name for d in (tmp_path / "cache" / handoff.HANDOFF_DIR).iterdir()] == []


def test_an_occupied_descriptor_falls_back_to_a_private_path(tmp_path, caplog):
    code = f"""
import json, os, sys
sys.path.insert(0, {str(HELPERS)!r})
fd = os.open(os.devnull, os.O_RDONLY)
os.dup2(fd, {handoff.HANDOFF_FD})
from bridge.embed import handoff
path = handoff.materialize({str(tmp_path)!r}, "k.hsaco", b"\\x7fELFdata")
print(json.dumps({{"path": path, "fd_is_devnull": os.path.samefile(f"/proc/self/fd/{handoff.HANDOFF_FD}", os.devnull)}}))
"""
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr

    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["fd_is_devnull"], "the descriptor someone else owned was clobbered"
    assert out["path"].startswith(str(tmp_path)) and "is in use" in proc.stderr


@pytest.fixture
def own_temp(tmp_path, monkeypatch):
    """A temp directory of the test's own, where a hand-off that the cache root cannot take
    makes its per-user directory (which outlives the process by design: shared by the user's
    processes)."""
    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    return temp


def test_an_unwritable_cache_root_hands_off_from_the_temp_directory(tmp_path, own_temp):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    handoff._cleanup()
    try:
        path = handoff.materialize(str(blocker / "root"), "k.hsaco", b"\x7fELF")
        with open(path, "rb") as f:
            assert f.read() == b"\x7fELF"
        private, _ = handoff.directory(str(blocker / "root"))
        assert private.startswith(str(own_temp))
    finally:
        handoff._cleanup()


def test_a_full_cache_root_hands_off_from_the_temp_directory(
    tmp_path, monkeypatch, caplog, own_temp
):
    root = tmp_path / "root"
    real_mkdir = os.mkdir

    def full(path, *args, **kwargs):  # the disk under the cache root is full
        if str(path).startswith(str(root / handoff.HANDOFF_DIR) + "/"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        return real_mkdir(path, *args, **kwargs)

    handoff._cleanup()
    monkeypatch.setattr(os, "mkdir", full)
    try:
        path = handoff.materialize(str(root), "k.hsaco", b"\x7fELF")
        with open(path, "rb") as f:
            assert f.read() == b"\x7fELF"
        private, _ = handoff.directory(str(root))
        assert not private.startswith(str(root))
        assert "cannot set up HSACO hand-off" in caplog.text
    finally:
        handoff._cleanup()


# A process hands a kernel off, then its cache root fills up, then it forks: the child's
# hand-off directory is set up under the temp directory instead, holding its own copy.
FORK_WHEN_FULL = r"""
import errno, json, os, sys
from bridge.embed import handoff
root = sys.argv[1]
handoff.materialize(root, "k.hsaco", b"\x7fELF")
parent, canonical = handoff.directory(root)
real_mkdir = os.mkdir
def full(path, *args, **kwargs):
    if str(path).startswith(os.path.join(root, handoff.HANDOFF_DIR) + "/"):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
    return real_mkdir(path, *args, **kwargs)
os.mkdir = full
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    seen = os.path.realpath(f"/proc/self/fd/{handoff.HANDOFF_FD}")
    mine = str(handoff._state.get("dir", ""))
    os.write(w, json.dumps([seen, mine, os.path.exists(os.path.join(seen, "k.hsaco"))]).encode())
    os._exit(0)
os.close(w)
seen, mine, copied = json.loads(os.read(r, 10000).decode())
os.waitpid(pid, 0)
print(json.dumps({"canonical": canonical, "seen": seen, "mine": os.path.realpath(mine),
                  "copied": copied, "parent_kept": os.path.exists(os.path.join(parent, "k.hsaco"))}))
"""


def test_a_child_forked_when_the_cache_root_is_full_gets_its_own_directory(tmp_path):
    root = tmp_path / "root"
    (tmp_path / "temp").mkdir()
    out = run_child(FORK_WHEN_FULL, str(root), TMPDIR=str(tmp_path / "temp"))
    assert out["canonical"]
    # the child's descriptor leads to its own directory, outside the full root, with its own
    # copy: loading there never consumes the parent's file
    assert out["seen"] == out["mine"] and not out["seen"].startswith(str(root))
    assert out["copied"] and out["parent_kept"]


# one process, two cache roots one after the other: the second gets the canonical path too
TWO_ROOTS = r"""
import json, os, sys
from bridge.embed import handoff
first, second = sys.argv[1], sys.argv[2]
handoff.materialize(first, "k.hsaco", b"\x7fELF")
a, a_canonical = handoff.directory(first)
path = handoff.materialize(second, "k.hsaco", b"\x7fELF2")
b, b_canonical = handoff.directory(second)
print(json.dumps({"canonical": [a_canonical, b_canonical], "path": path, "b": b,
                  "fd_dir": os.path.realpath(f"/proc/self/fd/{handoff.HANDOFF_FD}"),
                  "data": open(path, "rb").read().decode("latin-1"), "a_gone": not os.path.exists(a)}))
"""


def test_a_process_that_changes_cache_root_keeps_the_canonical_path(tmp_path):
    out = run_child(TWO_ROOTS, str(tmp_path / "a"), str(tmp_path / "b"))
    assert out["canonical"] == [True, True]
    assert out["path"] == f"/proc/self/fd/{handoff.HANDOFF_FD}/k.hsaco"
    assert out["fd_dir"] == os.path.realpath(out["b"])
    assert out["data"] == "\x7fELF2" and out["a_gone"]


@pytest.mark.parametrize("size", [0, 7])
def test_materialize_is_atomic_and_idempotent(tmp_path, size):
    data = b"\x7fELF" + b"x" * size
    path = handoff.materialize(str(tmp_path), "k.hsaco", data)
    with open(path, "rb") as f:
        assert f.read() == data
    os.unlink(path)
    again = handoff.materialize(str(tmp_path), "k.hsaco", data)
    assert again == path and open(again, "rb").read() == data
    private, _ = handoff.directory(str(tmp_path))
    assert sorted(os.listdir(private)) == ["k.hsaco", "owner.lock"]


PLANTED_AT_FORK = r"""
import os, sys
from bridge.embed import handoff
root, planted = sys.argv[1], sys.argv[2]
os.chmod(root, 0o2775)  # a group's root: any member may rename what is in it
good = b"GOOD-HSACO" * 10
path = handoff.materialize(root, "k.hsaco", good)
mine = handoff.directory(root)[0]
# a member renames .handoff and plants a directory of the job's directory's name
os.rename(os.path.join(root, ".handoff"), os.path.join(root, ".handoff-moved"))
os.makedirs(mine)
if planted == "bytes":
    with open(os.path.join(mine, "k.hsaco"), "wb") as f:
        f.write(b"EVIL-HSACO" * 10)
else:
    os.symlink("/dev/zero", os.path.join(mine, "k.hsaco"))
r, w = os.pipe()
pid = os.fork()
if pid == 0:  # what jaxlib reads in the child
    with open(path, "rb") as f:
        os.write(w, f.read(200))
    os._exit(0)
os.close(w)
data = os.read(r, 1000)
os.waitpid(pid, 0)
print(data == good)
"""


@pytest.mark.parametrize("planted", ["bytes", "link-to-dev-zero"])
def test_a_forked_child_copies_its_parents_files_never_what_is_at_their_path(tmp_path, planted):
    """The child copied its parent's directory by path: a member who renamed .handoff and
    planted a directory of that name had the child hand jaxlib the member's bytes, or copy
    /dev/zero for ever inside fork()."""
    done = run_py(PLANTED_AT_FORK, str(tmp_path), planted, timeout=60)
    assert done.stdout.split()[-1] == "True"
