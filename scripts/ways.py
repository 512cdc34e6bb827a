"""The way of a value through the project: which modules a kernel key, or a cache root, passes
through during a real run, measured by tracing the run, not by reading the source.

    .venv-test/bin/python scripts/ways.py key      # a kernel key, triton_call -> the store
    .venv-test/bin/python scripts/ways.py prune    # the root of `kernelcache prune`
    .venv-test/bin/python scripts/ways.py key prune --json ways.json

:func:`trace` runs a function under :func:`sys.setprofile` (every thread the run starts too) and
records, for each traced value, the events of the project's modules (``kernelcache``, ``bridge``
and their submodules, by the ``__name__`` of the function's globals) that carry it;
:meth:`Trace.way` (or :func:`way`, both in one) reads one value's way from them.

The measure
-----------

*Carrying.* An object carries the value when it is the value (a string equal to it, or for a
path, a ``str`` or ``os.PathLike`` naming the same directory), or when the value is reachable
from it in at most :data:`DEPTH` steps, a step being: an element of a tuple, list, set, frozenset
or deque, a key or value of a dict (the first :data:`LIMIT` of each container), an attribute
(``__dict__`` or ``__slots__``, private ones included) of an instance of a project class or of
an ``argparse.Namespace`` / ``SimpleNamespace``, the ``self`` of a bound method, a function's
closure variable, or a ``functools.partial``'s function, arguments and keywords. So a value
wrapped in a request, held by a ``Store`` (its ``.root``), captured by a closure or bound into
a method still counts; a value derived from it (a path under the root, the PTX companion's key,
a digest of the key) does not.

*Events.* A call event is the start of a function of a project module whose inputs (its
arguments, ``self`` included, and its closure variables) carry the value; a generator's or
coroutine's resumption is not a new call (it was counted when first entered). A return event
is a project function returning, or yielding, an object that carries the value. Each event has
a peer: the nearest project frame below the function's own on the stack (frames of any other
package, the standard library, JAX or Triton, are transparent): the caller of a call, the
receiver of a return; none when no project frame is below.

*Crossing a module.* An event crosses into a module when the module receiving the value
differs from its peer's: a call crosses into the called function's module when its caller's
module is another one (or there is no project caller); a return crosses into the receiver's
module when that is another one (a return to no project frame leaves the project and enters
nothing). Calls and returns within one module never cross: a module may split its work among as
many private functions as it likes.

*The way.* A way may have an end (``until``: the first event it accepts, included; by default
the run's last event) and a destination (``inside``: packages whose own work is not part of the
way: the events of functions running below one of the destination's frames are left out; the
calls into it and its returns out of it stay). Its route is the module where the value is first
seen (the returning module of a first event that is a return, the caller's of a first call;
none when that is outside the project), then the receiving module of every crossing event, in
order. The numbers:

- ``distinct``: the distinct modules of the route: the modules the value crosses (the
  bound: at most :data:`BOUND`);
- ``entries``: how many times the route enters each module (loops count each pass);
  ``reentries``: the entries beyond the first, per module, and ``reentered`` their total;
- ``calls`` and ``returns``: the crossing calls and the crossing returns; ``hops``: the
  crossings by (from, to) module; ``bare_calls`` and ``bare_to``: the crossing calls that hand
  over the value itself (an argument other than ``self`` is the value), and the functions they
  call;
- ``path`` (a way with an end): the value's path in the call tree, the modules of the frames from
  the one it is first seen in up to the nearest frame that is also below the end, then down to
  the end; ``path_returns``: the module changes of the way up. Side trips are off the path: a
  function handed the value that hands it back, or on to nothing before the end (a check, a
  lookup, a memo, a companion entry), however many modules it crosses;
- ``opens``: the objects built from the bare value: calls of a project class's ``__init__``
  (dataclasses' generated ones included) taking the value itself as an argument other than
  ``self``, not made within another such call on the same thread (``Cache(root)`` building its
  ``Store(root)`` is one), by class in ``opened``.

The scenarios (:data:`SCENARIOS`):

- ``key``: ``bridge.triton_call`` of ``examples.kernels.add_kernel`` under ``jax.jit``, lowered
  for ``cuda:90`` (no GPU needed) into a fresh root (``KERNELCACHE_DIR``, no other
  ``KERNELCACHE_*`` variable): a miss, compiled and stored. The value: the kernel key (the name
  of the one binary the run writes); the end: the call of the store's write of that binary
  (``publish`` or ``put`` of a ``kernelcache.store`` module, the binary's extension); the
  destination: ``kernelcache.store``.
- ``prune``: ``kernelcache --root ROOT prune --max-size ... --older-than 108h`` (the console
  script's ``main``) on a root of eight entries, five of which go. The value: the root; the
  way: the whole command; the destination, as the key's: ``kernelcache.store`` (what the store
  does with the root is its own work; every call into one of its modules from outside it, and
  every return out of it, still counts).

Only this process's threads are traced: what a forked process does (the bridge's compiler
process) is not seen. The numbers depend on what the process did before (in-memory memos, warm
caches), so the command line measures each scenario first thing in a fresh interpreter.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dis
import functools
import inspect
import io
import itertools
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import types
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
#: the project's top-level packages: only their modules' frames are events
PACKAGES = ("kernelcache", "bridge")
#: how many steps from an input the value may lie (see the module docstring)
DEPTH = 2
#: how many elements of one container are looked at
LIMIT = 256
#: the bound on the modules of each way: a reader follows a value through at most this many
BOUND = 10

_RESUME = dis.opmap.get("RESUME")
_GENERATOR_FLAGS = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR
_LEAVES = (str, bytes, bytearray, int, float, complex, bool, type(None))
#: a kernel key as kernelcache accepts one (kernelcache.keys.check_key)
KEY_PATTERN = re.compile(r"[0-9a-f]{32,128}")


@dataclass(frozen=True)
class Event:
    """One call or return of a project function that carries a traced value."""

    kind: str  # "call" or "return"
    module: str  # the module of the function called, or returning
    function: str  # its qualified name
    #: the modules of the project frames below the function's, nearest first
    below: tuple[str, ...]
    held: str  # where the value was: "key", "request.key", "self.root", "return[0]"
    bare: bool  # an argument other than self is the value itself
    opens: bool  # an outermost __init__ taking the bare value (see the module docstring)
    thread: int
    #: the call's plain arguments (str, int, float, bool, None), for ``until`` predicates
    args: Mapping[str, Any] = field(default_factory=dict)
    #: the function's own frame, then the project frames below it, nearest first, each as
    #: (serial, module): a serial names one frame for the whole run (ids are reused)
    chain: tuple[tuple[int, str], ...] = ()

    @property
    def peer(self) -> str | None:
        """The caller's module (a call), the receiver's (a return); None: no project frame."""
        return self.below[0] if self.below else None

    @property
    def into(self) -> str | None:
        """The module receiving the value: the called one, or the receiver's."""
        return self.module if self.kind == "call" else self.peer

    @property
    def crosses(self) -> bool:
        """Whether the value crosses into another module here (see the module docstring)."""
        if self.kind == "call":
            return self.peer != self.module
        return self.peer is not None and self.peer != self.module


