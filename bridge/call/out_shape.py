"""The ``out_shape=`` conventions: jax-triton 0.2 and 0.3 (``"0.3"``), and the ROCm fork of
jax-triton (``"rocm"``), as :mod:`.conventions` describes them.

Both place the outputs on the parameters after the positional arguments (or those ``out_names=``
or the keys of a dict ``out_shape`` name); they differ in how positional arguments fill the
parameters and in what a dict ``input_output_aliases`` maps. Their ``convention=`` values are
declared here, and :func:`is_struct`, what describes an output (under ``out_type=`` too).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np

from ..exceptions import KernelArgumentError
from .kernel_objects import KernelParts
from .placeholders import ArgArray
from .tracing import Inputs, Plan, is_descriptor, is_ref, leaf_arrays

#: the convention= values of the out_shape= conventions (see :mod:`.conventions`)
JAX_TRITON_03, ROCM_FORK = "0.3", "rocm"


def param_index(parts: KernelParts, ref: Any, what: str) -> str:
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


def is_struct(x: Any) -> bool:
    """Whether ``x`` describes an array: it has a ``.shape`` and a ``.dtype``."""
    return hasattr(x, "shape") and hasattr(x, "dtype")


def name_of(named: Mapping[str, Any], arr: ArgArray) -> str:
    for n, v in named.items():
        if v is arr or (isinstance(v, tuple) and arr in leaf_arrays(v)):
            return n
    return ""


def _outputs_03(
    parts: KernelParts, n_args: int, out_shape: Any, out_names: Any
) -> tuple[list[str], list[Any], Callable[[list[Any]], Any]]:
    """Output parameter names, their shapes, and how to rebuild the caller's structure."""
    names = parts.arg_names
    # (a struct first: a new class's first check against the Mapping ABC costs tens of us)
    if not is_struct(out_shape) and isinstance(out_shape, Mapping):
        keys_ = [param_index(parts, k, "out_shape key") for k in out_shape]
        if out_names is not None:
            given = [out_names] if isinstance(out_names, (str, int)) else list(out_names)
            if {param_index(parts, n, "out_names entry") for n in given} != set(keys_):
                raise KernelArgumentError(
                    "out_names and the keys of out_shape name different parameters"
                )
        shapes = list(out_shape.values())
        return keys_, shapes, lambda outs: dict(zip(keys_, outs, strict=True))
    if is_struct(out_shape):  # one output (the common case): no tree to flatten
        leaves, rebuild = [out_shape], _only
    else:
        leaves, tree = jax.tree_util.tree_flatten(out_shape, is_leaf=is_struct)
        rebuild = functools.partial(jax.tree_util.tree_unflatten, tree)
    if any(not is_struct(leaf) for leaf in leaves):
        raise KernelArgumentError(
            "out_shape must hold objects with .shape and .dtype (e.g. jax.ShapeDtypeStruct)"
        )
    if out_names is not None:
        given = [out_names] if isinstance(out_names, (str, int)) else list(out_names)
        outs = [param_index(parts, n, "out_names entry") for n in given]
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
    return jax.tree_util.tree_leaves(list(args), is_leaf=lambda v: is_descriptor(v) or is_ref(v))


def _coordinate(parts: KernelParts, named: Mapping[str, Any], ref: Any) -> list[ArgArray]:
    """The input arrays at a coordinate of the kernel's signature, as the ROCm fork reads one:
    a parameter index or name, or a tuple of one and indices into a tuple argument."""
    path = ref if isinstance(ref, tuple) and ref else (ref,)
    value = named.get(param_index(parts, path[0], "input_output_aliases key"))
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
    if not is_struct(out_shape) and isinstance(out_shape, Mapping):
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
        if not is_struct(want) or (tuple(want.shape), np.dtype(want.dtype)) != (
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
                found = leaf_arrays(named.get(param_index(parts, src, "input_output_aliases key")))
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
            found = leaf_arrays(named.get(param_index(parts, ref, "input_output_aliases entry")))
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
                **{name_of(named, a): x for a, x in zip(inplace, extras, strict=True)},
            }
        if not n_regular:
            return extras[0] if len(extras) == 1 else tuple(extras)
        head = regular if isinstance(regular, tuple) else (regular,)
        return (*head, *extras)

    return Plan(named, kwargs, out_list, initial, inplace, visible, finish, list(out_list))
