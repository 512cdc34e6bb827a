"""A forged read set, through every door: whoever may write a shared root, a read-only layer, a
Redis tier or an S3 bucket (keyless, or signed with the reader's own key), or hand over a
bundle, may edit the ``reads`` of an entry (its digests made valid). A victim process that
lowers the kernel from there runs none of the program's code the forged rows name and gets the
kernel a compile of its code gives; a forged read set past what a check of one entry does is
refused at the door, and no copy of it is kept.

The program is a trap: its property and the ``__getattr__`` of its object and of its class
print ``TRAP:<what>`` when they run (print: the kernel stays one the bridge describes
exactly, so its read set is what a lookup checks). The forged read set passes the schema (the
door lets it in), names what the kernel reads and spells, then calls ``os.system`` through
the module's ``os``: a check reads and compares and never calls, so nothing of it runs, and
its reads do not find what it says they found, so the entry is another version's, passed by
the lookup (the victim compiles). Every door is tried on each target (the kernel compiled for
it).
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from bridge_helpers import forget_lowerings, forget_programs
from cli_support import kc
from identity_targets import each_target, machine_ext
from object_store import moto_available, s3_env
from redis_server import REDIS_SERVER, SKIP_REASON, RedisServer
from support import HELPERS, child_env

TRAP = """
import os
import triton
import triton.language as tl


def trip(what):
    print("TRAP:" + what)


class Meta(type):
    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        trip("metaclass-getattr")
        return 1.0


class Reg(metaclass=Meta):
    SCALE = 2.0


class Trap:
    @property
    def boom(self):
        trip("property")
        return 1.0

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        trip("getattr")
        return 1.0


TRAPPED = Trap()


@triton.jit
def kernel(x_ptr, n, out_ptr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask) * 2.0
    if BLOCK < 0:  # (never taken: the names are spelled, never read by the frontend)
        t, r = TRAPPED, Reg  # (locals: no finder of names reads them)
        x = x * t.boom * t.missing * r.absent
    tl.store(out_ptr + offs, x, mask=mask)
"""
#: the victim: lowers the kernel for a target (its cache as the environment says) and prints the
#: digest of the machine code it embeds
CHILD = """
import hashlib, json, sys
sys.path[:0] = [sys.argv[1], {helpers!r}]
import jax, jax.numpy as jnp
import bridge
from bridge.lowering import proto
from bridge_helpers import custom_calls, kernels_of, lowered_module
from identity_targets import platform_of
import doors_trap
target = sys.argv[2]
x = jax.ShapeDtypeStruct((4096,), jnp.float32)
fn = lambda x: bridge.triton_call(x, x.size, kernel=doors_trap.kernel, out_shape=x, grid=(4,),
                                  BLOCK=1024, target=target, embed="inline")
