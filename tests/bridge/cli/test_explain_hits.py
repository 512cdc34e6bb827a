"""Explained hits, through the real command line: a process lowers a kernel (recording its
manifest) into a root, then ``kernelcache explain`` says which entry a lowering uses, under
the call's key or chained from it, what its reads find, why its read set is partial, and for
an entry whose reads find something else now, which reads differ; an environment variable's
value is never shown."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path
from typing import Any

import pytest
from bridge_helpers import kernel_source, run_child
from cli_support import kc_code
from support import HELPERS, REPO

#: lowers ``kernel`` of the module ``$EXH_MODULE`` for cuda:90 into ``$KERNELCACHE_DIR``,
#: recording the call in ``$KERNELCACHE_RECORD``
CHILD = f"""
import json, os, sys
sys.path[:0] = [os.environ["EXH_SRC"], {str(HELPERS)!r}]
import jax, jax.numpy as jnp
import bridge
from bridge_helpers import custom_calls, lowered_module
mod = __import__(os.environ["EXH_MODULE"], fromlist=["kernel"])
x = jax.ShapeDtypeStruct((4096,), jnp.float32)
fn = lambda x: bridge.triton_call(
    x, x.size, kernel=mod.kernel, out_shape=x, grid=(4,), BLOCK=1024, target="cuda:90")
