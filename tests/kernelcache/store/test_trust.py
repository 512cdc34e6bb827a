"""The trust policy: an artifact is code for the GPU; only trusted users' files are served."""

from __future__ import annotations

import os

import pytest
from support import IS_ROOT, key_of

import kernelcache
from kernelcache.store import Problem, Store

NOBODY = 65534

pytestmark = pytest.mark.skipif(not IS_ROOT, reason="needs root to create files of another user")


def _entry_owned_by(root, key: str, uid: int, gid: int) -> None:
    Store(root).put(key, "bin", b"someone else's code", {})
    for name in (f"{key}.bin", f"{key}.json"):
        os.chown(root / name, uid, gid)


@pytest.fixture
def shared_root(tmp_path):
    root = tmp_path / "shared"
    root.mkdir()
    os.chown(root, 0, 0)  # owner root, group root: user 65534 is neither
    return root


def test_untrusted_user_is_refused_and_replaced(shared_root, caplog_warnings):
    key = key_of("untrusted")
    _entry_owned_by(shared_root, key, NOBODY, NOBODY)
    cache = kernelcache.Cache(shared_root, readonly_roots=())
    before = kernelcache.process_stats()
    assert cache.get(key, "bin") is None
    result = cache.store.read(key, "bin")
    assert isinstance(result, Problem) and result.untrusted and not result.corrupt
    messages = [r.getMessage() for r in caplog_warnings.records]
    assert sum("refusing artifacts" in m and str(NOBODY) in m for m in messages) == 1
    art = cache.get_or_create(key, "bin", lambda: (b"our build", {}))
    assert art.data == b"our build" and os.stat(art.path).st_uid == os.geteuid()
    after = kernelcache.process_stats()
    # the get, then get_or_create's lookup and its re-check under the build lock
    assert after["untrusted"] - before["untrusted"] == 3
    assert after["corrupt"] == before["corrupt"]


def test_group_member_is_trusted_under_group_policy(shared_root):
    os.chown(shared_root, 0, NOBODY)  # the root directory's group is user 65534's primary group
    key = key_of("group-member")
    _entry_owned_by(shared_root, key, NOBODY, NOBODY)
    assert (
        kernelcache.Cache(shared_root, readonly_roots=()).get(key, "bin").data
        == b"someone else's code"
    )


def test_owner_policy_refuses_group_members(shared_root, monkeypatch):
    os.chown(shared_root, 0, NOBODY)
    monkeypatch.setenv("KERNELCACHE_TRUST", "owner")
    key = key_of("owner-policy")
    _entry_owned_by(shared_root, key, NOBODY, NOBODY)
    assert kernelcache.Cache(shared_root, readonly_roots=()).get(key, "bin") is None


def test_root_directory_owner_is_trusted(shared_root, monkeypatch):
    os.chown(shared_root, NOBODY, 0)
    monkeypatch.setenv("KERNELCACHE_TRUST", "owner")
    key = key_of("dir-owner")
    _entry_owned_by(shared_root, key, NOBODY, NOBODY)
    assert kernelcache.Cache(shared_root, readonly_roots=()).get(key, "bin") is not None


def test_any_policy_serves_everyone(shared_root, monkeypatch):
    monkeypatch.setenv("KERNELCACHE_TRUST", "any")
    key = key_of("any")
    _entry_owned_by(shared_root, key, NOBODY, NOBODY)
    assert kernelcache.Cache(shared_root, readonly_roots=()).get(key, "bin") is not None


def test_untrusted_entry_in_readonly_root_is_skipped(tmp_path):
    image = tmp_path / "image"
    image.mkdir()
    key = key_of("ro-untrusted")
    _entry_owned_by(image, key, NOBODY, NOBODY)
    cache = kernelcache.Cache(tmp_path / "local", readonly_roots=[image])
    assert cache.get(key, "bin") is None
    assert (image / f"{key}.bin").stat().st_uid == NOBODY  # left alone


def test_a_bad_policy_is_the_strictest_in_a_job_and_said_once(shared_root, monkeypatch, caplog):
    """A policy that cannot be read costs only itself: the strictest one (owner), said once;
    the cache stays on."""
    os.chown(shared_root, 0, NOBODY)  # a group member's entry: served under group, not owner
    _entry_owned_by(shared_root, key_of("group-member"), NOBODY, NOBODY)
    monkeypatch.setenv("KERNELCACHE_TRUST", "the-whole-lab")  # (said once per process)
    for _ in range(2):
        cache = kernelcache.Cache(shared_root, readonly_roots=())
        art = cache.get_or_create("ab" * 32, "bin", lambda: (b"built", {}))
        assert art.data == b"built" and (shared_root / f"{'ab' * 32}.bin").exists()
        assert cache.get(key_of("group-member"), "bin") is None
    said = [r.getMessage() for r in caplog.records if "the-whole-lab" in r.getMessage()]
    assert len(said) == 1 and "the strictest policy, owner, applies" in said[0], said
    with pytest.raises(kernelcache.ConfigError, match="KERNELCACHE_TRUST"):
        kernelcache.config.settings()  # what the commands read: exit 2 naming it


