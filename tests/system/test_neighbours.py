"""Hostile neighbours and slow servers: what another user of a shared root can write never
selects a deletion, every wait of a call is bounded in total, secrets fail closed, a bundle
costs memory bounded by what it holds, and hand-off files are what this process wrote.

Each case runs real processes (and real users, through setpriv, where it needs two); the
cases about time and memory assert their bounds. The figures are in docs/reliability.md.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
from artifact_images import elf_image, launch
from cli_support import kc, kc_json, put
from support import CAN_DROP_PRIVILEGES, checked, child_env, key_of, other_users_env, run_py

import kernelcache
from kernelcache.errors import WrongExt
from kernelcache.process import HOST

SHARE_GID = 4242


def _can_share() -> bool:
    if not CAN_DROP_PRIVILEGES:
        return False
    probe = subprocess.run(
        ["unshare", "-m", "sh", "-c", "setpriv --reuid=65534 --regid=65534 --clear-groups true"],
        capture_output=True,
        timeout=20,
    )
    return probe.returncode == 0


CAN_SHARE = _can_share()
needs_users = pytest.mark.skipif(not CAN_SHARE, reason="needs root, unshare -m and setpriv")


def _as_users(shared: Path, steps: list[str], timeout: float = 240, **env: str) -> list[dict]:
    """Run shell ``steps`` in a private mount namespace whose /etc/group puts daemon (1) and
    nobody (65534) in group 4242; each step prints one JSON line. Returns them."""
    group = shared / "group"
    group.write_text(Path("/etc/group").read_text() + f"kcshare:x:{SHARE_GID}:daemon,nobody\n")
    script = "\n".join(["set -e", f"mount --bind {group} /etc/group", *steps])
    proc = subprocess.run(
        ["unshare", "-m", "sh", "-c", script],
        env=other_users_env(shared, **env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


def _as(uid: int, gid: int, *groups: int) -> list[str]:
    """The argv prefix that runs a command as ``uid`` in group ``gid`` (and ``groups``), umask
    002, without a private /etc/group."""
    given = f"--groups={','.join(map(str, groups))}" if groups else "--clear-groups"
    who = ["setpriv", f"--reuid={uid}", f"--regid={gid}", given]
    return ["sh", "-c", 'umask 002; exec "$@"', "sh", *who]


def _user(uid: int, code_var: str, *argv: str) -> str:
    """A step run as ``uid`` in group 4242, umask 002: ``python -c "$<code_var>" ARGV``."""
    args = " ".join(repr(a) for a in argv)
    who = f"--reuid={uid} --regid={SHARE_GID} --init-groups"
    return f'umask 002; setpriv {who} {sys.executable} -c "${code_var}" {args}'


# -- 1. a forged scan index never selects a deletion --------------------------------------------
def _forge_index(root: Path, *, column: str | None = None, value: str = "", size: int = 0) -> None:
    """Rewrite ``.stats/index.json`` keeping its keys, inodes, extensions and listing signature:
    every row's ``column`` says ``value``; with ``size``, every artifact size (and the totals)
    says ``size``."""
    index = root / ".stats" / "index.json"
    first, _, body = index.read_bytes().partition(b"\n")
    head, doc = json.loads(first), json.loads(body)
    if column is not None:
        doc["strings"].append(value)
        doc[column] = [len(doc["strings"]) - 1] * len(doc[column])
    if size:
        doc["size"] = [size] * len(doc["size"])
        head["totals"]["size"] = size * len(doc["size"])
    index.write_bytes(json.dumps(head).encode() + b"\n" + json.dumps(doc).encode())


@pytest.mark.parametrize(
    ("column", "flag", "value"), [("target", "--target", "cuda:80"), ("kernel", "--kernel", "old")]
)
def test_a_forged_index_column_never_selects_a_deletion(tmp_path, column, flag, value):
    """The index's target (or kernel) column says every entry matches the filter: prune
    deletes only the entries whose own metadata matches (it deleted all 25 before)."""
    root = tmp_path / "cache"
    victims = [put(root, "victim", "cuda:90", size=300, seed=i) for i in range(20)]
    retired = [put(root, "old", "cuda:80", size=300, seed=i) for i in range(5)]
    for _ in range(2):  # the second scan signs the listing that includes .stats/
        assert kc(root, "stats").returncode == 0
    _forge_index(root, column=column, value=value)
    doc = kc_json(root, "prune", flag, value, "--yes")  # (the forged plan says: every entry)
    left = {p.name[:-5] for p in root.glob("*.json")}
    assert left == {a.key for a in victims}, doc["result"]["counts"]
    assert not {a.key for a in retired} & left
    kept = [
        o
        for o in doc["result"]["outcomes"]
        if o["action"] == "delete-entry" and o["status"] != "done"
    ]
    assert len(kept) == 20 and {o["status"] for o in kept} == {"changed"}


def test_forged_sizes_neither_show_nor_select(tmp_path):
    """Sizes in the index: a forged artifact size column made `stats` report 2.5e16 bytes; a
    forged metadata size column made `prune --max-size` delete every entry."""
    root = tmp_path / "cache"
    arts = [put(root, "k", "cuda:90", size=300, seed=i) for i in range(25)]
    real = kc_json(root, "stats")["bytes"]
    assert kc(root, "stats").returncode == 0
    _forge_index(root, size=10**15)
    assert kc_json(root, "stats")["bytes"] == real
    assert kc(root, "stats").returncode == 0
    index = root / ".stats" / "index.json"
    first, _, body = index.read_bytes().partition(b"\n")
    doc = json.loads(body)
    doc["meta_size"] = [10**9] * len(doc["meta_size"])
    index.write_bytes(first + b"\n" + json.dumps(doc).encode())
    kc_json(root, "prune", "--max-size", "1M")
    assert {p.name[:-5] for p in root.glob("*.json")} == {a.key for a in arts}


INDEX_ROLE = """
import json, os, sys
role, root = sys.argv[1], sys.argv[2]
out = {"role": role}
if role == "victim":
    import kernelcache
    cache = kernelcache.Cache(root, readonly_roots=(), remote="")
    for i in range(20):
        cache.put("%02x" % i * 32, "bin", b"victim's kernel %d" % i * 40, {"name": "v", "target": "cuda:90"})
