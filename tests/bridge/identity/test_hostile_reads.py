"""A stored read set is hostile input: whatever its rows say, a check reads and compares and
never calls, never raises, and ends within a second.

The program is a trap: every way Python runs code of an object (a property, ``__getattr__``
of an object, a class and a module, a metaclass's ``__len__``/``__index__``/``__format__``/
``__instancecheck__``, an object's ``__hash__``/``__eq__``/``__len__``/``__index__``/
``__repr__``/``__mul__``, ``os.system``, ``__import__``) leaves a marker file. Its kernel
spells every name (in a branch the frontend never takes). The read sets are checked the way a
lookup checks them (:func:`bridge.readsets.read_sets.check`): a compile's own, then forged
ones, then rows drawn at random (hypothesis) from the names, operations and values a forger
would use. A forged call or built-in is decided by what found its callee and arguments: it
is never made, whatever it names.
"""

from __future__ import annotations

import json
import time
import tracemalloc
from typing import Any

import pytest
from bridge_helpers import kernel_module, machine_code
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from identity_targets import each_target

TRAP = """
import os
import types
import triton
import triton.language as tl

#: what ran (a list: the kernel stays one the bridge describes exactly, so its read set is used)
HIT = []


def trip(what):
    HIT.append(what)


class Meta(type):
    def __len__(cls):
        trip("meta-len")
        return 3

    def __index__(cls):
        trip("meta-index")
        return 3

    def __format__(cls, spec):
        trip("meta-format")
        return "x"

    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        trip("meta-getattr")
        return 1.0

    def __instancecheck__(cls, other):
        trip("meta-instancecheck")
        return True


class Reg(metaclass=Meta):
    SCALE = 2.0


class Trap:
    def __init__(self):
        self.value = 2.0

    @property
    def boom(self):
        trip("property")
        return 1.0

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        trip("getattr")
        return 1.0

    def __hash__(self):
        trip("hash")
        return 1

    def __eq__(self, other):
        trip("eq")
        return False

    def __len__(self):
        trip("len")
        return 1

    def __index__(self):
        trip("index")
        return 1

    def __repr__(self):
        trip("repr")
        return "Trap"

    def __mul__(self, other):
        trip("mul")
        return 1.0

    def __del__(self):
        pass


class Proxy:  # (an object that reads its own attributes, as a lazy module does)
    value = 2.0

    def __getattribute__(self, name):
        trip("getattribute")
        return object.__getattribute__(self, name)


class Masked:  # (an object that tells its own class)
    value = 2.0

    @property
    def __class__(self):
        trip("class-property")
        return int


class Wrapped(tl.constexpr):  # (a constexpr whose value is a property)
    @property
    def value(self):
        trip("constexpr-value-property")
        return self._value

    @value.setter
    def value(self, value):
        self._value = value


class Same:  # (a value with its own equality)
    def __eq__(self, other):
        trip("eq-of-a-closure")
        return False

    __hash__ = object.__hash__


def _closing():
    state = Same()

    def current():
        return state

    def rebind():
        nonlocal state
        state = Same()

    return current, rebind


TRAPPED = Trap()
TABLE = {"a": 1.0, TRAPPED: 2.0}
#: objects the frontend itself would run code of were they globals of the kernel's module (its
#: code generator asks each global whether it is a module): kept in a namespace of their own
cfg = types.ModuleType("cfg")
cfg.PROXY = Proxy()
cfg.MASKED = Masked()
cfg.WRAPPED = Wrapped(2.0)
BIG = tuple(float(i) for i in range(20000))
current, rebind = _closing()
NUMBERS = tl.constexpr((1.0, 2.0))


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    trip("module-getattr")
    return 1.0


def shell(command):
    trip("shell")
    return command


@triton.constexpr_function
def pick(n):
    if n == 7:
        raise SystemExit(3)
    if n == 5:
        raise KeyError("five")
    while n == 3:  # (a loop a forged argument starts: the check's deadline ends it)
        try:
            n = n + 0
        except BaseException:  # (code that swallows everything, even what stops it)
            pass
    return float(n) * 2.0


@triton.jit
def kernel(x_ptr, n, out_ptr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask) * pick(1) * NUMBERS[1]
    if BLOCK < 0:  # (never taken: the names are spelled, never read by the frontend)
        x = x * TRAPPED.boom * TRAPPED.missing * Reg.SCALE * Reg.absent * TABLE["a"]
        x = x * len(Reg) * TRAPPED.value * getattr(Reg, "nothing")
        x = pick(n=1, shell=1, system=1, value=1, exit=1, eval=1, __builtins__=1, __import__=1)
        x = x * pick(cfg=1, PROXY=1, MASKED=1, WRAPPED=1, BIG=1, current=1)
        trip = x  # (a local that is also the name of a function of the module)
        x = x * trip
    tl.store(out_ptr + offs, x, mask=mask)
"""
#: the CPU time a check may take: it reads and compares (what it may describe is bounded by
#: bridge.readsets.read_sets.MAX_PARTS), in well under a second; tracing allocations (as these
#: tests do) slows it several times
ENDS = 2.0
#: names the trap spells, and names it does not, for forged rows
NAMES = [
    "TRAPPED", "Reg", "TABLE", "NUMBERS", "os", "shell", "pick", "system", "path", "boom",
    "missing", "SCALE", "absent", "value", "tl", "exit", "nothing", "trip", "HIT", "append",
    "__import__", "__builtins__", "__class__", "__globals__", "__init__", "__call__", "eval",
]  # fmt: skip
#: values forged rows pass (large ones included)
VALUES = [
    ["i", "1"], ["i", "7"], ["i", "5"], ["i", "30000000"], ["i", str(10**19)], ["s", "a"],
    ["s", "touch /tmp/kc-owned"], ["f", "7ff8000000000000"], ["t", [["i", "1"], ["i", "2"]]],
    "N", ["b", 1], ["s", "x" * 200],
]  # fmt: skip