# -- who can write an entry, not only who owns it ---------------------------------------------
def _mine(root, key: str, mode: int, gid: int | None = None) -> None:
    """An entry of this user (root) with both files chmod'ed to ``mode``."""
    Store(root).put(key, "bin", b"our code", {})
    for name in (f"{key}.bin", f"{key}.json"):
        if gid is not None:
            os.chown(root / name, 0, gid)
        os.chmod(root / name, mode)


@pytest.mark.parametrize("which", ["bin", "json"])
def test_owner_policy_refuses_files_its_group_can_write(shared_root, monkeypatch, which):
    """Under owner, a group-writable file can be rewritten in place by any group member while
    keeping its owner: refused (artifact or metadata)."""
    monkeypatch.setenv("KERNELCACHE_TRUST", "owner")
    key = key_of("owner-group-writable", which)
    _mine(shared_root, key, 0o644)
    os.chmod(shared_root / f"{key}.{which}", 0o664)
    cache = kernelcache.Cache(shared_root, readonly_roots=())
    result = cache.store.read(key, "bin")
    assert isinstance(result, Problem) and result.untrusted and not result.corrupt
    assert "writable" in result.reason
    assert cache.get(key, "bin") is None


def test_group_policy_refuses_files_every_user_can_write(shared_root):
    key = key_of("group-other-writable")
    _mine(shared_root, key, 0o666)
    result = Store(shared_root).read(key, "bin")
    assert isinstance(result, Problem) and result.untrusted and "every user" in result.reason


def test_group_policy_refuses_files_another_group_can_write(shared_root):
    """Group-writable is fine for the root directory's group, not for another group."""
    ours = key_of("group-writable-ours")
    _mine(shared_root, ours, 0o664, gid=0)  # the root directory's group
    assert Store(shared_root).read(ours, "bin").data == b"our code"
    theirs = key_of("group-writable-theirs")
    _mine(shared_root, theirs, 0o664, gid=NOBODY)
    result = Store(shared_root).read(theirs, "bin")
    assert isinstance(result, Problem) and result.untrusted and "group" in result.reason


def test_metadata_of_an_untrusted_user_is_refused(shared_root, monkeypatch):
    """The metadata decides what is launched: its owner must be trusted too."""
    monkeypatch.setenv("KERNELCACHE_TRUST", "owner")
    key = key_of("untrusted-metadata")
    Store(shared_root).put(key, "bin", b"our code", {})
    os.chown(shared_root / f"{key}.json", NOBODY, NOBODY)
    result = kernelcache.Cache(shared_root, readonly_roots=()).store.read(key, "bin")
    assert isinstance(result, Problem) and result.untrusted and "metadata" in result.reason


@pytest.mark.parametrize("policy", ["group", "owner"])
@pytest.mark.parametrize("which", ["bin", "json"])
def test_files_with_more_than_one_link_are_refused(tmp_path, monkeypatch, policy, which):
    """A hard link of an entry's file planted elsewhere (say, under another key) could be
    rewritten through the other name: an entry whose files have more than one link is refused."""
    monkeypatch.setenv("KERNELCACHE_TRUST", policy)
    root = tmp_path / "cache"
    key = key_of("linked", which)
    Store(root).put(key, "bin", b"our code", {})
    os.link(root / f"{key}.{which}", tmp_path / "elsewhere")
    result = kernelcache.Cache(root, readonly_roots=()).store.read(key, "bin")
    assert isinstance(result, Problem) and result.untrusted and "link" in result.reason
    os.unlink(tmp_path / "elsewhere")
    assert kernelcache.Cache(root, readonly_roots=()).store.read(key, "bin").data == b"our code"