(call,) = custom_calls(lowered_module(fn, x, platform=platform_of(target)))
code = [k.module_image.object_file for k in kernels_of(proto.decode_opaque(call["opaque"]))]
from bridge.compile import compiler
digest = hashlib.sha256(b"".join(code)).hexdigest()
print(json.dumps({{"code": digest, "compiles": compiler.compile_count()}}))
"""
#: what marks the forged read set (a note of its own, which the schema lets through)
FORGED_MARK = "forged-by-an-attacker"
KEY = "a-signing-key-of-the-fleet-0123456789"


def _lower(src: Path, target: str, **env: str) -> tuple[str, list[str], int]:
    """Run the victim for ``target``: the digest of its machine code, the trap lines it
    printed, and how many kernels it compiled."""
    child = textwrap.dedent(CHILD.format(helpers=str(HELPERS)))
    proc = subprocess.run(
        [sys.executable, "-c", child, str(src), target],
        env=child_env(PYTHONDONTWRITEBYTECODE="1", **env),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, f"the victim failed\n{proc.stdout}\n{proc.stderr}"
    lines = proc.stdout.strip().splitlines()
    trapped = [line for line in lines if line.startswith("TRAP:")]
    done = json.loads(lines[-1])
    return done["code"], trapped, done["compiles"]


def _forged_reads(text: str) -> str:
    """The read set ``text`` with rows that name what the trap reads and spells, then a call of
    ``os.system`` (what a forger who read the entry writes)."""
    doc = json.loads(text)
    rows = [r for r in doc["rows"] if r[1] != "ir"]
    n = len(rows)
    rows += [
        [-1, "g", "TRAPPED", "x"],
        [n, "a", "boom", "x"],
        [n, "a", "missing", "x"],
        [-1, "g", "Reg", "x"],
        [n + 3, "a", "absent", "x"],
        [-1, "g", "os", "x"],
        [n + 5, "a", "system", "x"],
        [n + 6, "c", [[["v", ["s", "echo TRAP:os-system"]]], []], "x"],
    ]
    doc["rows"], doc["partial"] = rows, [FORGED_MARK]
    return json.dumps(doc)


def _forge(root: Path) -> None:
    """Edit the reads of the kernel entry in ``root``, its entry digest made valid; forget the
    lowerings (so that a lookup reaches the kernel entry)."""
    from bridge.entries.metadata import problem
    from kernelcache.schema.document import entry_digest

    forget_lowerings(root)
    forget_programs(root)
    (path,) = [p for p in root.glob("*.json") if "reads" in json.loads(p.read_text())]
    doc = json.loads(path.read_text())
    doc["reads"] = _forged_reads(doc["reads"])
    assert problem(doc["reads"]) is None, "the forged read set must pass the door"
    doc["entry_digest"] = entry_digest(doc)
    path.write_text(json.dumps(doc))


def _copies(root: Path) -> list[str]:
    """Every file under ``root``, set aside ones included, that holds the forged read set: a
    victim keeps no copy of an entry it refused at its door."""
    if not root.exists():
        return []
    return [
        str(p) for p in root.rglob("*") if p.is_file() and FORGED_MARK.encode() in p.read_bytes()
    ]


@pytest.fixture(scope="module", params=each_target())
def made(tmp_path_factory, request) -> dict[str, Any]:
    """The trap's source, a root its kernel was compiled into for a target (each test runs on
    each; then forged), and the machine code a compile gives."""
    base = tmp_path_factory.mktemp("doors")
    src = base / "src"
    src.mkdir()
    (src / "doors_trap.py").write_text(textwrap.dedent(TRAP))
    clean = base / "clean"
    code, said, _ = _lower(src, request.param, KERNELCACHE_DIR=str(clean))
    assert said == []
    return {"src": src, "clean": clean, "code": code, "base": base, "target": request.param}


def _copy_forged(made: dict[str, Any], where: Path) -> Path:
    import shutil

    shutil.copytree(made["clean"], where)
    _forge(where)
    return where


def _upload(root: Path, url: str, key: str | None) -> None:
    """Put every entry of ``root`` into the remote tier ``url`` as it is (signed with ``key``)."""
    code = f"""
import os, sys
import kernelcache
from kernelcache.store import Store
root = {str(root)!r}
upload = kernelcache.Cache(root={str(root) + "-upload"!r}, remote={url!r})
for name in sorted(os.listdir(root)):
    if name.endswith(".json"):
        key, ext = name[: -len(".json")], None
        for other in os.listdir(root):
            if other.startswith(key + ".") and not other.endswith(".json"):
                ext = other[len(key) + 1 :]
        if ext is None:
            continue
        art = Store(root).read(key, ext)
        meta = {{k: v for k, v in art.meta.items() if k not in ("format", "key", "ext", "size",
                "digest", "created", "entry_digest", "hmac")}}
        upload.put(key, ext, art.data, meta)
