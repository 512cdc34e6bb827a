"""The calling conventions of ``triton_call``: where a call's arguments and outputs go.

Three conventions, named by ``convention=``:

- ``"0.3"``, jax-triton 0.2 and 0.3 (``out_shape=``): the positional arguments are flattened as
  a pytree, so a ``None`` vanishes and a tuple's items fill one parameter each; they fill the
  parameters in order, and the output pointers are the parameters right after them (or those
  ``out_names=`` / the keys of a dict ``out_shape`` name). A dict ``input_output_aliases``
  maps an input *array* index (or parameter name) to an output index (or name), the output
  keeping its own parameter, its buffer starting as the input.
- ``"rocm"``, the ROCm fork of jax-triton (``out_shape=``): positional arguments bind as in a
  Python call of the kernel (``None`` and tuples fill one parameter each); outputs are placed
  as above. A dict ``input_output_aliases`` maps a signature coordinate (a parameter index or
  name, or a tuple of one and indices into a tuple argument) to an index of ``out_shape``, whose
  aliased entries follow the pure outputs; an aliased input has no output parameter: the
  kernel writes through the input's pointer.
- ``"0.4"``, jax-triton 0.4 (``out_type=``): arguments bind to the signature like a Python call
  (positionally and by keyword, in any order); the outputs, a pytree, fill the non-constexpr
  parameters no argument fills, in declaration order. ``input_output_aliases`` maps an index of
  the *flattened* operands (non-constexpr parameters in declaration order, tuples flattened,
  scalars counted) to an index of the flattened outputs, and an aliased output has no parameter.

Both ``out_shape=`` conventions take the fork's ``out_names=``, dict ``out_shape`` and sequence
``input_output_aliases`` (inputs updated in place, returned after the outputs); keywords may
name any parameter. Without ``convention=``, ``out_type=`` means 0.4, and an ``out_shape=``
call the two read alike (no positional ``None`` or container, no dict ``input_output_aliases``)
is planned once; any other is read both ways and the reading that fits the kernel's signature
is taken (outputs on non-constexpr parameters, every parameter without a default and not set
by an autotune config or heuristic filled, no array on a constexpr). A call that fits both or
neither is an error naming each reading: the two place arguments differently, so none is
guessed.

Each gives a :class:`Plan`: arguments and outputs by parameter, and how the results become what
the caller gets back.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

from ..errors import KernelArgumentError
from . import tma
from .arguments import Inputs, is_ref, leaf_arrays
from .binding import ArgArray
from .kernels import KernelParts

#: the convention= values (see the module docstring)
JAX_TRITON_03, JAX_TRITON_04, ROCM_FORK = "0.3", "0.4", "rocm"
#: convention= values, and what each names
CONVENTIONS = {
    JAX_TRITON_03: "jax-triton 0.3",
    JAX_TRITON_04: "jax-triton 0.4",
    ROCM_FORK: "the ROCm fork of jax-triton",
}


def _operand_leaves(value: Any) -> list[Any]:
    """The leaves of a converted argument as jax-triton 0.4 counts operands: arrays, scalars
    and descriptors one each, tuples flattened, None none."""
    if value is None:
        return []
    if isinstance(value, tuple):
        return [x for v in value for x in _operand_leaves(v)]
    return [value]


def _param_index(parts: KernelParts, ref: Any, what: str) -> str:
    names = parts.arg_names
    if isinstance(ref, str):
        if ref not in names:
            raise KernelArgumentError(
                f"{what} {ref!r} is not a parameter of {parts.qualname} ({', '.join(names)})"
            )
        return ref
    if isinstance(ref, (int, np.integer)) and 0 <= int(ref) < len(names):
        return names[int(ref)]
    raise KernelArgumentError(
        f"{what} {ref!r} is not a parameter name or index of {parts.qualname}"
    )


def _is_struct(x: Any) -> bool:
    return hasattr(x, "shape") and hasattr(x, "dtype")


def _name_of(named: Mapping[str, Any], arr: ArgArray) -> str:
    for n, v in named.items():
        if v is arr or (isinstance(v, tuple) and arr in leaf_arrays(v)):
            return n
    return ""


@dataclass
class Plan:
    """What a convention decides: arguments and outputs by parameter, buffers updated in place,
    and how the results become what the caller gets back."""

    named: dict[str, Any]  # every argument given and every output, by parameter name
    kwargs: dict[str, Any]  # kernel parameters the caller pinned
    outputs: list[ArgArray]  # output parameters (in the order of their slots)
    initial: dict[int, ArgArray]  # id(output) -> the input whose value it starts from
    inplace: list[ArgArray]  # inputs the kernel updates in place (each gets a result)
    visible: list[ArgArray]  # the caller's results, flat
    rebuild: Callable[[list[Any]], Any]  # flat results -> what triton_call returns
    zero_targets: list[ArgArray]  # what an integer in zeroed_outputs names


def _outputs_03(
    parts: KernelParts, n_args: int, out_shape: Any, out_names: Any
) -> tuple[list[str], list[Any], Callable[[list[Any]], Any]]:
    """Output parameter names, their shapes, and how to rebuild the caller's structure."""
    names = parts.arg_names
    # (a struct first: a new class's first check against the Mapping ABC costs tens of us)
    if not _is_struct(out_shape) and isinstance(out_shape, Mapping):
        keys_ = [_param_index(parts, k, "out_shape key") for k in out_shape]
        if out_names is not None:
            given = [out_names] if isinstance(out_names, (str, int)) else list(out_names)
            if {_param_index(parts, n, "out_names entry") for n in given} != set(keys_):
                raise KernelArgumentError(
                    "out_names and the keys of out_shape name different parameters"
                )
        shapes = list(out_shape.values())
        return keys_, shapes, lambda outs: dict(zip(keys_, outs, strict=True))
    if _is_struct(out_shape):  # one output (the common case): no tree to flatten
        leaves, rebuild = [out_shape], _only
    else:
        leaves, tree = jax.tree_util.tree_flatten(out_shape, is_leaf=_is_struct)
        rebuild = functools.partial(jax.tree_util.tree_unflatten, tree)
    if any(not _is_struct(leaf) for leaf in leaves):
        raise KernelArgumentError(
            "out_shape must hold objects with .shape and .dtype (e.g. jax.ShapeDtypeStruct)"
        )
    if out_names is not None:
        given = [out_names] if isinstance(out_names, (str, int)) else list(out_names)
        outs = [_param_index(parts, n, "out_names entry") for n in given]
        if len(outs) != len(leaves):
            raise KernelArgumentError(
                f"out_names names {len(outs)} output(s) but out_shape describes {len(leaves)}"
            )
    else:
        if n_args + len(leaves) > len(names):
            raise KernelArgumentError(
                f"{parts.qualname} has {len(names)} parameters ({', '.join(names)}); "
                f"{n_args} positional argument(s) and {len(leaves)} output(s) do not fit. "
                "Outputs follow the positional arguments unless out_names= or a dict out_shape= "
                "names them (or write out_type=, jax-triton 0.4's convention: outputs fill the "
                "parameters no argument fills)"
            )
        outs = names[n_args : n_args + len(leaves)]
    if len(set(outs)) != len(outs):
        raise KernelArgumentError(f"an output parameter is named twice: {outs}")
    for p in parts.fn.params:
        if p.name in outs and p.is_constexpr:
            raise KernelArgumentError(
                f"output {p.name} of {parts.qualname} is a tl.constexpr: outputs are pointer "
                "parameters. With out_shape= (jax-triton 0.3) outputs follow the positional "
                "arguments unless out_names= or a dict out_shape= names them; with out_type= "
                "(jax-triton 0.4) they fill the parameters no argument fills"
            )
    return outs, leaves, rebuild