@pytest.fixture(scope="module", params=each_target())
def trap(tmp_path_factory, request) -> dict[str, Any]:
    """The trap compiled once for a target (each test runs on each): its kernel, what a check
    is given, and its own read set."""
    from bridge.identity import namespaces
    from bridge.vendors import backends, targets

    target = request.param
    base = tmp_path_factory.mktemp("trap")
    module = kernel_module(base, "hostile_trap_" + target.replace(":", "_"), TRAP)
    root = base / "root"
    code = machine_code(module.kernel, root, target=target)
    (text,) = [
        json.loads(p.read_text())["reads"]
        for p in root.glob("*.json")
        if "reads" in json.loads(p.read_text())
    ]
    backend = backends.make_backend(targets.parse_target(target))
    module.HIT.clear()  # (what the import and Triton's own dependency finder ran)
    return {
        "kernel": module.kernel,
        "given": {"BLOCK": 1024},
        "backend": backend,
        "modules": namespaces.module_map_of(backend),
        "text": text,
        "marks": module.HIT,
        "code": code,
        "target": target,
    }


@pytest.fixture(autouse=True)
def _nothing_ran_yet(trap: dict[str, Any]) -> None:
    trap["marks"].clear()


def _check(trap: dict[str, Any], text: str) -> tuple[Any, float]:
    from bridge.readsets import read_sets

    start = time.process_time()  # (CPU time: what the check spends, whatever load shares it)
    found = read_sets.check(text, trap["kernel"], trap["given"], trap["modules"], trap["backend"])
    return found, time.process_time() - start


def _forged(trap: dict[str, Any], rows: list[list[Any]]) -> str:
    """The trap's own read set with ``rows`` in place of its rows after the first few (what a
    forger who read the entry writes)."""
    doc = json.loads(trap["text"])
    doc["rows"] = [r for r in doc["rows"] if r[1] != "ir"][:4] + rows
    doc["partial"] = []
    return json.dumps(doc)


def _marks(trap: dict[str, Any]) -> list[str]:
    return sorted(trap["marks"])


def test_a_compiles_own_read_set_holds(trap):
    from bridge.entries import metadata

    assert metadata.problem(trap["text"]) is None
    found, _ = _check(trap, trap["text"])
    assert found.fresh, "the read set a compile wrote does not hold in the same process"
    assert _marks(trap) == []