else:  # a member of the cache's group who cannot delete the victim's entries (sticky root)
    index = os.path.join(root, ".stats", "index.json")
    if role == "planter":  # writes the index itself, then forges its own file
        import contextlib, io
        from kernelcache.cli import main
        with contextlib.redirect_stdout(io.StringIO()):
            assert main(["--root", root, "stats"]) == 0
    first, _, body = open(index, "rb").read().partition(b"\\n")
    head, doc = json.loads(first), json.loads(body)
    doc["strings"].append("cuda:80")
    doc["target"] = [len(doc["strings"]) - 1] * len(doc["target"])
    if role == "replacer":
        doc["size"] = [10**15] * len(doc["size"])
        head["totals"]["size"] = 10**15 * len(doc["size"])
    forged = json.dumps(head).encode() + b"\\n" + json.dumps(doc).encode()
    try:
        if role == "planter":
            open(index, "wb").write(forged)
        else:
            with open(index + ".forged", "wb") as f:
                f.write(forged)
            os.replace(index + ".forged", index)
        out["forged"] = "done"
    except OSError as e:
        out["forged"] = type(e).__name__
if role != "victim":
    try:
        os.unlink(os.path.join(root, "00" * 32 + ".json"))
        out["delete-one"] = "done"
    except OSError as e:
        out["delete-one"] = type(e).__name__