def _only(flat: list[Any]) -> Any:
    (value,) = flat
    return value


def _flatten_03(args: Sequence[Any]) -> list[Any]:
    """The positional arguments as jax-triton 0.3 passed them: flattened as a pytree, so a
    ``None`` vanishes and a tuple's items fill one parameter each (descriptors and refs, which
    0.3 did not know, stay whole)."""
    return jax.tree_util.tree_leaves(
        list(args), is_leaf=lambda v: tma.is_descriptor(v) or is_ref(v)
    )


def _coordinate(parts: KernelParts, named: Mapping[str, Any], ref: Any) -> list[ArgArray]:
    """The input arrays at a coordinate of the kernel's signature, as the ROCm fork reads one:
    a parameter index or name, or a tuple of one and indices into a tuple argument."""
    path = ref if isinstance(ref, tuple) and ref else (ref,)
    value = named.get(_param_index(parts, path[0], "input_output_aliases key"))
    for i in path[1:]:
        if not isinstance(value, tuple) or not isinstance(i, int) or not 0 <= i < len(value):
            raise KernelArgumentError(
                f"input_output_aliases key {ref!r}: {i!r} does not index the tuple argument there"
            )
        value = value[i]
    return [a for a in leaf_arrays(value) if a.slot[0] == "in"]


