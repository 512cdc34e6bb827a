"""Running an autotune config's ``pre_hook`` (and the autotuner's own ``pre_hook`` and
``post_hook``) at lowering, once per config, as Triton's autotuner runs them before a launch.

The hooks get ``nargs`` as Triton builds it (the call's arguments by name, the config's
parameters merged in), holding placeholders: arrays have a shape and a dtype but no data,
host descriptors are copies of Triton's own descriptor objects, constexprs and scalars are
their values. Arrays behave like tensors for attribute probes: ``hasattr`` is True for what a
tensor has and False (AttributeError) for what it has not, such as a descriptor's
``block_shape``. Two things a hook does have a meaning in a compiled JAX program: setting a
descriptor's ``block_shape`` (that config's launch gets a TMA descriptor of that block) and
``zero_()`` on an output (zeroed before each launch, as ``zeroed_outputs`` does). Anything else
done to an array (reading its data or device, calling a tensor method) is a
:class:`~bridge.exceptions.KernelArgumentError` naming the hook and what it tried.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, NoReturn

from ..exceptions import KernelArgumentError
from . import tma
from .placeholders import ArgArray

ADVICE = (
    "a compiled JAX program cannot run host code on arrays between launches: zero outputs with "
    "zero_() in a pre_hook, reset_to_zero or zeroed_outputs, and update inputs in place with "
    "input_output_aliases"
)


def hook_name(hook: Any) -> str:
    """The qualified name of a hook function, for messages."""
    qualname = getattr(hook, "__qualname__", None)
    if qualname is None:
        return repr(hook)
    return f"{getattr(hook, '__module__', None) or '?'}.{qualname}"


class _Refused(Exception):
    """Raised inside a hook for what it may not do (reported after the hook returns, even if
    the hook caught it)."""


@dataclass
class _Run:
    """What the hooks of one config did: arrays zeroed, and what was refused."""

    hook: str = ""
    phase: str = "pre_hook"
    zero: set[str] = field(default_factory=set)
    refused: list[str] = field(default_factory=list)

    def refuse(self, what: str) -> NoReturn:
        self.refused.append(f"{self.phase} {self.hook} {what}")
        raise _Refused(self.refused[-1])


#: tensor methods that read or make data, present on a hook's arrays and refused when called
#: (besides the in-place ones: every other name ending in one underscore, as in torch)
TENSOR_METHODS = frozenset(
    """
    data_ptr item tolist numpy cpu cuda to type clone detach contiguous is_contiguous storage
    untyped_storage storage_offset get_device record_stream pin_memory view view_as reshape
    flatten expand expand_as permute transpose t squeeze unsqueeze narrow select index_select
    masked_select gather split chunk unbind new_empty new_zeros new_ones new_full new_tensor
    float half bfloat16 int long bool double sum mean amax amin max min abs any all norm equal
    eq ne lt le gt ge add sub mul div neg sqrt exp log pow matmul cumsum sort argmax argmin
    nonzero count_nonzero isnan isinf allclose
    """.split()
)
#: tensor properties that describe data or a device, refused when read
TENSOR_PROPERTIES = frozenset("device data T mT is_cuda is_cpu grad requires_grad is_leaf".split())


def _tensor_method(attr: str) -> bool:
    """Whether a tensor has a method ``attr`` that the placeholder does not answer."""
    return attr in TENSOR_METHODS or (attr.endswith("_") and not attr.startswith("_"))


class HookArray:
    """An array as a hook sees it: ``shape``, ``dtype`` (Triton's), ``ndim``, ``numel()``,
    ``element_size()``, ``stride()``, ``size()`` and ``zero_()``; no data. Other tensor
    methods are present but refused when called, tensor properties that describe data are
    refused when read, and what a tensor does not have raises AttributeError."""

    __slots__ = ("_arr", "_name", "_run")

    def __init__(self, arr: ArgArray, name: str, run: _Run) -> None:
        self._arr, self._name, self._run = arr, name, run

    @property
    def shape(self) -> tuple[int, ...]:
        return self._arr.shape

    @property
    def dtype(self) -> Any:
        return self._arr.dtype

    @property
    def ndim(self) -> int:
        return self._arr.ndim

    def numel(self) -> int:
        return self._arr.numel()

    def element_size(self) -> int:
        return self._arr.element_size()

    def stride(self, dim: int | None = None) -> Any:
        return self._arr.stride(dim)

    def size(self, dim: int | None = None) -> Any:
        return self.shape if dim is None else self.shape[dim]

    def zero_(self) -> HookArray:
        if self._run.phase != "pre_hook":
            self._run.refuse(f"zeroed {self._name} after the launch")
        if "[" in self._name or "." in self._name:
            self._run.refuse(f"zeroed {self._name}, which is not an array argument of the kernel")
        self._run.zero.add(self._name)
        return self

    def __getattr__(self, attr: str) -> Any:
        if attr in TENSOR_PROPERTIES:
            self._refuse_use(attr)
        if _tensor_method(attr):
            return lambda *args, **kwargs: self._refuse_use(attr)
        raise AttributeError(
            f"{self._name} has no attribute {attr!r}: at lowering a hook's arrays are "
            "placeholders with shape, dtype, ndim, numel(), element_size(), stride(), size() "
            "and zero_(), and no data"
        )

    def _refuse_use(self, attr: str) -> NoReturn:
        self._run.refuse(f"used {self._name}.{attr}, but arrays have no data at lowering")

    def __repr__(self) -> str:
        return f"HookArray({self._name}: {self._arr.jax_dtype.name}{list(self.shape)})"


def _refusing(what: str) -> Callable[..., NoReturn]:
    def method(self: HookArray, *args: Any) -> NoReturn:
        self._run.refuse(what.format(name=self._name))

    return method


for _dunder, _what in {
    "__getitem__": "read {name}[...]",
    "__setitem__": "wrote {name}[...]",
    "__iter__": "iterated over {name}",
    "__array__": "read the data of {name}",
    "__float__": "read {name} as a number",
    "__int__": "read {name} as a number",
    "__index__": "read {name} as a number",
    "__bool__": "read {name} as a truth value",
}.items():
    setattr(HookArray, _dunder, _refusing(_what))
for _op in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "and", "or", "xor"):
    setattr(HookArray, f"__{_op}__", _refusing(f"computed with {{name}} (__{_op}__)"))
    setattr(HookArray, f"__r{_op}__", _refusing(f"computed with {{name}} (__r{_op}__)"))
    setattr(HookArray, f"__i{_op}__", _refusing(f"updated {{name}} in place (__i{_op}__)"))


def _is_descriptor(value: Any) -> bool:
    """Whether ``value`` (an argument as bound, not a placeholder) is a host descriptor."""
    return isinstance(getattr(value, "base", None), ArgArray) and hasattr(value, "block_shape")


def _fields(desc: Any) -> dict[str, Any]:
    """A descriptor's fields besides its base, lists copied (a hook may change them in place)."""
    return {k: list(v) if isinstance(v, list) else v for k, v in vars(desc).items() if k != "base"}


def _placeholder(value: Any, name: str, run: _Run) -> Any:
    if isinstance(value, ArgArray):
        return HookArray(value, name, run)
    if _is_descriptor(value):
        seen = copy.copy(value)
        for k, v in _fields(value).items():
            setattr(seen, k, v)
        seen.base = HookArray(value.base, f"{name}.base", run)
        return seen
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(_placeholder(v, f"{name}[{i}]", run) for i, v in enumerate(value))
    return value


@dataclass(frozen=True)
class Effects:
    """What a config's hooks mean for its launch: parameters to zero before each launch, and
    descriptor arguments with the block shape the hooks set."""

    zero: frozenset[str] = frozenset()
    descriptors: Mapping[str, Any] = field(default_factory=dict)


def run_hooks(
    hooks: Sequence[tuple[str, Callable[..., Any], Mapping[str, Any]]],
    nargs: Mapping[str, Any],
    kernel: str,
    gluon: bool,
) -> Effects:
    """Run ``hooks`` (each ``(phase, function, keywords)``, phase "pre_hook" or "post_hook")
    in order on placeholders of ``nargs``, as Triton's autotuner runs them for one config.

    Raises:
        KernelArgumentError: a hook did something to an array other than ``zero_()`` of an
            array argument, set a descriptor field other than ``block_shape`` (or set a block
            shape that does not fit the descriptor), or did anything in a post_hook.
        whatever a hook raises.
    """
    run = _Run()
    seen = {name: _placeholder(value, name, run) for name, value in nargs.items()}
    descs = {name: seen[name] for name, value in nargs.items() if _is_descriptor(value)}
    for phase, hook, keywords in hooks:
        run.phase, run.hook = phase, hook_name(hook)
        before = {name: (_fields(d), d.base) for name, d in descs.items()}
        try:
            hook(seen, **keywords)
        except _Refused:
            pass
        except Exception as e:  # the hook's own error, raised as it is (named on Python 3.11+)
            if hasattr(e, "add_note"):
                e.add_note(
                    f"in the {phase} {run.hook} of {kernel}, run at lowering on placeholders"
                )
            raise
        allowed = {"block_shape"} if phase == "pre_hook" else set()
        for name, d in descs.items():
            fields, base = before[name]
            now = _fields(d)
            changed = [k for k in sorted(fields.keys() | now.keys()) if fields.get(k) != now.get(k)]
            changed += ["base"] if d.base is not base else []
            if set(changed) - allowed:
                run.refused.append(
                    f"{phase} {run.hook} set {name}.{', '.join(changed)}; a hook may set only the "
                    "block_shape of a descriptor, before the launch"
                )
        if run.refused:
            raise KernelArgumentError(f"{kernel}: {run.refused[0]}; {ADVICE}")
    made: dict[str, Any] = {}
    for name, d in descs.items():
        original = nargs[name]
        try:
            block = [int(b) for b in d.block_shape]
        except (TypeError, ValueError):
            raise KernelArgumentError(
                f"{kernel}: a pre_hook set {name}.block_shape to {d.block_shape!r}, not a list of "
                "integers"
            ) from None
        if block == [int(b) for b in original.block_shape]:
            continue
        desc = SimpleNamespace(
            shape=original.shape,
            strides=original.strides,
            block_shape=block,
            padding=original.padding,
            round_f32_to_tf32=getattr(original, "round_f32_to_tf32", False),
            layout=getattr(original, "layout", None),
        )
        where = f"{name} (block_shape set by a pre_hook)"
        made[name] = tma.triton_descriptor(desc, original.base, gluon, kernel, where)
    return Effects(frozenset(run.zero), made)