print(json.dumps(out))
"""


@needs_users
def test_a_group_member_cannot_make_the_operators_prune_delete(shared_tmp):
    """The README's recipe with a sticky root (root:4242, mode 3775): nobody, a member of the
    group, cannot delete daemon's entries, but could write the scan index under .stats/, so
    that the operator's `prune --target cuda:80` deleted all 20 of daemon's cuda:90 entries,
    and `stats` showed 2e16 bytes. Now the index it plants selects nothing, and it cannot
    replace the operator's (.stats/ is sticky)."""
    root = shared_tmp / "cache"
    root.mkdir()
    os.chown(root, 0, SHARE_GID)
    os.chmod(root, 0o3775)
    operator = f"{sys.executable} -m kernelcache.cli --root {root}"
    steps = [
        _user(1, "ROLE", "victim", str(root)),
        _user(65534, "ROLE", "planter", str(root)),
        f"{operator} prune --target cuda:80 --json --yes",
        f"{operator} stats --json | tr -d '\\n'; echo",
        _user(65534, "ROLE", "replacer", str(root)),
        f"{operator} prune --target cuda:80 --json --yes",
        f"{operator} stats --json",
    ]
    _, planter, prune1, stats1, replacer, prune2, stats2 = _as_users(
        shared_tmp, steps, ROLE=INDEX_ROLE
    )
    assert planter == {**planter, "forged": "done", "delete-one": "PermissionError"}
    # the planted index (of a member the group policy trusts) planned 20 deletions; each
    # entry's own metadata said otherwise under its lock, and the index was dropped
    assert prune1["result"]["counts"] == {"changed": 20}, prune1["result"]["counts"]
    assert prune2["result"] is None  # the operator's own index, which nobody cannot replace
    assert replacer["forged"] == "PermissionError", replacer  # .stats/ is sticky
    assert len(list(root.glob("*.json"))) == 20
    for shown in (stats1, stats2):
        assert shown["entries"] == 20 and shown["bytes"] < 10**6, shown["bytes"]
        assert list(shown["by_target"]) == ["cuda:90"], shown["by_target"]
    for shared in (".stats", ".locks"):  # in a root set up for sharing: sticky
        assert (root / shared).stat().st_mode & 0o1000, shared


# -- 2. every wait of a call is bounded in total ------------------------------------------------
SQUAT = """
import fcntl, os, sys
root, keys = sys.argv[1], sys.argv[2].split(",")
locks = os.path.join(root, ".locks")
os.makedirs(locks, exist_ok=True)
held = []
for key in keys:
    for suffix in (".lock", ".build.lock"):
        fd = os.open(os.path.join(locks, key + suffix), os.O_RDONLY | os.O_CREAT, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)
        held.append(fd)
print("held", flush=True)
sys.stdin.read()
"""

JOB = """
import json, os, sys, time
import kernelcache
root, keys = sys.argv[1], sys.argv[2].split(",")
cache = kernelcache.Cache(root, readonly_roots=(), remote="")
build = lambda i: lambda: (time.sleep(0.05), (b"kernel %d" % i, {}))[1]
items = [kernelcache.BuildItem(k, "bin", build(i)) for i, k in enumerate(keys)]
started = time.monotonic()
arts = cache.get_or_create_many(items)
many = time.monotonic() - started
started = time.monotonic()
one = cache.get_or_create(keys[0], "bin", build(0))
single = time.monotonic() - started
started = time.monotonic()
for i in (1, 2, 3):
    cache.get_or_create(keys[i], "bin", build(i))
each = time.monotonic() - started
print(json.dumps({"many": many, "one": single, "each": each, "sources": [a.source for a in arts],
                  "data": [a.data.decode() for a in arts], "stats": kernelcache.process_stats()}))
"""