@dataclass
class Way:
    """One value's way: its route and the numbers of the module docstring."""

    value: str
    route: list[str]
    events: list[Event]
    #: its destination, whose own work is not part of the way (see :meth:`Trace.way`)
    inside: tuple[str, ...] = ()
    #: the modules of its path in the call tree (see :meth:`Trace.way`), and how many of its
    #: steps go up (a frame returning the value to a caller in another module)
    path: list[str] = field(default_factory=list)
    path_returns: int = 0

    @property
    def modules(self) -> list[str]:
        """The route's distinct modules, in the order first entered."""
        return list(dict.fromkeys(self.route))

    @property
    def distinct(self) -> int:
        return len(self.modules)

    @property
    def entries(self) -> dict[str, int]:
        return dict(collections.Counter(self.route))

    @property
    def reentries(self) -> dict[str, int]:
        return {m: n - 1 for m, n in self.entries.items() if n > 1}

    @property
    def calls(self) -> int:
        return sum(1 for e in self.events if e.kind == "call" and e.crosses)

    @property
    def returns(self) -> int:
        return sum(1 for e in self.events if e.kind == "return" and e.crosses)

    @property
    def bare_calls(self) -> int:
        """Crossing calls handing over the value itself (not an object holding it)."""
        return sum(1 for e in self.events if e.kind == "call" and e.crosses and e.bare)

    @property
    def bare_to(self) -> dict[str, int]:
        """The functions the bare value is handed to by crossing calls, with how many times."""
        return dict(
            collections.Counter(
                f"{e.module}:{e.function}"
                for e in self.events
                if e.kind == "call" and e.crosses and e.bare
            )
        )

    @property
    def hops(self) -> dict[str, int]:
        """Each crossing as "from -> to" (from: the caller's module, or the returning one;
        "outside" for a call from no project frame), with how many times it was made."""
        hops = collections.Counter(
            f"{(e.peer or 'outside') if e.kind == 'call' else e.module} -> {e.into}"
            for e in self.events
            if e.crosses
        )
        return dict(hops)

    @property
    def opened(self) -> list[str]:
        """The class of each open, in order."""
        return [e.function.rsplit(".", 1)[0] for e in self.events if e.opens]

    @property
    def opens(self) -> int:
        return len(self.opened)

    def numbers(self) -> dict[str, Any]:
        """What ``--json`` writes of this way."""
        return {
            "value": self.value,
            "distinct": self.distinct,
            "modules": self.modules,
            "route": self.route,
            "entries": self.entries,
            "reentries": self.reentries,
            "reentered": sum(self.reentries.values()),
            "calls": self.calls,
            "bare_calls": self.bare_calls,
            "bare_to": self.bare_to,
            "returns": self.returns,
            "hops": self.hops,
            "inside": list(self.inside),
            "path": self.path,
            "path_distinct": len(set(self.path)),
            "path_returns": self.path_returns,
            "opens": self.opens,
            "opened": dict(collections.Counter(self.opened)),
            "events": [
                {
                    **{k: v for k, v in asdict(e).items() if k not in ("args", "thread", "below")},
                    "peer": e.peer,
                }
                for e in self.events
            ],
        }


