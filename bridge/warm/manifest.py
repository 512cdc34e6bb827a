"""Reading a manifest: the records ``$KERNELCACHE_RECORD`` wrote, validated line by line and
grouped into distinct calls, and the recorded values turned back into call arguments.

Everything in a manifest is untrusted input: a line that is not a usable record is reported with
its number and the reason, and never stops the others from being read. Kernels are imported by
their recorded ``module:qualname``; a path that is not a plain dotted name is refused before any
import.
"""

from __future__ import annotations

import contextlib
import importlib
import json as jsonlib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kernelcache.plugin import NotRegularFile, load_json, open_regular

from ..call.placeholders import ArgArray
from ..exceptions import KernelArgumentError, ManifestError
from ..lowering.record import RECORD_VERSION
from ..vendors.targets import Target
from .outcomes import WarmProblem

# -- importing kernels ----------------------------------------------------------------------
#: a dotted Python name (module path or qualified name)
_DOTTED = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*")


def import_kernel(path: str) -> Any:
    """The kernel object named ``module:qualname`` (the autotune/heuristics wrapper if any).

    Raises:
        KernelArgumentError: the module or name cannot be found, or importing the module
            failed (the message carries the module's own error).
    """
    module_name, _, qualname = path.partition(":")
    if not module_name or not qualname or "<locals>" in qualname or "<lambda>" in qualname:
        raise KernelArgumentError(f"{path} is not importable: define kernels at module level")
    if not (_DOTTED.fullmatch(module_name) and _DOTTED.fullmatch(qualname)):
        raise KernelArgumentError(
            f"{path!r} is not a kernel import path: expected module.name:Qualified.name"
        )
    if module_name == "__main__":
        raise KernelArgumentError(
            f"{path} was defined in a script run as __main__: move it into a module"
        )
    parts = (*module_name.split("."), *qualname.split("."))
    if any(part.startswith("__") and part.endswith("__") for part in parts):
        # (a package's __main__ runs a program when imported; no kernel lives in a dunder)
        raise KernelArgumentError(f"{path!r} is not a kernel import path: it names a dunder")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as e:
        raise KernelArgumentError(f"cannot import the kernel {path}: {e}") from None
    except (Exception, SystemExit) as e:  # the module failed while importing: its error
        raise KernelArgumentError(
            f"importing {module_name} for {path} raised {type(e).__name__}: {e}"
        ) from None
    try:
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except AttributeError as e:
        raise KernelArgumentError(f"cannot import the kernel {path}: {e}") from None
    return obj


def revive(value: Any, counter: list[int]) -> Any:
    """The inverse of :func:`bridge.call.plain.plain` for what a call can contain.

    Raises:
        KernelArgumentError: a value that was recorded only by its ``repr``.
    """
    if isinstance(value, list):
        return tuple(revive(v, counter) for v in value)
    if isinstance(value, dict):
        if "array" in value:
            counter[0] += 1
            return ArgArray(value["shape"], value["array"], ("in", counter[0] - 1))
        if "dtype" in value:
            import triton.language as tl

            return tl.dtype(value["dtype"])
        if "jit" in value:
            return import_kernel(value["jit"])
        if "constexpr" in value:
            import triton.language as tl

            return tl.constexpr(revive(value["constexpr"], counter))
        desc = value.get("tensordesc")
        if isinstance(desc, dict) and isinstance(desc.get("base"), dict):
            from ..call.tma import revive as revive_descriptor

            base = revive(desc["base"], counter)
            if not isinstance(base, ArgArray):
                raise KernelArgumentError(f"a recorded tensor descriptor has no array: {value}")
            return revive_descriptor(desc, base, "a recorded kernel")
        raise KernelArgumentError(f"a recorded value cannot be rebuilt: {value}")
    return value