def _split_rocm(
    out_shape: Any, out_names: Any, aliases: Mapping[Any, Any]
) -> tuple[Any, list[Any], int]:
    """The ROCm fork's dict ``input_output_aliases``: ``out_shape`` lists the pure outputs,
    then one entry per aliased input (as many pure outputs as ``out_names`` names, if given).
    Returns the pure outputs' ``out_shape``, every entry, and the number of pure outputs."""
    if not _is_struct(out_shape) and isinstance(out_shape, Mapping):
        raise KernelArgumentError(
            "with a dict out_shape, list the inputs updated in place "
            "(input_output_aliases=['x_ptr']): the ROCm fork's dict form describes them at the "
            "end of a sequence out_shape"
        )
    many = isinstance(out_shape, (tuple, list))
    entries = list(out_shape) if many else [out_shape]
    if out_names is None:
        n_pure = len(entries) - len(aliases)
    else:
        n_pure = 1 if isinstance(out_names, (str, int)) else len(out_names)
        if len(entries) - n_pure != len(aliases):
            n_pure = -1
    if n_pure < 0:
        raise KernelArgumentError(
            f"out_shape has {len(entries)} entries: the pure outputs"
            + ("" if out_names is None else " out_names names")
            + f", then one per aliased input ({len(aliases)} in input_output_aliases)"
        )
    pure = tuple(entries[:n_pure]) if many else (out_shape if n_pure else ())
    return pure, entries, n_pure


def _aliases_rocm(
    parts: KernelParts,
    named: Mapping[str, Any],
    aliases: Mapping[Any, Any],
    entries: list[Any],
    n_pure: int,
) -> list[ArgArray]:
    """The inputs a ROCm-fork dict ``{input coordinate: out_shape index}`` updates in place,
    in the order of their ``out_shape`` entries (which follow the pure outputs)."""
    by_entry: dict[int, ArgArray] = {}
    for ref, j in aliases.items():
        found = _coordinate(parts, named, ref)
        if len(found) != 1:
            raise KernelArgumentError(
                f"input_output_aliases key {ref!r} names {len(found)} input arrays: a dict "
                "entry names one (a list, input_output_aliases=[...], takes whole tuples)"
            )
        if not isinstance(j, (int, np.integer)) or not n_pure <= int(j) < len(entries):
            raise KernelArgumentError(
                f"input_output_aliases value {j!r}: the aliased inputs are out_shape entries "
                f"{n_pure}..{len(entries) - 1}, after the {n_pure} pure output(s)"
            )
        if int(j) in by_entry or found[0] in by_entry.values():
            raise KernelArgumentError("input_output_aliases must be a bijection")
        want = entries[int(j)]
        arr = found[0]
        if not _is_struct(want) or (tuple(want.shape), np.dtype(want.dtype)) != (
            arr.shape,
            arr.jax_dtype,
        ):
            raise KernelArgumentError(
                f"input_output_aliases: out_shape[{j}] {want!r} does not describe input {ref!r} "
                f"{arr}: shapes and dtypes must match"
            )
        by_entry[int(j)] = arr
    return [by_entry[j] for j in sorted(by_entry)]


