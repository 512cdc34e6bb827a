"""Misconfiguration is found early and said once, with the remedy, through the real command line
and real jobs: read-only roots that are relative or missing, a remote that refuses connections
(doctor connects), bad tier settings (a signing key too short to sign with, a remote URL with
a typo: the job runs, its remote tier off, one warning naming the variable), a writable root
that is not a directory (one warning per problem, however many kernels), doctor's checks
whatever other variables hold, misspelled variables, JAX's cache settings in doctor, the
CPU-lowering message, and log lines with one prefix."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from cli_support import kc, put
from redis_server import REDIS_SERVER, SKIP_REASON, RedisServer, free_port
from support import REPO, child_env

KEY = "0123456789abcdef0123"

# A job that opens the default cache twice and reads and writes one entry.
JOB = """
import kernelcache
for _ in range(2):
    cache = kernelcache.Cache()
    art = cache.put("ab" * 16, "bin", b"x", {})
    assert cache.get("ab" * 16, "bin").data == b"x"
print("remote:", cache.remote)
"""


def _job(**env: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, "-c", JOB], env=child_env(**env), capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    return proc


def _doctor(root, **env: str) -> tuple[int, dict[str, dict[str, str]], str]:
    """doctor's exit code, its checks by name, and its human text."""
    proc = kc(root, "doctor", "--json", env=env)
    checks = {c["name"]: c for c in json.loads(proc.stdout)["checks"]}
    return proc.returncode, checks, kc(root, "doctor", env=env).stdout


def test_missing_and_relative_read_only_roots_are_warned_once_in_the_job(tmp_path):
    dirs = f"{tmp_path / 'doesnotexist'}:relative/layer"
    proc = _job(KERNELCACHE_DIR=str(tmp_path / "c"), KERNELCACHE_READONLY_DIRS=dirs)
    lines = proc.stderr.splitlines()
    missing = [line for line in lines if "doesnotexist does not exist" in line]
    relative = [line for line in lines if "'relative/layer' is a relative path" in line]
    assert len(missing) == 1 and len(relative) == 1, proc.stderr
    assert missing[0].startswith("kernelcache: KERNELCACHE_READONLY_DIRS: ")
    assert "fix the path, or remove it" in missing[0] and "give an absolute path" in relative[0]