# -- the manifest -------------------------------------------------------------------------
@dataclass(frozen=True)
class RecordedCall:
    """One distinct recorded call: a kernel with abstract arguments and options.

    Records of the same call (one per autotune config, possibly from several processes and
    recording targets) are one RecordedCall. Arguments that follow the target's warp size
    (``target_params``) are replaced per target.
    """

    kernel: str
    arguments: Mapping[str, Any]
    kwargs: tuple[str, ...]
    options: Mapping[str, Any]
    target_params: Mapping[str, str]
    lines: tuple[int, ...]
    sources: frozenset[str] = frozenset()
    #: autotune configs recorded, by the Triton version that recorded them
    configs: Mapping[str, frozenset[str]] = field(default_factory=dict)
    problem: str | None = None  # why the recording process thought it cannot be imported
    config_lines: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    #: the targets the call was recorded for, in first-seen order
    targets: tuple[str, ...] = ()

    @classmethod
    def from_record(
        cls,
        rec: Mapping[str, Any],
        lines: tuple[int, ...] = (),
        sources: frozenset[str] = frozenset(),
        configs: Mapping[str, frozenset[str]] | None = None,
        problem: str | None = None,
        config_lines: Mapping[str, tuple[int, ...]] | None = None,
        targets: tuple[str, ...] = (),
    ) -> RecordedCall:
        """The call of ``rec``, a record :func:`check_record` accepts (the first of its group,
        with what the group's other records add)."""
        return cls(
            kernel=rec["kernel"],
            arguments=rec["arguments"],
            kwargs=tuple(sorted(rec.get("kwargs") or {})),
            options=rec["options"],
            target_params=dict(rec.get("target_params") or {}),
            lines=lines,
            sources=sources,
            configs=configs or {},
            problem=problem,
            config_lines=config_lines or {},
            targets=targets,
        )

    def for_target(self, target: Target) -> dict[str, Any]:
        """The recorded arguments, with the warp-size arguments set for ``target``."""
        args = dict(self.arguments)
        for name, what in self.target_params.items():
            if what == "warp_size" and name in args:
                args[name] = target.warp_size
        return args

    def revived(
        self, target: Target, counter: list[int]
    ) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        """The call as a lowering of it for ``target`` sees it: every argument by parameter
        name, those the caller set by keyword, and the options the caller set (arrays as
        placeholders numbered by ``counter``).

        Raises:
            KernelArgumentError: a value that was recorded only by its ``repr``.
        """
        named = {k: revive(v, counter) for k, v in self.for_target(target).items()}
        kwargs = {k: named[k] for k in self.kwargs if k in named}
        options = {k: revive(v, counter) for k, v in self.options.items()}
        return named, kwargs, options


@dataclass(frozen=True)
class Manifest:
    """A manifest read: its distinct calls and the lines that are not usable records."""

    path: str
    records: int
    calls: tuple[RecordedCall, ...]
    failures: tuple[WarmProblem, ...]


#: the largest manifest read (a recorded model's calls take a few MB), and the longest line
#: parsed (a record takes about a kilobyte): JSON holds many times its bytes in memory
MAX_MANIFEST_BYTES = 64 << 20
MAX_LINE_BYTES = 64 << 10


def _open_regular(path: str) -> bytes:
    try:
        with open_regular(path) as f:
            raw = f.read(MAX_MANIFEST_BYTES + 1)
        if len(raw) > MAX_MANIFEST_BYTES:
            raise ManifestError(
                f"the manifest {path} is larger than {MAX_MANIFEST_BYTES >> 20} MiB: not a "
                "recorded manifest, or record a smaller run"
            )
        return raw
    except NotRegularFile:
        raise ManifestError(f"the manifest {path} is not a regular file") from None
    except OSError as e:
        raise ManifestError(f"cannot read the manifest {path}: {e.strerror}") from None


def _is_variant(value: Any) -> bool:
    return (
        isinstance(value, dict)
        and isinstance(value.get("kwargs"), dict)
        and isinstance(value.get("options"), dict)
    )


#: the optional fields of a record (absent or null when unknown): check, and what it expects
_OPTIONAL_FIELDS: dict[str, tuple[Any, str]] = {
    "kwargs": (lambda v: isinstance(v, dict), "an object"),
    "target_params": (
        lambda v: isinstance(v, dict) and all(isinstance(x, str) for x in v.values()),
        "an object of strings",
    ),
    "producer": (
        lambda v: isinstance(v, dict) and isinstance(v.get("triton", ""), (str, type(None))),
        "an object whose 'triton' is a string",
    ),
    "source": (lambda v: isinstance(v, str), "a string"),
    "target": (lambda v: isinstance(v, str), "a string"),
    "config": (lambda v: isinstance(v, str), "a string"),
    "importable": (lambda v: isinstance(v, bool), "true or false"),
    "problem": (lambda v: isinstance(v, str), "a string"),
    "variant": (_is_variant, "an object with objects 'kwargs' and 'options'"),
}


def check_record(rec: Any) -> str | None:
    """What is wrong with a parsed line (a required field missing, any field of the wrong
    type), or None: a record that :meth:`RecordedCall.from_record` and warm can use."""
    if not isinstance(rec, dict):
        return "not a JSON object"
    version = rec.get("version")
    if not isinstance(version, int):
        return "no record version"
    if version > RECORD_VERSION:
        return (
            f"record version {version} was written by a newer kernelcache; this one reads "
            f"version {RECORD_VERSION}: upgrade kernelcache where you warm"
        )
    for name, kind in (("kernel", str), ("arguments", dict), ("options", dict)):
        if not isinstance(rec.get(name), kind):
            return f"field {name!r} is missing or not a {kind.__name__}"
    for name, (check, expected) in _OPTIONAL_FIELDS.items():
        value = rec.get(name)
        if value is not None and not check(value):
            return f"field {name!r} is not {expected}: {jsonlib.dumps(value)[:80]}"
    return None