#: forged rows, each of which would run code of the trap if a lookup made it as written
FORGED = {
    "import-through-builtins": [[0, "g", "__builtins__", "x"]],
    "os-system": [[-1, "g", "os", "x"], [4, "a", "system", "x"], [5, "c", [[["v", ["s", "true"]]], []], "x"]],
    "program-function-running-os-system": [[-1, "g", "shell", "x"], [4, "c", [[["v", ["s", "x"]]], []], "x"]],
    "property": [[-1, "g", "TRAPPED", "x"], [4, "a", "boom", "x"]],
    "object-getattr": [[-1, "g", "TRAPPED", "x"], [4, "a", "missing", "x"]],
    "module-getattr": [[-1, "g", "os", "x"], [4, "a", "absent", "x"]],
    "metaclass-getattr": [[-1, "g", "Reg", "x"], [4, "a", "absent", "x"]],
    "metaclass-len": [[-1, "g", "Reg", "x"], [-1, "b", ["len", [["r", 4]]], "x"]],
    "metaclass-instancecheck": [[-1, "g", "Reg", "x"], [-1, "b", ["isinstance", [["v", ["i", "1"]], ["r", 4]]], "x"]],
    "getattr-builtin-dunder": [[-1, "g", "Reg", "x"], [-1, "b", ["getattr", [["r", 4], ["v", ["s", "__class__"]]]], "x"]],
    "object-len": [[-1, "g", "TRAPPED", "x"], [-1, "b", ["len", [["r", 4]]], "x"]],
    "object-index": [[-1, "g", "TRAPPED", "x"], [-1, "b", ["range", [["r", 4]]], "x"]],
    "item-hash": [[-1, "g", "TABLE", "x"], [-1, "g", "TRAPPED", "x"], [4, "i", ["r", 5], "x"]],
    "huge-range-listed": [[-1, "b", ["range", [["v", ["i", "30000000"]]]], "x"], [-1, "b", ["list", [["r", 4]]], "x"]],
    "huge-power": [[-1, "g", "pick", "x"], [4, "c", [[["v", ["i", str(10**19)]]], []], "x"]],
    "system-exit": [[-1, "g", "pick", "x"], [4, "c", [[["v", ["i", "7"]]], []], "x"]],
    "a-program-error": [[-1, "g", "pick", "x"], [4, "c", [[["v", ["i", "5"]]], []], "x"]],
    "an-endless-loop": [[-1, "g", "pick", "x"], [4, "c", [[["v", ["i", "3"]]], []], "x"]],
    "unknown-operation": [[-1, "o", ["__pow__", [["v", ["i", "10"]], ["v", ["i", "30000000"]]]], "x"]],
    "isinstance-of-an-object-reading-its-attributes": [[-1, "g", "cfg", "x"], [4, "a", "PROXY", "x"], [-1, "g", "tl", "x"], [6, "a", "constexpr", "x"], [-1, "b", ["isinstance", [["r", 5], ["r", 7]]], "x"]],
    "isinstance-of-an-object-telling-its-class": [[-1, "g", "cfg", "x"], [4, "a", "MASKED", "x"], [-1, "g", "tl", "x"], [6, "a", "constexpr", "x"], [-1, "b", ["isinstance", [["r", 5], ["r", 7]]], "x"]],
    "constexpr-of-an-object-telling-its-class": [[-1, "g", "cfg", "x"], [4, "a", "MASKED", "x"], [-1, "g", "tl", "x"], [6, "a", "constexpr", "x"], [-1, "b", ["isinstance", [["rk", 5], ["r", 7]]], "x"]],
    "hasattr-of-an-object-reading-its-attributes": [[-1, "g", "cfg", "x"], [4, "a", "PROXY", "x"], [-1, "b", ["hasattr", [["r", 5], ["v", ["s", "value"]]]], "x"]],
    "a-call-of-a-name-the-kernel-only-has-as-a-local": [[-1, "g", "trip", "x"], [4, "c", [[["v", ["s", "chosen"]]], []], "x"]],
    "a-constexpr-whose-value-is-a-property-described": [[-1, "g", "cfg", "x"], [4, "a", "WRAPPED", "x"]],
    "a-constexpr-whose-value-is-a-property-in-a-constexpr": [[-1, "g", "cfg", "x"], [4, "a", "WRAPPED", "x"], [-1, "g", "tl", "x"], [6, "a", "constexpr", "x"], [-1, "b", ["isinstance", [["rk", 5], ["r", 7]]], "x"]],
    "a-call-given-a-constexpr-whose-value-is-a-property": [[-1, "g", "cfg", "x"], [4, "a", "WRAPPED", "x"], [-1, "g", "pick", "x"], [6, "c", [[["rk", 5]], []], "x"]],
    "a-large-value-held-over-and-over-then-large-keys": [[-1, "g", "BIG", "x"]] * 1500 + [[-1, "g", "TABLE", "x"]] + [[1504, "i", ["v", ["i", "2000000"]], "x"]] * 20,
    "a-large-value-read-over-and-over": [[-1, "g", "BIG", "x"]] * 1900,
    "ir-of-another-specialization": [[-1, "ir", {"gluon": False, "kind": ["triton", "x", "y"], "signature": [], "constants": [], "attrs": [], "options": []}, "x"]],
}  # fmt: skip