def test_any_policy_checks_no_modes_or_links(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNELCACHE_TRUST", "any")
    root = tmp_path / "cache"
    key = key_of("any-modes")
    _mine(root, key, 0o666)
    os.link(root / f"{key}.bin", tmp_path / "elsewhere")
    assert kernelcache.Cache(root, readonly_roots=()).get(key, "bin").data == b"our code"


@pytest.mark.parametrize(
    "policy, umask, setgid, expected",
    [
        ("owner", 0o002, True, 0o644),
        ("owner", 0o000, False, 0o644),
        ("group", 0o002, True, 0o664),  # the README's recipe: group-writable, the root's group
        ("group", 0o000, True, 0o664),  # never writable by every user
        ("group", 0o002, False, 0o644),  # the file's group would not be the root's group
        ("group", 0o022, True, 0o644),
        ("any", 0o000, False, 0o666),
    ],
)
def test_new_entries_are_writable_only_by_the_trusted_set(
    tmp_path, monkeypatch, policy, umask, setgid, expected
):
    """What this process writes passes its own policy (and any stricter reader's of the same
    group): group write only where the file's group is the root directory's group."""
    monkeypatch.setenv("KERNELCACHE_TRUST", policy)
    root = tmp_path / "cache"
    root.mkdir()
    os.chown(root, 0, NOBODY)
    os.chmod(root, 0o2775 if setgid else 0o775)
    old = os.umask(umask)
    try:
        art = kernelcache.Cache(root, readonly_roots=()).put(key_of("modes"), "bin", b"x", {})
    finally:
        os.umask(old)
    for path in (art.path, root / f"{art.key}.json"):
        assert os.stat(path).st_mode & 0o777 == expected, oct(os.stat(path).st_mode)
    assert kernelcache.Cache(root, readonly_roots=()).get(art.key, "bin") is not None


# -- the README's group recipe under KERNELCACHE_TRUST=owner, with real users -------------------
OWNER_ROLE = """
import json, os, sys
os.umask(0o002)
import kernelcache
from kernelcache.store import digest
role, root = sys.argv[1], sys.argv[2]
keys = {n: n * 32 for n in ("a1", "b2", "c3", "d4")}
cache = kernelcache.Cache(root, readonly_roots=(), remote="")
path = lambda k, ext: os.path.join(root, f"{keys[k]}.{ext}")
out = {}

def forge(k, data):
    # rewrite the entry in place: the files keep their owner (the victim)
    with open(path(k, "json")) as f:
        doc = json.load(f)
    doc.update(size=len(data), digest=digest(data))
    if "entry_digest" in doc:
        from kernelcache.schema import entry_digest
        doc["entry_digest"] = entry_digest(doc)
    with open(path(k, "bin"), "r+b") as f:
        f.truncate(0)
        f.write(data)
    with open(path(k, "json"), "r+") as f:
        f.truncate(0)
        f.write(json.dumps(doc))

def attempt(name, fn):
    try:
        fn()
        out[name] = "done"
    except OSError as e:
        out[name] = e.__class__.__name__

if role == "victim":
    for k in keys:
        cache.get_or_create(keys[k], "bin", lambda k=k: (f"victim's {k}".encode(), {}))
    for k in ("c3", "d4"):  # as an older version left them under umask 002
        for ext in ("bin", "json"):
            os.chmod(path(k, ext), 0o664)
    out["modes"] = {k: oct(os.stat(path(k, "bin")).st_mode & 0o777) for k in keys}
elif role == "attacker":
    attempt("rewrite-a1", lambda: forge("a1", b"EVIL"))
    def relink(src, dst):
        os.unlink(path(dst, "bin"))
        os.link(path(src, "bin"), path(dst, "bin"))
        forge(dst, open(path(src, "bin"), "rb").read())
    attempt("link-a1-as-b2", lambda: relink("a1", "b2"))
    attempt("rewrite-c3", lambda: forge("c3", b"EVIL"))
    attempt("link-c3-as-d4", lambda: relink("c3", "d4"))
elif role == "victim2":
    for k in keys:
        got = cache.get(keys[k], "bin")
        out[k] = got.data.decode() if got else None
print(json.dumps(out))
"""


def test_owner_policy_with_the_group_recipe_and_real_users(shared_tmp):
    """Users daemon (the victim) and nobody (a member of the cache's group) share a root made
    by the README's recipe (root:4242, mode 2775, umask 002) under KERNELCACHE_TRUST=owner.
    nobody rewrites daemon's entries in place and plants hard links of one key's artifact under
    another key. daemon is never served anything nobody wrote or relinked: its new entries are
    not group-writable, and the group-writable ones an older version left are refused."""
    from support import CAN_SHARE, SHARE_GID

    if not CAN_SHARE:
        pytest.skip("needs root, unshare -m and setpriv (real users)")
    import json
    import subprocess
    import sys
    from pathlib import Path

    from support import other_users_env

    shared = shared_tmp
    group = shared / "group"
    group.write_text(Path("/etc/group").read_text() + f"kcshare:x:{SHARE_GID}:daemon,nobody\n")
    root = shared / "cache"
    root.mkdir()
    os.chown(root, 0, SHARE_GID)
    os.chmod(root, 0o2775)

    def as_user(uid: int, role: str) -> str:
        who = f"--reuid={uid} --regid={SHARE_GID} --init-groups"
        return f'setpriv {who} {sys.executable} -c "$ROLE" {role} {root}'

    script = "\n".join(
        [
            "set -e",
            f"mount --bind {group} /etc/group",
            as_user(1, "victim"),
            as_user(65534, "attacker"),
            as_user(1, "victim2"),
        ]
    )
    proc = subprocess.run(
        ["unshare", "-m", "sh", "-c", script],
        env=other_users_env(shared, ROLE=OWNER_ROLE, KERNELCACHE_TRUST="owner"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    victim, attacker, after = map(json.loads, proc.stdout.splitlines())
    assert victim["modes"] == {"a1": "0o644", "b2": "0o644", "c3": "0o664", "d4": "0o664"}
    # the entries written now cannot be rewritten in place by the group
    assert attacker["rewrite-a1"] == "PermissionError"
    assert attacker["link-a1-as-b2"] != "done"
    # the old group-writable ones can, and are refused
    assert attacker["rewrite-c3"] == "done"
    assert after["a1"] == "victim's a1"
    for k in ("b2", "c3", "d4"):
        assert after[k] in (None, f"victim's {k}"), (k, after)
    assert after["c3"] is None and after["d4"] is None
    assert "EVIL" not in json.dumps(after)
    assert "writable" in proc.stderr  # the refusal was explained