def plan_out_shape(
    parts: KernelParts,
    inputs: Inputs,
    args: Sequence[Any],
    kernel_kwargs: Mapping[str, Any],
    out_shape: Any,
    out_names: Any,
    input_output_aliases: Any,
    convention: str,
) -> Plan:
    """The ``out_shape=`` conventions, jax-triton 0.3's (``"0.3"``) and the ROCm fork's
    (``"rocm"``); see the module docstring for where they differ."""
    names = parts.arg_names
    rocm_dict = (
        convention == ROCM_FORK
        and bool(input_output_aliases)
        and isinstance(input_output_aliases, Mapping)
    )
    if convention == JAX_TRITON_03:
        args = _flatten_03(args)
    entries: list[Any] = []
    n_pure = 0
    if rocm_dict:
        out_shape, entries, n_pure = _split_rocm(out_shape, out_names, input_output_aliases)
    out_params, out_structs, rebuild = _outputs_03(parts, len(args), out_shape, out_names)
    in_params = [n for n in names if n not in out_params]
    if len(args) > len(in_params):
        raise KernelArgumentError(
            f"{parts.qualname} takes {len(in_params)} input argument(s) ({', '.join(in_params)}) "
            f"besides its output(s) {', '.join(out_params)}; {len(args)} were given"
        )
    given: dict[str, Any] = dict(zip(in_params, args, strict=False))
    if convention == JAX_TRITON_03:
        for p in parts.fn.params:
            if p.is_constexpr and p.name in given:
                raise KernelArgumentError(
                    f"a positional argument lands on {p.name}, a tl.constexpr of "
                    f"{parts.qualname}: jax-triton 0.3 passed positional arguments as runtime "
                    "parameters; pass constexprs by keyword"
                )
    for key in kernel_kwargs:
        if key in out_params:
            raise KernelArgumentError(f"{key} is an output of {parts.qualname}: do not pass it")
        if key in given:
            raise KernelArgumentError(
                f"{parts.qualname} got {key} both by position and by keyword (multiple values "
                f"for argument '{key}')"
            )
    named: dict[str, Any] = {}
    outputs: dict[str, ArgArray] = {}
    for n in names:
        if n in out_params:
            s = out_structs[out_params.index(n)]
            outputs[n] = named[n] = ArgArray(s.shape, s.dtype, ("out", out_params.index(n)))
        elif n in given or n in kernel_kwargs:
            named[n] = inputs.convert(given[n] if n in given else kernel_kwargs[n], n)
    kwargs = {k: named[k] for k in kernel_kwargs}
    if inputs.refs and input_output_aliases:
        raise KernelArgumentError(
            "input_output_aliases cannot be combined with Ref arguments. Refs express "
            "input/output aliasing implicitly"
        )

    # roles of input arrays: an output's initial value (0.3 dict), updated in place (a list, or
    # the ROCm fork's dict)
    initial: dict[int, ArgArray] = {}
    inplace: list[ArgArray] = []
    if rocm_dict:
        inplace = _aliases_rocm(parts, named, input_output_aliases, entries, n_pure)
    elif input_output_aliases is not None and isinstance(input_output_aliases, Mapping):
        for src, dst in input_output_aliases.items():
            if isinstance(src, str):
                found = leaf_arrays(named.get(_param_index(parts, src, "input_output_aliases key")))
                if len(found) != 1:
                    raise KernelArgumentError(f"input_output_aliases: {src} is not one input array")
                arr = found[0]
            elif isinstance(src, (int, np.integer)) and 0 <= int(src) < len(inputs.arrays):
                arr = inputs.arrays[int(src)]
            else:
                raise KernelArgumentError(
                    f"input_output_aliases key {src!r}: use the index of an input array "
                    f"(0..{len(inputs.arrays) - 1}) or an input parameter name"
                )
            out = (
                dst
                if isinstance(dst, str)
                else (out_params[int(dst)] if 0 <= int(dst) < len(out_params) else None)
            )
            if out not in outputs:
                raise KernelArgumentError(f"input_output_aliases value {dst!r} is not an output")
            o = outputs[out]
            if (o.shape, o.jax_dtype) != (arr.shape, arr.jax_dtype):
                raise KernelArgumentError(
                    f"input_output_aliases: output {out} {o} cannot alias input {arr}: shapes and "
                    "dtypes must match"
                )
            if arr in initial.values():
                raise KernelArgumentError(f"input_output_aliases: {arr} is aliased twice")
            initial[id(o)] = arr
    elif input_output_aliases:
        refs = input_output_aliases
        if isinstance(refs, (str, int)):
            refs = [refs]
        for ref in refs:
            found = leaf_arrays(named.get(_param_index(parts, ref, "input_output_aliases entry")))
            if not found:
                raise KernelArgumentError(f"input_output_aliases: {ref!r} is not an input array")
            inplace.extend(a for a in found if a not in inplace)
    out_list = [outputs[n] for n in out_params]
    n_regular = len(out_list)
    visible = out_list + list(inplace)

    def finish(flat: list[Any]) -> Any:
        regular = rebuild(flat[:n_regular])
        extras = flat[n_regular:]
        if not extras:
            return regular
        if isinstance(regular, dict):
            return {
                **regular,
                **{_name_of(named, a): x for a, x in zip(inplace, extras, strict=True)},
            }
        if not n_regular:
            return extras[0] if len(extras) == 1 else tuple(extras)
        head = regular if isinstance(regular, tuple) else (regular,)
        return (*head, *extras)

    return Plan(named, kwargs, out_list, initial, inplace, visible, finish, list(out_list))