@pytest.mark.parametrize("rows", FORGED.values(), ids=FORGED.keys())
def test_a_forged_read_set_runs_no_code_raises_nothing_and_ends_in_time(trap, rows):
    text = _forged(trap, rows)
    tracemalloc.start()
    try:
        found, took = _check(trap, text)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    if any(op not in ("c", "b") for _, op, _, _ in rows):  # (calls alone are decided: held)
        assert not found.fresh, "a forged read set was found to hold"
    assert _marks(trap) == [], "a forged read set ran code of the program"
    assert took < ENDS and peak < 100 << 20


def test_a_closure_rebound_between_checks_is_compared_running_no_code(trap):
    """A process checks a read set reaching a function twice, the object it closes over
    rebound in between (the description memo compares what it held then with what it holds
    now): no ``__eq__`` of the program runs."""
    rows = [[-1, "g", "current", "x"]]
    module = __import__(trap["kernel"].fn.__module__)
    for _ in range(2):
        found, _ = _check(trap, _forged(trap, rows))
        assert not found.fresh
        module.rebind()
    assert _marks(trap) == []


@pytest.mark.parametrize("text", ['{"format":3,"rows":[],"partial":[]}', None])
def test_an_entry_without_reads_is_refused_not_served(trap, text):
    """No compile writes a read set without reads, nor an entry without a read set (every
    compile reads its kernel's source file): such an entry is refused, never used as it is
    (code changed since would be served its old kernel)."""
    from bridge.readsets import read_sets

    found = read_sets.stale([text], trap["kernel"], trap["given"], trap["backend"])
    assert found.kind == read_sets.REFUSED, found
    assert read_sets.stale([], trap["kernel"], trap["given"], trap["backend"]).kind == "refused"


def test_an_ir_read_the_lookup_is_not_for_is_refused_saying_so(trap):
    """The IR read runs Triton's frontend: only for a specialization the lookup computed
    itself, never one the stored data chose."""
    from bridge.readsets import read_sets

    text = _forged(trap, FORGED["ir-of-another-specialization"])
    found = read_sets.stale([text], trap["kernel"], trap["given"], trap["backend"], None, list)
    assert found.kind == read_sets.REFUSED and "specialization" in found.reason
    unchecked = read_sets.stale([text], trap["kernel"], trap["given"], trap["backend"])
    assert unchecked.kind == read_sets.UNCHECKED


def test_the_door_refuses_what_no_compile_writes(trap):
    """The schema's check of the ``reads`` field, at every door: a dunder, an operation no
    compile records, a value too large to be a kernel's."""
    from bridge.entries import metadata

    for rows in (
        FORGED["import-through-builtins"],
        FORGED["unknown-operation"],
        [[-1, "c", [[["v", ["s", "x" * 5000]]], []], "x"]],
        [[-1, "b", ["__import__", [["v", ["s", "os"]]]], "x"]],
        [[7, "g", "tl", "x"]],
        [[-1, "b", ["len", [["v", _nested_shape(400)]]], "x"]],
    ):
        assert metadata.problem(_forged(trap, rows)) is not None


def _nested_shape(depth: int) -> Any:
    """A block type's description nested ``depth`` deep (its element type another one)."""
    desc: Any = ["d", "fp32"]
    for _ in range(depth):
        desc = ["db", [desc, ["i", "1"]]]
    return desc