def _squat(
    root: Path, keys: list[str], *prefix: str, env: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [*prefix, sys.executable, "-c", SQUAT, str(root), ",".join(keys)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env or child_env(),
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def test_a_squatter_on_every_lock_costs_a_process_one_timeout(tmp_path):
    """Another process holds the writer's and the builder's lock of 4 keys for ever. With a
    3 s lock timeout, get_or_create_many of the 4 keys took 15 s ((N+1) x timeout: the wait,
    then each private build's put waited again, in turn) and get_or_create 6 s, then each call
    after it one timeout more (a lowering makes several: one held 10 minutes); now the first
    call waits about one timeout in total and builds in memory, and the calls after it (for as
    long again) do not wait."""
    root = tmp_path / "cache"
    keys = [key_of("squat", i) for i in range(4)]
    timeout = 3.0
    squatter = _squat(root, keys)
    try:
        proc = run_py(
            JOB, str(root), ",".join(keys), KERNELCACHE_LOCK_TIMEOUT=str(timeout), timeout=240
        )
    finally:
        squatter.communicate("")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["data"] == [f"kernel {i}" for i in range(4)] and set(out["sources"]) == {"memory"}
    assert out["many"] < 1.5 * timeout, out
    assert out["one"] + out["each"] < 0.5 * timeout, out
    assert out["stats"]["lock_timeouts"] >= 4


@needs_users
def test_an_outsider_cannot_squat_the_locks(shared_tmp):
    """User bin (2), in no group of the cache, plants and holds the lock files of 4 keys in a
    world-writable sticky root. nobody's get_or_create_many waited (N+1) x the timeout for
    them; a lock file of a user the trust policy excludes is not waited on: nobody builds at
    once (without those locks) and publishes."""
    root = shared_tmp / "world"
    root.mkdir()
    os.chmod(root, 0o1777)
    keys = [key_of("outsider", i) for i in range(4)]
    squatter = _squat(root, keys, *_as(2, 2), env=other_users_env(shared_tmp))
    try:
        proc = subprocess.run(
            [*_as(65534, 65534), sys.executable, "-c", JOB, str(root), ",".join(keys)],
            env=other_users_env(shared_tmp, KERNELCACHE_LOCK_TIMEOUT="3"),
            capture_output=True,
            text=True,
            timeout=240,
        )
    finally:
        squatter.communicate("")
    checked(proc)
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["many"] < 1.5 and out["one"] < 1.5, out
    assert out["sources"] == ["local"] * 4


@pytest.mark.parametrize(("policy", "others"), [("group", 0o007), ("owner", 0o077)])
def test_lock_files_are_readable_only_by_the_trusted_set(tmp_path, monkeypatch, policy, others):
    """Whoever can open a lock file can hold a flock on it: lock files keep only the read bits
    of the users the trust policy trusts (they were 0666 minus the umask)."""
    monkeypatch.setenv("KERNELCACHE_TRUST", policy)
    root = tmp_path / "cache"
    old = os.umask(0)
    try:
        kernelcache.Cache(root, readonly_roots=(), remote="").get_or_create(
            key_of("modes"), "bin", lambda: (b"x", {})
        )
    finally:
        os.umask(old)
    modes = {
        p.name: p.stat().st_mode & 0o777
        for p in (root / ".locks").iterdir()
        if p.name.endswith(".lock")
    }
    assert modes and all(not mode & others for mode in modes.values()), modes


STOPPING_BUILDER = """
import os, signal, sys, kernelcache
cache = kernelcache.Cache(sys.argv[1], readonly_roots=(), remote="")
def build():
    print("building", flush=True)
    os.kill(os.getpid(), signal.SIGSTOP)
    return b"late", {}
cache.get_or_create(sys.argv[2], "bin", build)
"""


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rpartition(")")[2].split()[0]


@pytest.mark.parametrize("mode", ["flock", "soft"])
def test_doctor_names_the_holder_a_job_waited_on(tmp_path, mode):
    """A builder stopped with SIGSTOP holds its key's lock: the job waits the lock timeout and
    builds privately (as before), and now says who held it; doctor shows the holder (pid, host,
    how long) of the lock the job waited on."""
    root = tmp_path / "cache"
    key = key_of("stopped", mode)
    env = {"KERNELCACHE_LOCK_MODE": mode}
    holder = subprocess.Popen(
        [sys.executable, "-c", STOPPING_BUILDER, str(root), key],
        stdout=subprocess.PIPE,
        text=True,
        env=child_env(**env),
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "building"
        deadline = time.monotonic() + 30
        while _state(holder.pid) != "T" and time.monotonic() < deadline:
            time.sleep(0.01)
        code = f"import kernelcache; print(kernelcache.Cache({str(root)!r}, readonly_roots=(), remote='').get_or_create({key!r}, 'bin', lambda: (b'x', {{}})).source)"
        waiter = run_py(code, KERNELCACHE_LOCK_TIMEOUT="1", **env)
        # built privately and published: only the build lock is held, not the writers'
        assert waiter.stdout.strip() == "local"
        assert f"pid {holder.pid}" in waiter.stderr, waiter.stderr
        doc = kc_json(root, "doctor", code=0, env=env)
        waits = [c for c in doc["checks"] if c["name"] == "lock waits"]
        assert len(waits) == 1 and waits[0]["status"] == "warn", doc["checks"]
        detail = waits[0]["detail"]
        assert f"pid {holder.pid}" in detail and HOST in detail and "held" in detail, detail
    finally:
        holder.kill()
        holder.wait()


# -- 5. secrets fail closed --------------------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("KERNELCACHE_SIGNING_KEY", ""),
        ("KERNELCACHE_SIGNING_KEY", "   "),
        ("KERNELCACHE_SIGNING_KEY_FILE", ""),
        ("KERNELCACHE_SIGNING_KEY_FILE", "{empty_file}"),
    ],
    ids=["empty", "blank", "empty-file-variable", "empty-key-file"],
)
def test_a_blank_signing_key_is_a_configuration_error(tmp_path, name, value):
    """KERNELCACHE_SIGNING_KEY='' turned signing off: an unsigned bundle imported (exit 0) and
    doctor said ok. A signing key set but blank (or an empty key file) is an error naming the
    variable; doctor fails it."""
    source = tmp_path / "source"
    put(source, "k", "cuda:90")
    bundle = tmp_path / "unsigned.tar"
    assert kc(source, "export", str(bundle)).returncode == 0
    empty = tmp_path / "key"
    empty.write_text(" \n")
    os.chmod(empty, 0o600)
    env = {name: value.format(empty_file=empty)}
    proc = kc(tmp_path / "dest", "import", str(bundle), env=env)
    assert proc.returncode == 2 and name in proc.stderr, proc.stderr
    assert not (tmp_path / "dest").exists()
    doc = kc_json(tmp_path / "dest", "doctor", code=1, env=env)
    (check,) = [c for c in doc["checks"] if c["name"] == name]
    assert check["status"] == "fail", check


# -- 6. a bundle's memory is bounded by what it holds -------------------------------------------
# (VmHWM, the peak of this process's own memory: ru_maxrss keeps the forking parent's peak)
IMPORT_RSS = """
import sys
from kernelcache.cli import main
code = main(sys.argv[1:])
with open("/proc/self/status") as f:
    peak = next(line.split()[1] for line in f if line.startswith("VmHWM:"))
print("RSS", peak, code, file=sys.stderr)
"""


def _hostile_bundle(
    path: Path, members: int, member_size: int, *, pad_entries: bool, pad_top: int
) -> None:
    """A zstd bundle of ``members`` zero-filled members with a valid manifest, whose entries
    each carry a 60 KiB field of empty lists (``pad_entries``), and which ends with a
    top-level field of ``pad_top`` bytes of empty lists."""
    import zstandard

    from kernelcache.schema import FORMAT_VERSION, make_metadata

    data = bytes(member_size)
    pad = ', "pad": [' + "[]," * 19_999 + "[]]}" if pad_entries else "}"
    entries = []
    with open(path, "wb") as raw:
        writer = zstandard.ZstdCompressor(level=3).stream_writer(raw, closefd=False)
        with tarfile.open(fileobj=writer, mode="w|", format=tarfile.PAX_FORMAT) as tar:
            for i in range(members):
                key = key_of("bomb", i)
                entries.append(json.dumps(make_metadata(key, "bin", data, {}))[:-1] + pad)
                info = tarfile.TarInfo(f"entries/{key}.bin")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            head = '{"format": "kernelcache-bundle", "version": 1, "created": 0, '
            head += f'"compatibility": {{"entry_format": {FORMAT_VERSION}}}, "entries": ['
            manifest = (head + ",".join(entries) + "]").encode()
            entries.clear()
            if pad_top:
                manifest += b', "pad": [' + b"[]," * (pad_top // 3) + b"[]]"
            manifest += b"}"
            info = tarfile.TarInfo("manifest.json")
            info.size = len(manifest)
            tar.addfile(info, io.BytesIO(manifest))
        writer.flush(zstandard.FLUSH_FRAME)
        writer.close()


@pytest.mark.parametrize(
    ("members", "member_size", "pad_entries", "pad_top", "code"),
    [
        (1000, 0, False, 63 << 20, 2),  # empty members, a 64 MiB manifest (refused whole)
        (1000, 64 << 10, False, 62 << 20, 2),  # 64 MiB of members buy the manifest room
        (500, 64 << 10, True, 0, 0),  # valid entries of 60 KiB of empty lists each
    ],
    ids=["empty-members", "padded-manifest", "padded-entries"],
)
def test_a_hostile_manifest_costs_bounded_memory(
    tmp_path, members, member_size, pad_entries, pad_top, code
):
    """A 43 KB zstd bundle of 1000 empty members bought a 64 MiB manifest of tiny JSON values,
    and `import --dry-run` used 1.75 GB before refusing it. Now a manifest's allowance comes
    from its members' sizes and it is parsed one entry at a time: < 200 MB whatever it holds."""
    bundle = tmp_path / "bomb.tar.zst"
    _hostile_bundle(bundle, members, member_size, pad_entries=pad_entries, pad_top=pad_top)
    assert bundle.stat().st_size < 2 << 20
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            IMPORT_RSS,
            "--root",
            str(tmp_path / "dest"),
            "import",
            "--dry-run",
            str(bundle),
        ],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    _, rss_kib, exit_code = proc.stderr.strip().splitlines()[-1].split()
    assert int(exit_code) == code, proc.stderr[-2000:]
    assert int(rss_kib) < 200 << 10, f"{int(rss_kib) >> 10} MiB"
    assert "Traceback" not in proc.stderr


# -- 7. hand-off files are what this process wrote ---------------------------------------------
HANDOFF_VICTIM = """
import json, os, sys
os.dup2(os.open(os.devnull, os.O_RDONLY), 1023)  # the canonical descriptor is taken
from bridge.embed import handoff
root = sys.argv[1]
good = b"\\x7fELF good kernel " * 64
first = handoff.materialize(root, "k.hsaco", good)
print(json.dumps({"path": first, "dir": handoff.directory(root)[0]}), flush=True)
sys.stdin.readline()  # the neighbour acts
second = handoff.materialize(root, "k.hsaco", good)
with open(second, "rb") as f:
    print(json.dumps({"path": second, "good": f.read() == good}), flush=True)
"""

HANDOFF_NEIGHBOUR = """
import json, os, sys
private, name = sys.argv[1], "k.hsaco"
base = os.path.dirname(private)
evil = b"\\x7fELF evil kernel " * 64
evil += b"x" * (len(b"\\x7fELF good kernel " * 64) - len(evil))
out = {}
try:
    os.rename(private, private + ".moved")
    out["moved"] = "directory"
except OSError as e:
    out["moved"] = type(e).__name__
    os.rename(base, base + ".moved")  # then the whole .handoff
    os.mkdir(base, 0o775)
os.mkdir(private, 0o775)
with open(os.path.join(private, name), "wb") as f:
    f.write(evil)
print(json.dumps(out), flush=True)
"""


@pytest.mark.skipif(not CAN_DROP_PRIVILEGES, reason="needs root and setpriv")
def test_a_neighbour_cannot_swap_the_handoff_directory(shared_tmp):
    """daemon hands HSACO files over by path (descriptor 1023 taken). nobody, in the same group,
    renamed daemon's hand-off directory and planted a file of the same size at the same name:
    daemon's next lowering handed jaxlib nobody's bytes. Now the files are checked through the
    directory's descriptor, by content, and the path is checked to still lead there."""
    root = shared_tmp / "cache"
    root.mkdir()
    os.chown(root, 0, SHARE_GID)
    os.chmod(root, 0o2775)
    victim_, neighbour_ = _as(1, SHARE_GID, SHARE_GID), _as(65534, SHARE_GID, SHARE_GID)
    env = other_users_env(shared_tmp)
    victim = subprocess.Popen(
        [*victim_, sys.executable, "-c", HANDOFF_VICTIM, str(root)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert victim.stdout is not None and victim.stdin is not None
    first = json.loads(victim.stdout.readline())
    neighbour = subprocess.run(
        [*neighbour_, sys.executable, "-c", HANDOFF_NEIGHBOUR, first["dir"]],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    checked(neighbour)
    out, err = victim.communicate("go\n", timeout=120)
    assert victim.returncode == 0, err
    second = json.loads(out.strip().splitlines()[-1])
    assert second["good"], (first, neighbour.stdout, second)
    assert json.loads(neighbour.stdout)["moved"] == "PermissionError"  # .handoff is sticky


def test_a_file_of_the_same_size_is_not_taken_for_the_kernel(tmp_path):
    """The hand-off directory held a file of the kernel's size but other bytes (written there
    by anyone who could): it was handed over as present. Now only the same content is."""
    code = f"""
import os
from bridge.embed import handoff
root = {str(tmp_path)!r}
good = b"\\x7fELF good" * 100
path = handoff.materialize(root, "k.hsaco", good)
private, _ = handoff.directory(root)
with open(os.path.join(private, "k.hsaco"), "r+b") as f:
    f.write(b"\\x7fELF evil")
again = handoff.materialize(root, "k.hsaco", good)
assert open(again, "rb").read() == good, "stale bytes handed over"
print("ok")
"""
    assert run_py(code).stdout.strip() == "ok"


# -- 8. the smaller ones --------------------------------------------------------------------
def test_an_enormous_lock_staleness_is_no_traceback(tmp_path):
    """KERNELCACHE_LOCK_STALE=99999999999d: the soft lock's refresher thread died with an
    OverflowError traceback on every lock."""
    code = f"import kernelcache; print(kernelcache.Cache({str(tmp_path)!r}, readonly_roots=(), remote='').get_or_create({key_of('stale')!r}, 'bin', lambda: (__import__('time').sleep(0.3), (b'x', {{}}))[1]).source)"
    proc = run_py(code, KERNELCACHE_LOCK_MODE="soft", KERNELCACHE_LOCK_STALE="99999999999d")
    assert proc.stdout.strip() == "local"
    assert "Traceback" not in proc.stderr and "Overflow" not in proc.stderr, proc.stderr


def test_an_unreaped_builder_is_not_alive(tmp_path):
    """A soft lock whose holder exited but was not reaped by its parent (a zombie) was taken
    for a live holder's until it went stale (300 s); it is broken at once."""
    from kernelcache.store.locks import Locker

    name = key_of("zombie")
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import os, sys\nfrom kernelcache.store.locks import Locker\n"
            "Locker(sys.argv[1], mode='soft').acquire(sys.argv[2], shared=False, timeout=5)\n"
            "print('held', flush=True)\nos._exit(0)",
            str(tmp_path),
            name,
        ],
        stdout=subprocess.PIPE,
        text=True,
        env=child_env(),
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        deadline = time.monotonic() + 30
        while _state(holder.pid) != "Z" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _state(holder.pid) == "Z"
        started = time.monotonic()
        Locker(str(tmp_path), mode="soft", stale_after=300).acquire(
            name, shared=False, timeout=5
        ).release()
        assert time.monotonic() - started < 2.5
    finally:
        holder.wait()


@pytest.mark.parametrize(
    "argv",
    [
        ["prune", "--target", "cuda:"],
        ["prune", "--kernel", ""],
        ["ls", "--target", "cuda:"],
        ["ls", "--target", "cuda::90"],
        ["export", "out.tar", "--target", "cuda 90"],
    ],
)
def test_filters_are_validated(tmp_path, argv):
    """`--target cuda:` silently matched nothing: a filter that no entry could hold (the
    schema's generic target rule; a kernel name is 1 to 1024 printable characters) is a usage
    error naming it."""
    root = tmp_path / "cache"
    put(root, "k", "cuda:90")
    proc = kc(root, *argv)
    assert proc.returncode == 2 and repr(argv[-1]) in proc.stderr, proc.stderr
    assert len(list(root.glob("*.json"))) == 1


def test_targets_the_generic_rule_accepts(tmp_path):
    root = tmp_path / "cache"
    put(root, "k", "cuda:90")
    for target in ("cuda:90", "hip:gfx942", "hip:gfx90a:sramecc+:xnack-", "sm_90a", "x"):
        assert kc(root, "ls", "--target", target).returncode == 0, target


@pytest.mark.parametrize("data", [5, None, "text", [1, 2]])
def test_put_refuses_what_is_not_bytes(tmp_path, data):
    """put(..., data=5) stored 5 zero bytes."""
    root = tmp_path / "cache"
    cache = kernelcache.Cache(root, readonly_roots=(), remote="")
    with pytest.raises(TypeError, match="bytes"):
        cache.put(key_of("int"), "bin", data, {})
    with pytest.raises(TypeError, match="bytes"):
        cache.get_or_create(key_of("built"), "bin", lambda: (data, {}))
    assert not list(root.glob("*.json"))


def test_stats_counts_logs_a_killed_fold_left_hidden(tmp_path):
    """Right after a kill -9 in the statistics fold, its renamed logs were not counted: stats
    under-reported until the next prune. Counted once, also once the summary names them."""
    from kernelcache.stats import read_logs

    root = tmp_path / "cache"
    put(root, "k")
    stats_dir = root / ".stats"
    stats_dir.mkdir(exist_ok=True)
    for i in range(2):
        log = stats_dir / f"otherhost-{i}-0000000{i}.jsonl.folding"
        log.write_text(json.dumps({"v": 1, "delta": {"hits": 5}}) + "\n")
    assert read_logs(str(root))[0]["hits"] == 10
    assert kc_json(root, "stats")["counters"]["hits"] == 10
    summary = {
        "v": 1,
        "summary": True,
        "logs": 1,
        "delta": {"hits": 5},
        "folded": ["otherhost-0-00000000.jsonl"],
    }
    (stats_dir / "summary.jsonl").write_text(json.dumps(summary) + "\n")
    assert kc_json(root, "stats")["counters"]["hits"] == 10  # log 0 is in the summary now
    kc_json(root, "prune")  # finishes the fold
    assert kc_json(root, "stats")["counters"]["hits"] == 10
    assert not list(stats_dir.glob("*.folding"))


def test_get_or_create_with_another_extension_never_builds(tmp_path):
    """The key holds a .cubin: get_or_create(key, "ptx", build) ran the build, then raised
    WrongExt. It raises before building."""
    root = tmp_path / "cache"
    cache = kernelcache.Cache(root, readonly_roots=(), remote="")
    key = key_of("ext")
    cache.put(key, "cubin", elf_image(b"binary"), launch())
    built = []
    with pytest.raises(WrongExt):
        cache.get_or_create(key, "ptx", lambda: (built.append(1), (b"text", {}))[1])
    assert built == []
    assert cache.get(key, "ptx") is None  # get stays a miss