def _set_by_layers(parts: KernelParts) -> set[str]:
    """Parameters the kernel's autotune configs and heuristics set."""
    found: set[str] = set()
    for layer in parts.layers:
        for config in getattr(layer, "configs", ()):
            found.update(config.kwargs)
        found.update(getattr(layer, "values", {}))
    return found


def _misfit(parts: KernelParts, plan: Plan) -> str:
    """Why a plan does not fit the kernel's signature ("" when it does): a non-constexpr
    parameter nothing fills, or an array on a constexpr."""
    layers = _set_by_layers(parts)
    for p in parts.fn.params:
        if p.is_constexpr:
            if p.name in plan.named and leaf_arrays(plan.named[p.name]):
                return f"an array lands on {p.name}, a tl.constexpr"
        elif p.name not in plan.named and not p.has_default and p.name not in layers:
            return f"nothing fills {p.name}"
    return ""


def _placement(parts: KernelParts, plan: Plan) -> str:
    """Which argument each parameter gets, for a message."""
    shown = []
    for n in parts.arg_names:
        if n in plan.named:
            v = plan.named[n]
            if isinstance(v, ArgArray):
                role = "input" if v.slot[0] == "in" else "output"
                shown.append(f"{n}={role} {v.slot[1]}")
            else:
                shown.append(f"{n}={v!r}")
    return ", ".join(shown)


def _readings_differ(args: Sequence[Any], input_output_aliases: Any) -> bool:
    """Whether jax-triton 0.3 and the ROCm fork can read an ``out_shape=`` call differently: a
    positional ``None`` or container, or a dict ``input_output_aliases``."""
    if input_output_aliases and isinstance(input_output_aliases, Mapping):
        return True
    for a in args:
        if a is None or isinstance(a, (tuple, list, dict)):
            return True
    return False