@st.composite
def _rows(draw: Any) -> list[list[Any]]:
    rows: list[list[Any]] = []
    for index in range(4, 4 + draw(st.integers(1, 8))):
        parent = draw(st.integers(-1, index - 1))
        op = draw(st.sampled_from(["g", "a", "i", "c", "b", "f", "d", "e", "p", "ir", "o"]))
        ref = ["r", draw(st.integers(0, index - 1))]
        value = ["v", draw(st.sampled_from(VALUES))]
        arg = draw(st.sampled_from([ref, value]))
        operand: Any = {
            "g": draw(st.sampled_from(NAMES)),
            "a": draw(st.sampled_from(NAMES)),
            "i": arg,
            "c": [draw(st.lists(st.sampled_from([ref, value]), max_size=3)), []],
            "b": [
                draw(
                    st.sampled_from(
                        ["len", "list", "range", "int", "float", "isinstance", "getattr", "hasattr"]
                    )
                ),
                draw(
                    st.lists(
                        st.sampled_from([ref, value, ["v", ["s", draw(st.sampled_from(NAMES))]]]),
                        max_size=3,
                    )
                ),
            ],
            "e": draw(st.sampled_from(["HOME", "SECRET", "PATH"])),
            "p": draw(st.sampled_from(["BLOCK", "x_ptr", "nope"])),
            "ir": None,
            "o": ["__mul__", [ref, value]],
        }.get(op, "")
        rows.append([parent, op, operand, "x"])
    return rows


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(rows=_rows())
def test_random_rows_run_no_code_and_raise_nothing(trap, rows):
    found, took = _check(trap, _forged(trap, rows))
    assert isinstance(found.kind, str)  # (a verdict, whatever the rows: nothing raised)
    assert _marks(trap) == [], f"rows {rows} ran code of the program"
    assert took < ENDS


def test_the_kernel_is_unchanged_by_the_attacks(trap, tmp_path):
    """After every attack (in this module's order), the trap still lowers to what a compile
    gives: nothing of it was changed by a check."""
    assert machine_code(trap["kernel"], tmp_path / "fresh", target=trap["target"]) == trap["code"]
    assert _marks(trap) == []


def test_an_environment_read_cannot_be_guessed_from_what_a_lookup_stores(trap, monkeypatch):
    """A forger plants a read of a variable the victim's process sets; what the victim then
    finds (and chains its next key from) is a digest keyed by the user's secret: testing every
    four-digit guess against it finds nothing, and no entry holds the value."""
    from bridge.readsets import read_sets
    from bridge.readsets.read_sets import _digest

    monkeypatch.setenv("KC_SECRET_PIN", "4821")
    doc = json.loads(_forged(trap, []))
    wants = [row[3] for row in doc["rows"]]
    doc["rows"].append([-1, "e", "KC_SECRET_PIN", _digest(["s", "0000"])])
    found, _ = _check(trap, json.dumps(doc))
    assert found.kind == read_sets.CHANGED
    guesses = {read_sets.reads_digest([*wants, _digest(["s", f"{n:04d}"])]) for n in range(10_000)}
    assert found.now not in guesses, "the victim's digest tells the value to whoever guesses it"
    now = read_sets.wants(
        json.dumps(doc), trap["kernel"], trap["given"], trap["modules"], trap["backend"]
    )
    assert isinstance(now, list) and not any("4821" in w for w in now)


def test_reads_that_only_code_would_answer_run_no_code():
    """:func:`bridge.identity.static_reads.attribute` on everything that would run code: a
    property, ``__getattr__`` of an object, a class (its metaclass) and a module, a
    ``__getattribute__`` of its own, a ``__dict__`` of its own; what plain lookups find is
    found."""
    import types

    from bridge.readsets.static_access import RUNS_CODE, attribute

    ran: list[str] = []

    class Meta(type):
        def __getattr__(cls, name):
            ran.append("meta")
            return 1

    class Plain(metaclass=Meta):
        x = 1

        @property
        def p(self):
            ran.append("property")
            return 1

        def __getattr__(self, name):
            ran.append("getattr")
            return 1

        def method(self):
            return 1

    class Sly:
        def __getattribute__(self, name):
            ran.append("getattribute")
            return 1

    module = types.ModuleType("sly_module")

    def module_getattr(name):
        ran.append("module")
        return 1

    module.__getattr__ = module_getattr  # type: ignore[attr-defined]
    module.y = 2  # type: ignore[attr-defined]
    obj = Plain()
    assert attribute(obj, "p") is RUNS_CODE and attribute(obj, "missing") is RUNS_CODE
    assert attribute(Plain, "missing") is RUNS_CODE and attribute(Sly(), "x") is RUNS_CODE
    assert attribute(module, "missing") is RUNS_CODE and attribute(module, "y") == 2
    assert attribute(Plain, "x") == 1 and attribute(obj, "method").__func__ is Plain.method
    assert ran == []