@pytest.mark.parametrize(
    "value, said",
    [
        ("$HOME/kc", "'$HOME/kc' holds '$HOME', which no shell expanded"),
        ("relative/kc", "'relative/kc' is a relative path, read from the current directory"),
        ("{tmp}/${{USER}}/kc", "holds '${{USER}}', which no shell expanded"),
    ],
)
def test_a_relative_or_unexpanded_root_is_warned_as_a_read_only_one_is(tmp_path, value, said):
    """Used as given, as a read-only root is (the job's cache works where it leads), and said:
    once in a job, by every command that the variable names the root for, and as a failed
    check by doctor."""
    value = value.format(tmp=tmp_path)
    said = said.format(tmp=tmp_path)
    env = {"KERNELCACHE_DIR": value}
    job = subprocess.run(
        [sys.executable, "-c", JOB],
        env=child_env(**env),
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert job.returncode == 0, job.stderr
    warned = [line for line in job.stderr.splitlines() if said in line]
    assert len(warned) == 1, job.stderr  # two caches opened, said once
    assert warned[0].startswith("kernelcache: KERNELCACHE_DIR: ")
    listed = kc(None, "ls", env=env, cwd=tmp_path)
    assert listed.returncode == 0 and "1 kernel" in listed.stdout, listed.stderr
    assert (
        f"kernelcache: WARNING: KERNELCACHE_DIR: {value!r}" in listed.stderr
        and said in listed.stderr
    )
    doctor = kc(None, "doctor", "--json", env=env, cwd=tmp_path)
    check = {c["name"]: c for c in json.loads(doctor.stdout)["checks"]}["KERNELCACHE_DIR"]
    assert doctor.returncode == 1 and check["status"] == "fail" and said in check["detail"]
    given = kc(value, "ls", cwd=tmp_path)  # --root is the operator's own: as typed
    assert given.returncode == 0 and "KERNELCACHE_DIR" not in given.stderr


def test_doctor_checks_every_read_only_root(tmp_path):
    full, empty = tmp_path / "full", tmp_path / "empty"
    put(full, "k")
    empty.mkdir()
    dirs = ":".join([str(full), str(empty), str(tmp_path / "gone"), "relative"])
    code, checks, human = _doctor(tmp_path / "c", KERNELCACHE_READONLY_DIRS=dirs)
    assert code == 1
    assert checks[f"read-only {full}"] == {
        "name": f"read-only {full}",
        "status": "ok",
        "detail": "entries: 1",
    }
    assert checks[f"read-only {empty}"]["status"] == "warn"
    assert "holds no entries" in checks[f"read-only {empty}"]["detail"]
    assert checks[f"read-only {tmp_path / 'gone'}"]["status"] == "fail"
    assert "relative path" in checks["read-only relative"]["detail"]
    assert f"[fail] read-only {tmp_path / 'gone'}: KERNELCACHE_READONLY_DIRS:" in human


@pytest.mark.skipif(REDIS_SERVER is None, reason=SKIP_REASON)
def test_doctor_connects_to_each_remote_tier(tmp_path):
    refused = f"redis://127.0.0.1:{free_port()}/0?timeout=0.5"
    started = time.monotonic()
    code, checks, _ = _doctor(tmp_path / "c", KERNELCACHE_REMOTE=refused)
    assert time.monotonic() - started < 30
    (check,) = [c for name, c in checks.items() if name.startswith("remote ")]
    assert code == 1 and check["status"] == "fail", check
    assert "does not answer" in check["detail"] and "Connection refused" in check["detail"]
    assert "start the server, or fix KERNELCACHE_REMOTE" in check["detail"]
    with RedisServer(tmp_path / "redis") as srv:
        code, checks, _ = _doctor(tmp_path / "c", KERNELCACHE_REMOTE=srv.url)
    (check,) = [c for name, c in checks.items() if name.startswith("remote ")]
    assert check["status"] == "ok" and check["detail"].startswith("answers ("), check


def test_a_short_signing_key_turns_the_remote_tier_off_with_one_warning(tmp_path):
    env = {
        "KERNELCACHE_DIR": str(tmp_path / "c"),
        "KERNELCACHE_REMOTE": f"redis://127.0.0.1:{free_port()}/0",
        "KERNELCACHE_SIGNING_KEY": "short",
    }
    proc = _job(**env)
    assert "remote: None" in proc.stdout  # off: never unsigned values instead
    warnings = [line for line in proc.stderr.splitlines() if "signing key" in line]
    assert len(warnings) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "KERNELCACHE_SIGNING_KEY: a signing key must be at least 16 bytes" in warnings[0]
    assert "the remote tier is off until the key is fixed" in warnings[0]
    assert "short" not in warnings[0].replace("shorter", "")
    code, checks, _ = _doctor(tmp_path / "c", KERNELCACHE_SIGNING_KEY="short")
    assert code == 1 and checks["KERNELCACHE_SIGNING_KEY"]["status"] == "fail"
    assert "at least 16 bytes" in checks["KERNELCACHE_SIGNING_KEY"]["detail"]
    signed = _job(**dict(env, KERNELCACHE_SIGNING_KEY=KEY))
    assert "remote: None" not in signed.stdout and "signing key" not in signed.stderr


@pytest.mark.skipif(REDIS_SERVER is None, reason=SKIP_REASON)
def test_a_remote_url_with_a_typo_turns_the_tier_off_with_one_warning(tmp_path):
    with RedisServer(tmp_path / "redis") as srv:
        typo = f"{srv.url}?timout=1"
        proc = _job(KERNELCACHE_DIR=str(tmp_path / "c"), KERNELCACHE_REMOTE=typo)
        assert "remote: None" in proc.stdout and "Traceback" not in proc.stderr
        warnings = [line for line in proc.stderr.splitlines() if "KERNELCACHE_REMOTE" in line]
        assert len(warnings) == 1, proc.stderr
        assert "unknown option 'timout'" in warnings[0]
        assert "the remote tier is off until it is fixed" in warnings[0]
        assert srv.client().dbsize() == 0  # nothing went to the tier
        # doctor fails the variable's check; stats --remote says why the tier is not there
        stats = kc(tmp_path / "c", "stats", "--remote", env={"KERNELCACHE_REMOTE": typo})
        assert "unknown option 'timout'" in stats.stdout
        code, checks, _ = _doctor(tmp_path / "c", KERNELCACHE_REMOTE=typo)
        assert code == 1 and checks["KERNELCACHE_REMOTE"]["status"] == "fail"
        fixed = _job(KERNELCACHE_DIR=str(tmp_path / "c"), KERNELCACHE_REMOTE=srv.url)
        assert "remote: None" not in fixed.stdout and srv.client().dbsize() > 0


@pytest.mark.skipif(REDIS_SERVER is None, reason=SKIP_REASON)
def test_doctor_checks_each_setting_whatever_the_others_hold(tmp_path):
    """A bad variable does not hide the checks of the others (read-only roots, the remote
    tier), and a misspelled one is named with the variable meant."""
    full = tmp_path / "layer"
    put(full, "k")
    gone = tmp_path / "gone"
    with RedisServer(tmp_path / "redis") as srv:
        code, checks, human = _doctor(
            tmp_path / "c",
            KERNELCACHE_LOCK_TIMEOUT="abc",
            KERNELCACHE_READONLY_DIRS=f"{full}:{gone}",
            KERNELCACHE_REMOTE=srv.url,
            KERNELCACHE_MAXSIZE="10G",
        )
    assert code == 1
    assert checks["KERNELCACHE_LOCK_TIMEOUT"]["status"] == "fail"
    assert checks[f"read-only {full}"]["status"] == "ok"
    assert checks[f"read-only {gone}"]["status"] == "fail"
    assert checks["KERNELCACHE_READONLY_DIRS"]["status"] == "fail"
    assert str(gone) in checks["KERNELCACHE_READONLY_DIRS"]["detail"]
    assert checks[f"remote {srv.url}"]["status"] == "ok"
    misspelled = checks["KERNELCACHE_MAXSIZE"]
    assert misspelled["status"] == "warn"
    assert "did you mean KERNELCACHE_MAX_SIZE?" in misspelled["detail"]
    assert "[warn] KERNELCACHE_MAXSIZE: no such variable" in human


# A job that lowers the kernels named in argv[1] (each a name of kmod.py) for cuda:90 on the CPU.
KERNELS = """
import triton
import triton.language as tl


@triton.jit
def scale(x_ptr, n, out_ptr, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + i, tl.load(x_ptr + i, mask=i < n) * 3, mask=i < n)


@triton.jit
def shift(x_ptr, n, out_ptr, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + i, tl.load(x_ptr + i, mask=i < n) + 5, mask=i < n)
"""
LOWER = """
import sys
import jax, jax.numpy as jnp
import bridge, kmod

x = jax.ShapeDtypeStruct((1024,), jnp.float32)
for name in sys.argv[1].split(","):
    for block in (64, 128, 256):
        def f(x, kernel=getattr(kmod, name), block=block):
            return bridge.triton_call(
                x, x.size, kernel=kernel, out_shape=x, grid=(1024 // block,), BLOCK=block,
                target="cuda:90",
            )
        jax.jit(f).trace(x).lower(lowering_platforms=("cuda",))
print("lowered")
"""


def test_a_root_that_is_a_file_is_warned_about_once_per_problem(tmp_path):
    pytest.importorskip("jax", reason="lowers kernels")
    (tmp_path / "kmod.py").write_text(KERNELS)
    not_a_dir = tmp_path / "passwd"
    not_a_dir.write_text("root:x:0:0\n")

    def warnings(kernels: str) -> list[str]:
        proc = subprocess.run(
            [sys.executable, "-c", LOWER, kernels],
            env=child_env(KERNELCACHE_DIR=str(not_a_dir)),
            capture_output=True,
            text=True,
            cwd=str(tmp_path),
            timeout=300,
        )
        assert proc.returncode == 0 and "lowered" in proc.stdout, proc.stderr
        return [line for line in proc.stderr.splitlines() if line.startswith("kernelcache:")]

    one, six = warnings("scale"), warnings("scale,shift")
    assert len(six) == len(one), (one, six)  # 3 kernels or 6: the same warnings
    assert sum(str(not_a_dir) in line for line in six) == len(six)
    assert sum("cannot store" in line or "in-memory" in line for line in six) == 1, six


def test_doctor_shows_the_jax_cache_settings(tmp_path):
    pytest.importorskip("jax", reason="the settings are JAX's")
    jax_dir = str(tmp_path / "jax-cache")
    env = {"JAX_COMPILATION_CACHE_DIR": jax_dir, "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}
    doc = json.loads(kc(tmp_path / "c", "doctor", "--json", env=env).stdout)
    assert doc["jax_cache"]["jax_compilation_cache_dir"] == jax_dir
    assert doc["jax_cache"]["jax_persistent_cache_min_compile_time_secs"] == "0"
    assert doc["jax_cache"]["jax_compilation_cache_max_size"] is None  # JAX's default
    check = {c["name"]: c for c in doc["checks"]}["jax cache"]
    assert check["status"] == "ok"
    assert check["detail"] == f"dir {jax_dir}, min compile time (s) 0, JAX's defaults for the rest"
    human = kc(tmp_path / "c", "doctor").stdout
    said = next(line for line in human.splitlines() if "jax cache" in line)
    assert "off in this environment (JAX_COMPILATION_CACHE_DIR is unset)" in said, said
    assert "(default)" not in said and "bridge.enable_jax_cache()" in said


def test_lowering_for_cpu_says_the_whole_remedy(tmp_path):
    pytest.importorskip("jax", reason="lowers a JAX computation")
    code = """
import jax, jax.numpy as jnp
from examples import ops
try:
    jax.jit(lambda x: ops.add(x, x)).lower(jax.ShapeDtypeStruct((8,), jnp.float32))
except Exception as e:
    print(str(e).splitlines()[-1])
"""
    proc = subprocess.run(
        [sys.executable, "-c", code],
        env=child_env(KERNELCACHE_DIR=str(tmp_path / "c")),
        capture_output=True,
        text=True,
        cwd=str(REPO),
    )
    assert "being lowered for cpu" in proc.stdout, proc.stdout + proc.stderr
    assert proc.stdout.rstrip().endswith(
        "and a target (target='cuda:90' or 'hip:gfx942', or $KERNELCACHE_TARGET)"
    ), proc.stdout


def test_log_lines_carry_one_prefix(tmp_path):
    manifest = tmp_path / "empty.jsonl"
    manifest.write_text("")
    proc = kc(tmp_path / "c", "warm", str(manifest), "--target", "cuda:90")
    assert proc.returncode == 0, proc.stderr
    assert f"kernelcache: WARNING: {manifest} holds no records" in proc.stderr
    assert "kernelcache: WARNING: kernelcache:" not in proc.stderr


# A job that lowers one Triton kernel through the bridge (from the repository's examples).
ADD = """
import jax, jax.numpy as jnp
import bridge
from examples.kernels import add_kernel
x = jax.ShapeDtypeStruct((4096,), jnp.float32)
def step(a, b):
    return bridge.triton_call(a, b, 4096, kernel=add_kernel, out_shape=x, grid=(4,), BLOCK=1024,
                              target="cuda:90")
text = jax.jit(step).trace(x, x).lower(lowering_platforms=("cuda",)).as_text()
print("lowered", "triton_kernel_call" in text)
"""


@pytest.mark.parametrize(
    "name,value,cache_on",
    [
        ("KERNELCACHE_LOCK_TIMEOUT", "abc", True),
        ("KERNELCACHE_EMBED", "bogus", True),
        ("KERNELCACHE_DIR", "~no-such-user-here/kc", False),
    ],
)
def test_a_variable_that_cannot_be_used_never_fails_a_job_and_fails_every_command_reading_it(
    tmp_path, name, value, cache_on
):
    """In a job: said once, naming the variable, and it costs only itself (its default; a
    root that cannot be read turns the cache off in that process: kernels compile in memory).
    In every command that uses it: a usage error naming it (doctor fails its check); in the
    others, said, and they run (no operator's command waits for a lock: the lock timeout is
    the jobs'); the bridge's variables are read by the bridge's commands (warm), not the
    operator's."""
    root = tmp_path / "root"
    proc = subprocess.run(
        [sys.executable, "-c", ADD],
        env=child_env(**{"KERNELCACHE_DIR": str(root), name: value}),
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    assert proc.returncode == 0 and "lowered True" in proc.stdout, proc.stderr
    said = [line for line in proc.stderr.splitlines() if f"{name}='{value}'" in line]
    assert len(said) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert ("the cache is off" in said[0]) != cache_on
    assert "the other settings apply" in said[0]
    entries = list(root.glob("*.json")) if root.exists() else []
    assert bool(entries) == cache_on
    root.mkdir(exist_ok=True)
    commands = [["ls"], ["stats"], ["verify"], ["prune", "--dry-run"]]
    uses = name == "KERNELCACHE_DIR"  # every one of them works on the root
    if name == "KERNELCACHE_EMBED":  # the bridge's: read by its commands alone
        (root / "empty.jsonl").write_text("")
        commands = [["warm", str(root / "empty.jsonl"), "--target", "cuda:90"]]
        uses = True
    for command in commands:
        cli = kc(root, *command, env={name: value})
        assert cli.returncode == (2 if uses else 0), (command, cli.stderr)
        assert f"{name}='{value}'" in cli.stderr, (command, cli.stderr)
    code, checks, _ = _doctor(root, **{name: value})
    assert code == 1 and checks[name]["status"] == "fail"


def test_one_bad_variable_leaves_the_others_in_effect_in_a_job(tmp_path):
    """A bad embedding mode and a bad size cap beside a good target and a record file: the job
    lowers for the target it was given, records, caches, and says each bad one once."""
    root, manifest = tmp_path / "root", tmp_path / "kernels.jsonl"
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            ADD.replace(',\n                              target="cuda:90"', ""),
        ],
        env=child_env(
            KERNELCACHE_DIR=str(root),
            KERNELCACHE_EMBED="bogus",
            KERNELCACHE_TARGET="cuda:90",
            KERNELCACHE_RECORD=str(manifest),
            KERNELCACHE_MAX_SIZE="banana",
        ),
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    assert proc.returncode == 0 and "lowered True" in proc.stdout, proc.stderr
    for bad in ("KERNELCACHE_EMBED='bogus'", "KERNELCACHE_MAX_SIZE='banana'"):
        said = [line for line in proc.stderr.splitlines() if bad in line]
        assert len(said) == 1 and "its default" in said[0], proc.stderr
    assert "set KERNELCACHE_TARGET" not in proc.stderr
    (record,) = [json.loads(line) for line in manifest.read_text().splitlines()]
    assert record["target"] == "cuda:90", record
    assert list(root.glob("*.json"))  # the cache on, with no cap