upload.close() if hasattr(upload, "close") else None
"""
    env = child_env(**({"KERNELCACHE_SIGNING_KEY": key} if key else {}))
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def _victim(made: dict[str, Any], where: Path, **env: str) -> None:
    """Lower the kernel twice in victims: the first passes the forged entry (a compile: its
    reads do not find what they say), the second uses what the first compiled; neither runs
    code of the program, both embed what a compile gives."""
    code, said, compiles = _lower(made["src"], made["target"], **env)
    assert said == [], f"the forged read set ran code of the program: {said}"
    assert code == made["code"], "the victim embedded another kernel than a compile gives"
    assert compiles == 1, "the forged entry was used as it is, or never reached the victim"
    code, said, compiles = _lower(made["src"], made["target"], **env)
    assert (code, said, compiles) == (made["code"], [], 0)


def test_a_forged_local_root(made, tmp_path):
    root = _copy_forged(made, tmp_path / "shared")
    _victim(made, root, KERNELCACHE_DIR=str(root))


def _forge_lowerings(root: Path, ext: str, many: bool = False, beside: bool = False) -> int:
    """Edit the read sets inside every stored lowering (``ext`` "lowering") or program entry
    (``ext`` "program") of ``root``, their digests made valid (``many``: each held 300 times,
    more than a check of one entry makes; ``beside``: a program entry keeps each true item
    and holds a forged one beside it, under the same key); forget the other kind. Returns how
    many were forged."""
    times = 300 if many else 1

    from bridge.entries import lowerings
    from kernelcache.schema.document import digest, entry_digest

    if ext == "lowering":
        forget_programs(root)
    forged = 0
    for path in root.glob(f"*.{ext}"):
        data = path.read_bytes()
        if ext == "lowering":
            done = lowerings.decode(data)
            data = lowerings.encode(
                done._replace(reads=tuple(_forged_reads(r) for r in done.reads) * times)
            )
        else:
            items = lowerings.decode_program(data)
            forgeries = [
                item._replace(
                    lowered=item.lowered._replace(
                        reads=tuple(_forged_reads(r) for r in item.lowered.reads) * times
                    ),
                )
                for item in items
            ]
            data = lowerings.encode_program([*items, *forgeries] if beside else forgeries)
        meta_path = path.with_suffix(".json")
        doc = json.loads(meta_path.read_text())
        doc["size"], doc["digest"] = len(data), digest(data)
        doc["entry_digest"] = entry_digest(doc)
        path.write_bytes(data)
        meta_path.write_text(json.dumps(doc))
        forged += 1
    return forged


@pytest.mark.parametrize("ext", ["lowering", "program"])
def test_a_forged_stored_lowering_is_passed(made, tmp_path, ext):
    """A stored lowering (or a program entry) holds its kernels' read sets: forged, it is not
    used and no code it names runs (its kernel entry, intact, serves the lowering)."""
    import shutil

    root = tmp_path / "shared"
    shutil.copytree(made["clean"], root)
    assert _forge_lowerings(root, ext) >= 1
    code, said, compiles = _lower(made["src"], made["target"], KERNELCACHE_DIR=str(root))
    assert (code, said, compiles) == (made["code"], [], 0)


def test_a_forged_read_only_layer(made, tmp_path):
    layer = _copy_forged(made, tmp_path / "layer")
    own = tmp_path / "own"
    _victim(made, own, KERNELCACHE_DIR=str(own), KERNELCACHE_READONLY_DIRS=str(layer))
    assert _copies(own) == []


@pytest.fixture
def redis_url(tmp_path) -> Iterator[str]:
    server = RedisServer(tmp_path / "redis").start()
    try:
        yield server.url
    finally:
        server.stop()


@pytest.mark.skipif(REDIS_SERVER is None, reason=SKIP_REASON)
@pytest.mark.parametrize("key", [None, KEY], ids=["keyless", "signed-with-the-readers-key"])
def test_a_forged_redis_tier(made, tmp_path, redis_url, key):
    _upload(_copy_forged(made, tmp_path / "forged"), redis_url, key)
    own = tmp_path / "own"
    env = {"KERNELCACHE_DIR": str(own), "KERNELCACHE_REMOTE": redis_url}
    _victim(made, own, **env, **({"KERNELCACHE_SIGNING_KEY": key} if key else {}))


@pytest.mark.skipif(not moto_available(), reason="moto and obstore (the s3 extra) are needed")
def test_a_forged_s3_bucket(made, tmp_path):
    from object_store import MotoS3

    with s3_env(), MotoS3() as server:
        url = server.bucket("forged")
        _upload(_copy_forged(made, tmp_path / "forged"), url, None)
        own = tmp_path / "own"
        _victim(made, own, KERNELCACHE_DIR=str(own), KERNELCACHE_REMOTE=url)


@pytest.mark.parametrize("key", [None, KEY], ids=["unsigned", "signed-with-the-readers-key"])
def test_a_forged_bundle(made, tmp_path, key):
    forged = _copy_forged(made, tmp_path / "forged")
    env = {"KERNELCACHE_SIGNING_KEY": key} if key else {}
    bundle = tmp_path / "kernels.tar"
    assert kc(forged, "export", str(bundle), env=env).returncode == 0
    own = tmp_path / "own"
    done = kc(own, "import", str(bundle), env=env)
    assert done.returncode in (0, 1), done.stderr
    _victim(made, own, KERNELCACHE_DIR=str(own), **env)


#: the keyless remote tiers a forger may write
TIERS = [
    pytest.param("redis", marks=pytest.mark.skipif(REDIS_SERVER is None, reason=SKIP_REASON)),
    pytest.param(
        "s3",
        marks=pytest.mark.skipif(
            not moto_available(), reason="moto and obstore (the s3 extra) are needed"
        ),
    ),
]


@contextlib.contextmanager
def _tier(door: str, tmp_path: Path) -> Iterator[str]:
    """An empty keyless tier of the kind ``door`` ("redis", "s3"), for as long as the block
    runs: its URL."""
    if door == "redis":
        server = RedisServer(tmp_path / "redis").start()
        try:
            yield server.url
        finally:
            server.stop()
        return
    from object_store import MotoS3

    with s3_env(), MotoS3() as bucket_server:  # (moto keeps buckets for the process: a new one)
        yield bucket_server.bucket(f"lowerings-{uuid.uuid4().hex[:16]}")


@pytest.mark.parametrize("door", TIERS)
@pytest.mark.parametrize("ext", ["lowering", "program"])
def test_a_forged_stored_lowering_in_a_tier(made, tmp_path, door, ext):
    """A stored lowering (or a program entry) with forged read sets in a keyless tier: no code
    it names runs, the victim embeds what a compile gives (from the kernel entry beside it);
    one holding more read sets than a check of one entry makes is refused at the door, and
    no copy of it is kept."""
    import shutil

    forged = tmp_path / "forged"
    shutil.copytree(made["clean"], forged)
    assert _forge_lowerings(forged, ext, many=True) >= 1
    own = tmp_path / "own"
    with _tier(door, tmp_path) as url:
        _upload(forged, url, None)
        code, said, _ = _lower(
            made["src"], made["target"], KERNELCACHE_DIR=str(own), KERNELCACHE_REMOTE=url
        )
    assert (code, said) == (made["code"], [])
    assert _copies(own) == [], "the forged lowering was copied into the victim's root"


@pytest.mark.parametrize("door", TIERS)
def test_a_program_entry_is_kept_as_the_calls_used_never_as_the_tiers_bytes(made, tmp_path, door):
    """A program entry of a tier holding each true item and a forged duplicate under the same
    key: the true one is served (no compile) and checked, and what the victim keeps in its own
    root is the calls it used, never the forged item beside them."""
    import shutil

    forged = tmp_path / "forged"
    shutil.copytree(made["clean"], forged)
    assert _forge_lowerings(forged, "program", beside=True) >= 1
    own = tmp_path / "own"
    with _tier(door, tmp_path) as url:
        _upload(forged, url, None)
        code, said, compiles = _lower(
            made["src"], made["target"], KERNELCACHE_DIR=str(own), KERNELCACHE_REMOTE=url
        )
    assert (code, said, compiles) == (made["code"], [], 0)
    kept = [p.read_bytes() for p in own.glob("*.program")]
    assert kept and not any(FORGED_MARK.encode() in data for data in kept)


@pytest.mark.parametrize("door", TIERS)
@pytest.mark.parametrize("ext", ["lowering", "program"])
def test_a_true_stored_lowering_in_a_tier_is_kept(made, tmp_path, door, ext):
    """The other side of the door: a stored lowering (or program entry) the tier holds as a
    compile wrote it is served without a compile and kept in the local root, byte for byte
    (a program entry once every call of it passed its check)."""
    import shutil

    clean = tmp_path / "clean"
    shutil.copytree(made["clean"], clean)
    if ext == "lowering":
        forget_programs(clean)
    own = tmp_path / "own"
    with _tier(door, tmp_path) as url:
        _upload(clean, url, None)
        code, said, _ = _lower(
            made["src"], made["target"], KERNELCACHE_DIR=str(own), KERNELCACHE_REMOTE=url
        )
    assert said == [] and code == made["code"]
    compiled = list(own.glob(f"*.{machine_ext(made['target'])}"))
    assert not compiled, "the victim compiled: the stored lowering was not used"
    theirs = {p.name: p.read_bytes() for p in clean.glob(f"*.{ext}")}
    kept = {p.name: p.read_bytes() for p in own.glob(f"*.{ext}")}
    assert theirs and kept == theirs