(call,) = custom_calls(lowered_module(fn, x, platform="cuda"))
print(json.dumps("lowered"))
"""


class Program:
    """A kernel module (and its helpers) under ``tmp/src``, lowered into ``tmp/root``."""

    def __init__(self, tmp: Path, module: str, files: dict[str, str]) -> None:
        self.src, self.root, self.module = tmp / "src", tmp / "root", module
        self.manifest = tmp / "manifest.jsonl"
        self.src.mkdir()
        self.write(files)

    def write(self, files: dict[str, str]) -> None:
        for name, text in files.items():
            (self.src / f"{name}.py").write_text(textwrap.dedent(text))

    def lower(self, record: bool = True, **env: str) -> None:
        """Lower the kernel into the root, recording the call (a process that records stores
        no lowering: each lowering goes to the manifest), or not."""
        if record:
            env["KERNELCACHE_RECORD"] = str(self.manifest)
        run_child(
            CHILD,
            EXH_SRC=str(self.src),
            EXH_MODULE=self.module,
            KERNELCACHE_DIR=str(self.root),
            PYTHONDONTWRITEBYTECODE="1",
            **env,
        )

    def explain(self, *args: str, code: int, **env: str) -> str:
        return kc_code(
            "--root",
            str(self.root),
            "explain",
            str(self.manifest),
            *args,
            code=code,
            PYTHONPATH=f"{REPO}{os.pathsep}{self.src}",
            PYTHONDONTWRITEBYTECODE="1",
            **env,
        ).stdout

    def result(self, code: int, **env: str) -> dict[str, Any]:
        (found,) = json.loads(self.explain("--json", code=code, **env))["results"]
        return found

    def files(self) -> dict[str, bytes]:
        return {p.name: p.read_bytes() for p in self.root.iterdir() if p.is_file()}


def rows(reads: list[dict[str, Any]], op: str | None = None) -> list[tuple[str, str]]:
    return [(r["op"], r["operand"]) for r in reads if op is None or r["op"] == op]


def differing(passed: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {k: r[k] for k in ("op", "operand", "was", "now")} for r in passed["reads"] if not r["same"]
    ]


HELPER = "SCALE = {}\n"
KERNEL = kernel_source("import exh_helper as helper", "x * helper.SCALE")


@pytest.fixture
def helped(tmp_path) -> Program:
    """A kernel that reads ``SCALE`` of a helper module, lowered once."""
    program = Program(
        tmp_path, "exh_kernel", {"exh_helper": HELPER.format(2.0), "exh_kernel": KERNEL}
    )
    program.lower()
    return program


def test_a_hit_under_its_key_names_the_entry_and_counts_its_reads(helped):
    result = helped.result(code=0)
    assert result["status"] == "hit" and result["layer"] == "local"
    assert (result["entry"], result["hops"]) == (result["key"], 0)
    assert (helped.root / f"{result['entry']}.json").exists()
    reads = result["reads"]
    assert reads["count"] == len(reads["rows"]) == sum(reads["by_kind"].values())
    assert reads["by_kind"]["global"] >= 2 and reads["by_kind"]["source file"] == 1
    assert ("a", "helper.SCALE") in rows(reads["rows"]) and all(r["same"] for r in reads["rows"])
    assert result["partial"] == [] and result["differs"] == []
    text = helped.explain(code=0)
    assert f"local, entry {result['key'][:16]} under its key" in text
    assert f"{reads['count']} reads, each finds what it found: 1 source file, " in text
    assert "helper.SCALE" not in text  # (each read is listed with --reads only)
    listed = helped.explain("--reads", code=0)
    assert "a  helper.SCALE: same" in listed and "g  helper: same" in listed


def _lowering_files(root: Path) -> set[str]:
    return {p.name.split(".")[0] for p in root.glob("*.lowering")}


def test_a_hit_names_the_stored_lowering_a_warm_lowering_is_served_from(helped):
    """The common warm hit is a stored lowering: explain names the one embedding the entry
    (it holds the entry's read set; none while only a recording process lowered it), and after the helper changed and the new version was
    lowered, the new lowering, not the old one, whose read set is another."""
    assert helped.result(code=0)["lowerings"] == [] and not _lowering_files(helped.root)
    helped.lower(record=False)
    (stored,) = helped.result(code=0)["lowerings"]
    assert stored["layer"] == "local" and {stored["key"]} == _lowering_files(helped.root)
    text = helped.explain(code=0)
    assert f"embedded by stored lowerings {stored['key'][:16]} (local): a warm lowering" in text
    helped.write({"exh_helper": HELPER.format(3.0)})
    assert helped.result(code=1)["lowerings"] == []  # a miss names none
    helped.lower(record=False)
    (again,) = helped.result(code=0)["lowerings"]
    assert again["key"] != stored["key"]
    assert _lowering_files(helped.root) == {stored["key"], again["key"]}


def test_a_changed_helper_constant_misses_then_hits_the_entry_chained_from_the_key(helped):
    """After the helper's constant changed, the entry under the key is passed (its read of
    ``helper.SCALE`` found 2.0, finds 3.0 now); once a process lowered the new version into
    the same root, a lowering uses the entry one hop from the key."""
    key = helped.result(code=0)["key"]
    helped.write({"exh_helper": HELPER.format(3.0)})
    before = helped.files()
    miss = helped.result(code=1)
    assert miss["status"] == "miss" and miss["key"] == key and miss["entry"] is None
    assert miss["nearest"] is None
    (passed,) = miss["differs"]
    assert (passed["key"], passed["hops"], passed["layer"]) == (key, 0, "local")
    expected = [{"op": "a", "operand": "helper.SCALE", "was": "2.0", "now": "3.0"}]
    assert differing(passed) == expected
    text = helped.explain(code=1)
    assert "its reads find something else now" in text
    assert f"the entry under its key ({key[:16]}, local) was compiled from other reads: " in text
    assert "helper.SCALE was 2.0, now 3.0" in text
    assert helped.files() == before  # explain writes nothing

    helped.lower()
    hit = helped.result(code=0)
    assert hit["status"] == "hit" and hit["key"] == key and hit["hops"] == 1
    assert hit["entry"] != key and (helped.root / f"{hit['entry']}.json").exists()
    assert all(r["same"] for r in hit["reads"]["rows"])
    (passed,) = hit["differs"]
    assert passed["key"] == key and differing(passed) == expected
    text = helped.explain(code=0)
    assert f"entry {hit['entry'][:16]} 1 hop from its key" in text
    assert "helper.SCALE was 2.0, now 3.0" in text


LAZY = """
def __getattr__(name):
    if name == "SCALE":
        return 2.0
    raise AttributeError(name)