class Trace:
    """The events of one traced run, per value (see :func:`trace`)."""

    def __init__(self, events: dict[Hashable, list[Event]]) -> None:
        self.events = events

    def way(
        self,
        value: Hashable,
        until: Callable[[Event], bool] | None = None,
        name: str = "",
        inside: Sequence[str] = (),
    ) -> Way:
        """The way of ``value`` up to and including the first event ``until`` accepts (all of
        the run's when None), leaving out the work of its destination ``inside`` (packages or
        modules): the events of functions called, directly or not, by a function of theirs.

        Raises:
            LookupError: the run never carried ``value``, or never reached ``until``.
        """
        events = [
            e for e in self.events.get(value, ()) if not any(_project(m, inside) for m in e.below)
        ]
        if not events:
            raise LookupError(f"no project function carried {value!r}")
        if until is not None:
            end = next((i for i, e in enumerate(events) if until(e)), None)
            if end is None:
                raise LookupError(f"the way of {value!r} never reached its end")
            events = events[: end + 1]
        first = events[0]
        origin = first.peer if first.kind == "call" else first.module
        route = [origin] if origin is not None else []
        route += [e.into for e in events if e.crosses and e.into is not None]
        path, up = _path(first, events[-1]) if until is not None else ([], 0)
        return Way(name or str(value), route, events, tuple(inside), path, up)


def _path(first: Event, last: Event) -> tuple[list[str], int]:
    """The modules of the value's path in the call tree: from the frame it is first seen in
    (the returning function of a first event that is a return, the caller of a first call) up
    to the nearest frame that is also below the last event's function, then down to that
    function; and how many module changes the way up makes. Side trips (a function the value
    is handed to that hands it back, or passes it nowhere) are off the path."""
    born = list(first.chain if first.kind == "return" else first.chain[1:])
    end = list(last.chain)
    at = {serial: i for i, (serial, _) in enumerate(end)}
    top = next((i for i, (serial, _) in enumerate(born) if serial in at), None)
    if top is None:  # (no common frame: the two halves joined outside the project)
        up, down = born, end
    else:
        up, down = born[:top], end[: at[born[top][0]] + 1]
    modules = [m for _, m in up] + [m for _, m in reversed(down)]
    path = [m for i, m in enumerate(modules) if i == 0 or m != modules[i - 1]]
    ups = [m for _, m in up] + ([down[-1][1]] if down else [])
    returns = sum(1 for a, b in itertools.pairwise(ups) if a != b)
    return path, returns