def plan_call(
    parts: KernelParts,
    args: Sequence[Any],
    kernel_kwargs: Mapping[str, Any],
    *,
    out_shape: Any,
    out_type: Any,
    out_names: Any,
    input_output_aliases: Any,
    convention: str | None,
) -> tuple[Plan, Inputs]:
    """Choose the call's convention (see the module docstring) and plan it. Returns the plan
    and the call's converted inputs.

    Raises:
        KernelArgumentError: the keywords mix conventions, or the call fits none (the message
            names each convention tried and why it does not fit), or it fits two.
    """
    if convention is not None and convention not in CONVENTIONS:
        raise KernelArgumentError(
            f"convention={convention!r} is not one of "
            + ", ".join(f"{k!r} ({v})" for k, v in CONVENTIONS.items())
        )
    if out_shape is not None and out_type is not None:
        raise KernelArgumentError(
            "Cannot specify both out_type= (jax-triton 0.4: outputs fill the parameters no "
            "argument fills) and out_shape= (jax-triton 0.3: outputs follow the positional "
            "arguments); pass one"
        )
    if out_type is not None or convention == JAX_TRITON_04:
        if convention not in (None, JAX_TRITON_04):
            raise KernelArgumentError(
                f"out_type= is jax-triton 0.4's keyword; {CONVENTIONS[convention]} "
                f"(convention={convention!r}) describes outputs with out_shape="
            )
        if out_names is not None:
            raise KernelArgumentError(
                "out_names= places outputs in the out_shape= (jax-triton 0.3) convention; with "
                "out_type= the outputs fill the parameters no argument fills"
            )
        inputs = Inputs(parts)
        described = out_type if out_type is not None else out_shape  # 0.4's deprecated spelling
        plan = plan_04(
            parts,
            inputs,
            args,
            kernel_kwargs,
            () if described is None else described,
            input_output_aliases,
        )
        return plan, inputs
    if out_shape is None:
        out_shape = ()
    if convention is None and not _readings_differ(args, input_output_aliases):
        convention = ROCM_FORK  # (0.3 reads this call the same way)

    def reading(name: str) -> tuple[Plan, Inputs]:
        inputs = Inputs(parts)
        plan = plan_out_shape(
            parts, inputs, args, kernel_kwargs, out_shape, out_names, input_output_aliases, name
        )
        return plan, inputs

    if convention is not None:
        return reading(convention)
    fits: dict[str, tuple[Plan, Inputs]] = {}
    why: dict[str, str] = {}
    for name in (JAX_TRITON_03, ROCM_FORK):
        try:
            plan, inputs = reading(name)
        except KernelArgumentError as e:
            why[name] = str(e)
            continue
        why[name] = _misfit(parts, plan)
        if not why[name]:
            fits[name] = (plan, inputs)
    if len(fits) == 1:
        (chosen,) = fits.values()
        return chosen
    if fits:
        raise KernelArgumentError(
            f"this call of {parts.qualname} fits two conventions, which place its arguments "
            "differently: "
            + "; ".join(
                f"{CONVENTIONS[k]} ({_placement(parts, plan)})" for k, (plan, _) in fits.items()
            )
            + ". Say which with convention='0.3' or convention='rocm'"
        )
    raise KernelArgumentError(
        f"this call of {parts.qualname} fits no convention of out_shape=. "
        + " ".join(
            f"{CONVENTIONS[k]} (convention={k!r}): {why[k]}." for k in (JAX_TRITON_03, ROCM_FORK)
        )
        + " jax-triton 0.4 describes outputs with out_type= instead"
    )