"""


def test_a_partial_read_set_says_why_and_that_the_ir_decides(tmp_path):
    """A module whose ``SCALE`` its ``__getattr__`` makes: the witness cannot follow it, so the
    read set is partial and ends with the IR, made again at each lookup."""
    kernel = kernel_source("import exh_lazy as lazy", "x * lazy.SCALE")
    program = Program(tmp_path, "exh_partial", {"exh_lazy": LAZY, "exh_partial": kernel})
    program.lower()
    result = program.result(code=0)
    assert result["status"] == "hit" and result["hops"] == 0
    assert any("__getattr__" in why for why in result["partial"]), result["partial"]
    assert rows(result["reads"]["rows"])[-1][0] == "ir" and result["reads"]["by_kind"]["IR"] == 1
    text = program.explain("--reads", code=0)
    assert "the read set is partial (" in text and "__getattr__" in text
    assert "the IR decides (Triton's frontend is run again at each lookup)" in text
    assert "ir the IR Triton's frontend gives for this specialization: same" in text


ENVIRON = """
import os
import triton


@triton.constexpr_function
def scale():
    return 2.0 if os.environ["EXH_TOKEN"] else 1.0
"""
SECRET, OTHER = "s3cret-token-4821", "0ther-token-9307"


def test_reads_name_an_environment_variable_and_never_show_its_value(tmp_path):
    kernel = kernel_source("from exh_scale import scale", "x * scale()")
    program = Program(tmp_path, "exh_env", {"exh_scale": ENVIRON, "exh_env": kernel})
    program.lower(EXH_TOKEN=SECRET)
    same = program.result(code=0, EXH_TOKEN=SECRET)
    assert same["status"] == "hit" and ("e", "EXH_TOKEN") in rows(same["reads"]["rows"])
    said = [
        program.explain("--reads", code=0, EXH_TOKEN=SECRET),
        json.dumps(same),
    ]
    assert "e  EXH_TOKEN: same" in said[0] and "c  scale(): same" in said[0]
    # another value: the read differs, and neither value is shown
    miss = program.result(code=1, EXH_TOKEN=OTHER)
    (passed,) = miss["differs"]
    assert differing(passed) == [{"op": "e", "operand": "EXH_TOKEN", "was": None, "now": None}]
    text = program.explain("--reads", code=1, EXH_TOKEN=OTHER)
    assert "e  EXH_TOKEN: differs" in text
    said += [text, json.dumps(miss)]
    for output in said:
        assert SECRET not in output and OTHER not in output


def test_what_a_read_set_holds_is_shown_short_and_printable():
    """A read set is anyone's: what it holds is shown printable and short, plain values as
    Python writes them, a described object not at all, an environment variable never."""
    from bridge.cli import lookups

    rows = [
        (-1, "g", "helper", '["module"]'),
        (0, "a", "SCALE", '["f","0000000000000040"]'),
        (0, "a", "NAME", '["s","a\\u001b[2Jb"]'),
        (0, "c", [[["v", ["i", "3"]], ["r", 1]], [["k", ["v", "N"]]]], "0" * 32),
        (-1, "e", "EXH_TOKEN", "k:" + "1" * 32),
    ]
    now = [rows[0][3], '["f","0000000000000840"]', '["s","x"]', "1" * 32, "k:" + "2" * 32]
    reads = lookups._reads(rows, now)
    assert [r.text() for r in reads] == [
        "g  helper: same",
        "a  helper.SCALE: was 2.0, now 3.0",
        "a  helper.NAME: was 'a\\x1b[2Jb', now 'x'",
        "c  helper(3, helper.SCALE, k=None): differs",
        "e  EXH_TOKEN: differs",
    ]
    assert all(r.now is None and r.was is None for r in reads[3:])
    assert lookups.summary(reads) == "1 global, 2 attributes, 1 call, 1 environment variable"


def test_an_entry_without_the_ptx_it_was_built_from_is_a_miss(helped):
    """A lowering compiles a kernel whose PTX companion is gone (pruned) again: explain says
    so rather than naming the entry it cannot use."""
    assert helped.result(code=0)["status"] == "hit"
    (companion,) = helped.root.glob("*.ptx")
    companion.unlink()
    miss = helped.result(code=1)
    assert miss["status"] == "miss" and miss["entry"] is None and miss["differs"] == []
    assert "not the PTX it was built from" in helped.explain(code=1)