def _project(module: str, packages: Sequence[str]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def _module(frame: types.FrameType) -> str:
    return frame.f_globals.get("__name__") or ""


def _found(
    x: Any,
    pick: Callable[[Any], Hashable | None],
    packages: Sequence[str],
    path: str,
    depth: int,
    out: dict[Hashable, str],
    seen: set[int],
) -> None:
    """Add to ``out`` every value ``pick`` finds in ``x`` within ``DEPTH - depth`` steps, with
    the path it was first found at."""
    value = pick(x)
    if value is not None:
        out.setdefault(value, path)
        return
    if depth >= DEPTH or isinstance(x, _LEAVES) or id(x) in seen:
        return
    seen.add(id(x))
    step = functools.partial(
        _found, pick=pick, packages=packages, depth=depth + 1, out=out, seen=seen
    )
    if isinstance(x, (tuple, list, set, frozenset, collections.deque)):
        for i, e in enumerate(itertools.islice(x, LIMIT)):
            step(e, path=f"{path}[{i}]")
    elif isinstance(x, (dict, types.MappingProxyType)):
        for k, e in itertools.islice(x.items(), LIMIT):
            step(k, path=f"{path}.keys()")
            step(e, path=f"{path}[{k!r}]" if isinstance(k, str) and len(k) < 40 else f"{path}[]")
    elif isinstance(x, types.MethodType):
        step(x.__self__, path=f"{path}.__self__")
    elif isinstance(x, functools.partial):
        step(x.func, path=f"{path}.func")
        for i, e in enumerate(x.args):
            step(e, path=f"{path}.args[{i}]")
        for k, e in x.keywords.items():
            step(e, path=f"{path}.keywords[{k!r}]")
    elif isinstance(x, types.FunctionType):
        for name, cell in zip(x.__code__.co_freevars, x.__closure__ or (), strict=False):
            with contextlib.suppress(ValueError):  # an empty cell
                step(cell.cell_contents, path=f"{path}.<{name}>")
    elif _project(type(x).__module__, packages) or isinstance(
        x, (argparse.Namespace, types.SimpleNamespace)
    ):
        attrs = getattr(x, "__dict__", None)
        if isinstance(attrs, dict):
            for name, e in list(attrs.items()):
                step(e, path=f"{path}.{name}")
        for klass in type(x).__mro__:
            slots = klass.__dict__.get("__slots__", ())
            for name in (slots,) if isinstance(slots, str) else slots:
                if name not in ("__dict__", "__weakref__") and hasattr(x, name):
                    step(getattr(x, name), path=f"{path}.{name}")


def _name(frame: types.FrameType) -> str:
    """The function's qualified name; a constructor's is its class's (a dataclass's generated
    ``__init__`` is named after the class, not after where dataclasses made it)."""
    code = frame.f_code
    if code.co_name == "__init__" and "self" in frame.f_locals:
        return f"{type(frame.f_locals['self']).__qualname__}.__init__"
    return getattr(code, "co_qualname", code.co_name)


def _inputs(frame: types.FrameType) -> list[tuple[str, Any]]:
    """A starting frame's arguments (``self`` included) and closure variables."""
    code = frame.f_code
    count = code.co_argcount + code.co_kwonlyargcount
    count += bool(code.co_flags & inspect.CO_VARARGS) + bool(code.co_flags & inspect.CO_VARKEYWORDS)
    local = frame.f_locals
    return [(n, local[n]) for n in (*code.co_varnames[:count], *code.co_freevars) if n in local]


def _resumed(frame: types.FrameType) -> bool:
    """Whether this call event resumes a generator or coroutine (not its first entry)."""
    code = frame.f_code
    if not code.co_flags & _GENERATOR_FLAGS:
        return False
    if _RESUME is None:  # Python 3.10: a fresh generator has not run an instruction
        return frame.f_lasti >= 0
    at = frame.f_lasti
    raw = code.co_code
    return raw[at] == _RESUME and raw[at + 1] & 3 != 0  # (0: the first entry)


def trace(
    run: Callable[[], Any],
    pick: Callable[[Any], Hashable | None],
    packages: Sequence[str] = PACKAGES,
) -> Trace:
    """Run ``run()`` traced, and return the events of every value ``pick`` finds.

    ``pick(x)`` is asked of every object looked at (the inputs and return values of the
    project's functions, and what they hold: see the module docstring): the value ``x`` is (a
    hashable naming it), or None. It must be cheap, and never raise.
    """
    events: dict[Hashable, list[Event]] = collections.defaultdict(list)
    #: per thread and value, the frame of the open in progress
    opening: dict[tuple[int, Hashable], int] = {}

    #: a serial per live project frame (by id), given when it is called
    serials: dict[int, int] = {}
    counter = itertools.count()

    def chain(frame: types.FrameType) -> tuple[tuple[int, str], ...]:
        links = []
        under: types.FrameType | None = frame
        while under is not None:
            module = _module(under)
            if _project(module, packages) and id(under) in serials:
                links.append((serials[id(under)], module))
            under = under.f_back
        return tuple(links)

    def profile(frame: types.FrameType, event: str, arg: Any) -> None:
        if event not in ("call", "return"):
            return
        module = _module(frame)
        if not _project(module, packages):
            return
        if event == "call" and not _resumed(frame):
            serials[id(frame)] = next(counter)
        found: dict[Hashable, str] = {}
        bare: set[Hashable] = set()
        try:
            if event == "call":
                if _resumed(frame):
                    return
                for name, x in _inputs(frame):
                    _found(x, pick, packages, name, 0, found, set())
                    value = pick(x) if name != "self" else None
                    if value is not None:
                        bare.add(value)
            else:
                _found(arg, pick, packages, "return", 0, found, set())
        except Exception:  # an object that cannot be looked into is not looked into
            return
        thread = threading.get_ident()
        code = frame.f_code
        links = chain(frame) if found else ()
        for value, held in found.items():
            opens = False
            if event == "call" and code.co_name == "__init__" and value in bare:
                if (thread, value) not in opening:
                    opening[(thread, value)] = id(frame)
                    opens = True
            args = {}
            if event == "call":
                args = {
                    n: x
                    for n, x in _inputs(frame)
                    if isinstance(x, (int, float, bool, type(None)))
                    or (isinstance(x, str) and len(x) <= 256)
                }
            events[value].append(
                Event(
                    event,
                    module,
                    _name(frame),
                    tuple(m for _, m in links[1:]),
                    held,
                    value in bare,
                    opens,
                    thread,
                    args,
                    links,
                )
            )
        if event == "return":
            for key, at in list(opening.items()):
                if key[0] == thread and at == id(frame):
                    del opening[key]

    threading.setprofile(profile)
    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    return Trace(dict(events))


def way(
    matches: Callable[[Any], bool],
    run: Callable[[], Any],
    until: Callable[[Event], bool] | None = None,
    name: str = "value",
    packages: Sequence[str] = PACKAGES,
) -> Way:
    """The way of the one value ``matches`` accepts through ``run()`` (see :func:`trace`)."""

    def pick(x: Any) -> Hashable | None:
        try:
            return name if matches(x) else None
        except Exception:
            return None

    return trace(run, pick, packages).way(name, until, name)


def path_picker(root: str | os.PathLike[str]) -> Callable[[Any], bool]:
    """Whether an object is the directory ``root``: a str or PathLike naming it (as given, or
    resolved)."""
    forms = {os.path.abspath(root), os.path.realpath(root)}

    def matches(x: Any) -> bool:
        if isinstance(x, str):
            return x.rstrip(os.sep) in forms
        if isinstance(x, os.PathLike) and not isinstance(x, bytes):
            path = os.fspath(x)
            return isinstance(path, str) and path.rstrip(os.sep) in forms
        return False

    return matches


def _pick_key(x: Any) -> Hashable | None:
    return x if type(x) is str and KEY_PATTERN.fullmatch(x) else None


# -- the scenarios ------------------------------------------------------------------------
@contextlib.contextmanager
def _environment(**set_to: str) -> Iterator[None]:
    """No KERNELCACHE_* variable but ``set_to``'s, while inside."""
    saved = {k: v for k, v in os.environ.items() if k.startswith("KERNELCACHE_")}
    for k in saved:
        del os.environ[k]
    os.environ.update(set_to)
    try:
        yield
    finally:
        for k in [k for k in os.environ if k.startswith("KERNELCACHE_")]:
            del os.environ[k]
        os.environ.update(saved)


def key_way(target: str = "cuda:90") -> Way:
    """A kernel key's way: ``bridge.triton_call`` lowered under ``jax.jit`` for ``target`` (no
    GPU needed) into a fresh cache root (``KERNELCACHE_DIR``), so that the kernel is compiled
    and stored; from the key's first appearance to the call of the store's write of the kernel
    binary (``publish`` or ``put`` of ``kernelcache.store``, the binary's extension). The key is
    the name of the one binary the run writes."""
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    import jax
    import jax.numpy as jnp
    import triton

    import bridge
    from examples.kernels import add_kernel

    n, block = 4096, 1024
    spec = jax.ShapeDtypeStruct((n,), jnp.float32)

    def add(x: Any, y: Any) -> Any:
        return bridge.triton_call(
            x,
            y,
            n,
            kernel=add_kernel,
            out_shape=spec,
            grid=(triton.cdiv(n, block),),
            BLOCK=block,
            target=target,
        )

    with tempfile.TemporaryDirectory() as tmp, _environment(KERNELCACHE_DIR=tmp):
        traced = trace(
            lambda: jax.jit(add).trace(spec, spec).lower(lowering_platforms=("cuda",)), _pick_key
        )
        binaries = [p for p in Path(tmp).iterdir() if p.suffix in (".cubin", ".hsaco")]
    if len(binaries) != 1:
        raise RuntimeError(f"expected one kernel binary in the cache, found {binaries}")
    key, ext = binaries[0].stem, binaries[0].suffix[1:]

    def stored(e: Event) -> bool:
        return (
            e.kind == "call"
            and _project(e.module, ("kernelcache.store",))
            and e.function.rsplit(".", 1)[-1] in ("publish", "put")
            and e.args.get("key") == key
            and e.args.get("ext") == ext
        )

    return traced.way(key, stored, f"kernel key {key} (.{ext})", inside=("kernelcache.store",))


def prune_way() -> Way:
    """A root's way through ``kernelcache --root ROOT prune --max-size ... --older-than 108h``
    (the console script's ``main``, in this process) on a root of eight entries, last used 1
    to 8 days ago: four too old (4.5 days), one more over the size cap; its destination, as
    the key's, ``kernelcache.store``: the store's own work is not counted."""
    from kernelcache.cli import main
    from kernelcache.store import Store

    with tempfile.TemporaryDirectory() as tmp, _environment():
        root = os.path.join(tmp, "cache")
        store = Store(root)
        now = time.time()
        for day in range(1, 9):
            key = f"{day:064x}"
            meta = {"name": "add_kernel", "target": "cuda:90" if day % 2 else "cuda:80"}
            store.put(key, "bin", bytes([day]) * 1000, meta)
            stamp = now - day * 86400
            os.utime(os.path.join(root, f"{key}.json"), (stamp, stamp))
        del store
        # the three newest entries, and half of the fourth: a cap the fourth is over
        cap = (
            sum(
                os.path.getsize(os.path.join(root, f"{day:064x}.{ext}"))
                for day in (1, 2, 3)
                for ext in ("bin", "json")
            )
            + 500
        )
        argv = ["--root", root, "prune", "--yes", "--max-size", f"{cap}B", "--older-than", "108h"]
        codes: list[Any] = []

        def run() -> None:
            try:
                codes.append(main(argv))
            except SystemExit as e:
                codes.append(e.code)

        said = io.StringIO()
        with contextlib.redirect_stdout(said), contextlib.redirect_stderr(said):
            traced = trace(run, _root_picker(root))
        if codes != [0]:
            raise RuntimeError(f"kernelcache prune exited {codes}: {said.getvalue()}")
        left = sorted(p.name for p in Path(root).iterdir() if p.suffix == ".bin")
        if len(left) != 3:
            raise RuntimeError(f"prune left {left}, expected three entries")
    return traced.way("root", name=f"root {root}", inside=("kernelcache.store",))


def _root_picker(root: str) -> Callable[[Any], Hashable | None]:
    matches = path_picker(root)
    return lambda x: "root" if matches(x) else None


SCENARIOS: dict[str, Callable[[], Way]] = {"key": key_way, "prune": prune_way}


# -- the command line ---------------------------------------------------------------------
def table(name: str, w: Way) -> str:
    """A way as text: its route, crossing by crossing, then its numbers."""
    lines = [f"{name}: the way of the {w.value}"]
    rows = []
    for e in w.events:
        if e.crosses and e.into is not None:
            source = (e.peer or "outside") if e.kind == "call" else e.module
            rows.append((e.into, source, f"{e.kind} {e.function}", e.held))
    if len(w.route) > len(rows):  # where it was first seen, before any crossing
        rows.insert(0, (w.route[0], "", "first seen", ""))
    wide = max((len(r[0]) for r in rows), default=0)
    wide_from = max((len(r[1]) for r in rows), default=0)
    for i, (into, source, how, held) in enumerate(rows, 1):
        arrow = f"<- {source:<{wide_from}}" if source else " " * (wide_from + 3)
        lines.append(f"  {i:3} {into:<{wide}} {arrow}  {how}" + (f"  [{held}]" if held else ""))
    if w.inside:
        lines.append(f"  (not counted: the work within {', '.join(w.inside)})")
    re_entered = ", ".join(f"{m} +{n}" for m, n in w.reentries.items()) or "none"
    lines.append(
        f"  distinct modules {w.distinct} (bound {BOUND}); crossings {w.calls + w.returns} "
        f"({len(w.hops)} distinct): calls {w.calls} ({w.bare_calls} handing over the bare "
        f"value), returns {w.returns}"
    )
    lines.append(f"  re-entries {sum(w.reentries.values())}: {re_entered}")
    if w.opens:
        opened = ", ".join(f"{c} x{n}" for c, n in collections.Counter(w.opened).items())
        lines.append(f"  objects built from the bare value: {w.opens} ({opened})")
    lines.append("  modules: " + " -> ".join(w.modules))
    if w.path:
        lines.append(
            f"  path in the call tree: {len(set(w.path))} modules (bound {BOUND}), "
            f"{w.path_returns} up: " + " -> ".join(w.path)
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("ways", nargs="*", metavar="WAY", help="key, prune (default: both)")
    parser.add_argument("--json", metavar="PATH", help="write the numbers there ('-': stdout)")
    parser.add_argument(
        "--here", action="store_true", help="measure in this process (default: a fresh one each)"
    )
    args = parser.parse_args(argv)
    unknown = [w for w in args.ways if w not in SCENARIOS]
    if unknown:
        parser.error(f"no such way: {', '.join(unknown)} (choose from {', '.join(SCENARIOS)})")
    numbers: dict[str, Any] = {}
    for name in args.ways or list(SCENARIOS):
        if args.here:
            w = SCENARIOS[name]()
            numbers[name] = w.numbers()
            if args.json != "-":
                print(table(name, w))
            continue
        done = subprocess.run(
            [sys.executable, __file__, name, "--here", "--json", "-"],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode:
            sys.stderr.write(done.stderr)
            return done.returncode
        numbers[name] = json.loads(done.stdout)[name]
        if args.json != "-":
            print(_table_of(name, numbers[name]))
    if args.json == "-":
        json.dump(numbers, sys.stdout, indent=1)
    elif args.json:
        Path(args.json).write_text(json.dumps(numbers, indent=1))
    return 0


def _table_of(name: str, doc: Mapping[str, Any]) -> str:
    """:func:`table` of what ``--json`` wrote of a way."""
    events = []
    for e in doc["events"]:
        e = dict(e)
        peer = e.pop("peer")
        events.append(Event(**e, below=(peer,) if peer else (), thread=0))
    way = Way(doc["value"], list(doc["route"]), events, tuple(doc["inside"]))
    way.path, way.path_returns = list(doc.get("path", [])), doc.get("path_returns", 0)
    return table(name, way)


if __name__ == "__main__":
    sys.exit(main())