def plan_04(
    parts: KernelParts,
    inputs: Inputs,
    args: Sequence[Any],
    kernel_kwargs: Mapping[str, Any],
    out_type: Any,
    input_output_aliases: Any,
) -> Plan:
    """The jax-triton 0.4 convention (``out_type=``; see the module docstring).

    Non-constexpr parameters with a default: when the outputs do not fill every parameter no
    argument fills, they fill those without a default, and the others keep their defaults
    (jax-triton 0.4 then raises). Missing constexprs take their defaults (Triton's binder).
    """
    names = parts.arg_names
    constexpr = {p.name for p in parts.fn.params if p.is_constexpr}
    has_default = {p.name for p in parts.fn.params if p.has_default}
    if len(args) > len(names):
        raise KernelArgumentError(
            f"{parts.qualname} takes {len(names)} positional arguments but {len(args)} were "
            "given (outputs are not passed: out_type= describes them)"
        )
    bound: dict[str, Any] = dict(zip(names, args, strict=False))
    for key, value in kernel_kwargs.items():
        if key in bound:
            raise KernelArgumentError(
                f"{parts.qualname} got multiple values for argument '{key}' (by position and by "
                "keyword)"
            )
        bound[key] = value
    leaves, tree = jax.tree_util.tree_flatten(out_type)
    if any(not _is_struct(leaf) for leaf in leaves):
        raise KernelArgumentError(
            "out_type must be a pytree of objects with .shape and .dtype (jax.ShapeDtypeStruct, "
            "jax.typeof(x), arrays)"
        )
    structs = [(tuple(leaf.shape), np.dtype(leaf.dtype)) for leaf in leaves]
    named: dict[str, Any] = {}
    for n in names:
        if n in bound:
            named[n] = inputs.convert(bound[n], n)
    operands = [
        x for n in names if n in named and n not in constexpr for x in _operand_leaves(named[n])
    ]

    if input_output_aliases is None:
        input_output_aliases = {}
    if not isinstance(input_output_aliases, Mapping):
        raise KernelArgumentError(
            "with out_type=, input_output_aliases is a dict {flattened operand index: flattened "
            "output index} (jax-triton 0.4); pass refs (jax.new_ref) for buffers updated in place"
        )
    if input_output_aliases and inputs.refs:
        raise KernelArgumentError(
            "input_output_aliases cannot be combined with Ref arguments. Refs express "
            "input/output aliasing implicitly"
        )
    alias_out: dict[int, ArgArray] = {}
    for i, j in input_output_aliases.items():
        if not isinstance(i, (int, np.integer)) or not 0 <= int(i) < len(operands):
            raise KernelArgumentError(
                f"input_output_aliases key {i!r}: with out_type= it is an index into the "
                f"{len(operands)} flattened operands (non-constexpr parameters in declaration "
                "order, tuples flattened, scalars counted)"
            )
        if not isinstance(j, (int, np.integer)) or not 0 <= int(j) < len(structs):
            raise KernelArgumentError(
                f"input_output_aliases value {j!r} is not an index into the {len(structs)} "
                "flattened outputs of out_type"
            )
        leaf = operands[int(i)]
        arr = leaf_arrays(leaf)
        if len(arr) != 1:
            raise KernelArgumentError(
                f"input_output_aliases: operand {i} is {leaf!r}, not an array: only arrays can "
                "be aliased to outputs"
            )
        if int(j) in alias_out:
            raise KernelArgumentError("input_output_aliases must be a bijection")
        if arr[0] in alias_out.values():
            raise KernelArgumentError(f"input_output_aliases: operand {i} is aliased twice")
        if (arr[0].shape, arr[0].jax_dtype) != structs[int(j)]:
            raise KernelArgumentError(
                f"input_output_aliases: output {j} {structs[int(j)]} cannot alias operand {i} "
                f"{arr[0]}: shapes and dtypes must match"
            )
        alias_out[int(j)] = arr[0]

    missing = [n for n in names if n not in constexpr and n not in bound]
    n_out = len(structs) - len(alias_out)
    if len(missing) != n_out:
        required = [n for n in missing if n not in has_default]
        if len(required) != n_out:
            raise KernelArgumentError(
                f"out_type has {n_out} unaliased outputs, but {len(missing)} kernel parameters "
                f"are missing an argument ({', '.join(missing) or 'none'}) in {parts.qualname}: "
                "outputs fill the non-constexpr parameters no argument fills, in declaration "
                "order; aliased outputs take no parameter"
            )
        missing = required
    free = iter(j for j in range(len(structs)) if j not in alias_out)
    visible: list[ArgArray | None] = [None] * len(structs)
    outputs: list[ArgArray] = []
    for n in missing:
        j = next(free)
        a = ArgArray(structs[j][0], structs[j][1], ("out", j))
        named[n] = visible[j] = a
        outputs.append(a)
    inplace = []
    for j, src in sorted(alias_out.items()):
        visible[j] = src
        inplace.append(src)
    order = {n: i for i, n in enumerate(names)}
    named = dict(sorted(named.items(), key=lambda item: order[item[0]]))
    kwargs = {n: named[n] for n in names if n in bound and (n in kernel_kwargs or n in constexpr)}
    flat = [a for a in visible if a is not None]
    return Plan(
        named,
        kwargs,
        outputs,
        {},
        inplace,
        flat,
        lambda results: jax.tree_util.tree_unflatten(tree, results),
        list(flat),
    )