def _call_ident(rec: Mapping[str, Any], target_params: Mapping[str, str]) -> str:
    args = {k: ("<target>" if k in target_params else v) for k, v in rec["arguments"].items()}
    kwargs = sorted(rec.get("kwargs") or {})
    return jsonlib.dumps([rec["kernel"], args, kwargs, rec["options"]], sort_keys=True)


def call_ident(rec: Mapping[str, Any]) -> str:
    """What identifies the call of a record (checked by :func:`check_record`): the records of
    one call's variants, for any target, share it."""
    return _call_ident(rec, rec.get("target_params") or {})


def load_manifest(path: str | os.PathLike[str]) -> Manifest:
    """Read a manifest: distinct calls in first-seen order, and unusable lines as failures.

    Raises:
        ManifestError: the file cannot be read, or no line of it is a record.
    """
    name = os.fspath(path)
    raw = _open_regular(name)
    groups: dict[str, dict[str, Any]] = {}
    failures: list[WarmProblem] = []
    records = 0
    nonblank = 0
    newer = 0  # records of a later format: a manifest, just not one this version reads
    for number, line in enumerate(raw.splitlines(), start=1):
        if not line.strip():
            continue
        nonblank += 1
        try:
            if len(line) > MAX_LINE_BYTES:
                raise ValueError(f"longer than {MAX_LINE_BYTES >> 10} KiB")
            rec = load_json(line)
        except ValueError as e:  # includes a UnicodeDecodeError
            failures.append(
                WarmProblem(
                    "bad-record",
                    f"line {number} is not a JSON record ({e}): a writer died mid-line or the "
                    "file was edited; delete the line or record the manifest again",
                    lines=(number,),
                )
            )
            continue
        problem = check_record(rec)
        if problem is not None:
            newer += (
                isinstance(rec, dict)
                and isinstance(rec.get("version"), int)
                and (rec["version"] > RECORD_VERSION)
            )
            kernel = rec.get("kernel") if isinstance(rec, dict) else None
            failures.append(
                WarmProblem(
                    "bad-record",
                    f"line {number}: {problem}",
                    kernel if isinstance(kernel, str) else None,
                    lines=(number,),
                )
            )
            continue
        records += 1
        params = rec.get("target_params") or {}
        ident = _call_ident(rec, params)
        group = groups.setdefault(
            ident,
            {
                "first": rec,
                "lines": [],
                "sources": set(),
                "configs": {},
                "problem": None,
                "config_lines": {},
                "targets": [],
            },
        )
        group["lines"].append(number)
        group["config_lines"].setdefault(str(rec.get("config") or ""), []).append(number)
        if rec.get("source"):
            group["sources"].add(rec["source"])
        if rec.get("target") and rec["target"] not in group["targets"]:
            group["targets"].append(rec["target"])
        triton = (rec.get("producer") or {}).get("triton")
        if triton:
            group["configs"].setdefault(triton, set()).add(str(rec.get("config") or ""))
        if rec.get("importable") is False and group["problem"] is None:
            group["problem"] = rec.get("problem") or "marked not importable when recorded"
    if nonblank and not records and not newer:
        raise ManifestError(
            f"{name} is not a kernelcache manifest (no line is a record): pass the file "
            "that KERNELCACHE_RECORD wrote"
        )
    calls = []
    for group in groups.values():
        calls.append(
            RecordedCall.from_record(
                group["first"],
                lines=tuple(group["lines"]),
                sources=frozenset(group["sources"]),
                configs={t: frozenset(c) for t, c in group["configs"].items()},
                problem=group["problem"],
                config_lines={c: tuple(n) for c, n in group["config_lines"].items()},
                targets=tuple(group["targets"]),
            )
        )
    return Manifest(name, records, tuple(calls), tuple(failures))


def read_manifest(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The usable records of a manifest, one per distinct (kernel, call, variant, target)."""
    seen: dict[str, dict[str, Any]] = {}
    for line in _open_regular(os.fspath(path)).splitlines():
        if len(line) > MAX_LINE_BYTES:
            continue
        with contextlib.suppress(ValueError):
            rec = load_json(line)
            if check_record(rec) is None:
                ident = jsonlib.dumps(
                    [rec["kernel"], rec["arguments"], rec.get("variant"), rec.get("target")],
                    sort_keys=True,
                )
                seen.setdefault(ident, rec)
    return list(seen.values())
