"""TransformerEngine's lowering-rule contract (``triton_call_lowering``) as a call plan: which
kernel parameter each of a rule's operands and results fills, and which parameters are bound
when the kernel is compiled.

The contract, argument for argument, as NVIDIA's main and AMD's fork of TransformerEngine
define it:

- Every parameter ``constexprs`` names is bound at compile time and is part of the compiled
  kernel's identity: a ``tl.constexpr``; a scalar runtime parameter (a size, a stride, a scale:
  TE hands it to Triton's compiler as a constant); a pointer given as ``None`` (an absent
  optional tensor). A scalar reaches Triton's own binder as ``tl.constexpr(value)``, which
  Triton specializes like a constexpr (its signature says ``constexpr``, its value is in the
  kernel's constants); ``None`` Triton binds as a constexpr by itself. jax's typed scalars
  (``TypedInt``, ``TypedFloat``) are bound as the plain int or float they compute as.
- The parameters it does not name, in signature order (those an autotune config or a heuristic
  sets left aside), take the rule's operands, then its results. Results beyond them have no
  parameter of their own: each must be aliased to an operand, and the kernel writes through the
  operand's pointer (the buffer jaxlib hands both). Parameters left over keep their defaults.
- ``input_output_aliases`` maps an operand index to a result index: the result's buffer is the
  operand's (jaxlib's operand-output aliasing).
- A callable grid sees every parameter by name with the values the caller gave (a scalar as
  itself, not as the ``tl.constexpr`` it is bound as) and an autotune config's.

Invariants: nothing here compiles or reads a cache; the plan's operands are exactly the rule's
operands in their order, and its visible results are the rule's results in ``ctx.avals_out``'s
order.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ..exceptions import KernelArgumentError
from .kernel_objects import KernelParts, set_by_layers
from .placeholders import ArgArray
from .tracing import Inputs, Plan

#: what a scalar runtime parameter named in ``constexprs`` may hold (bound as tl.constexpr)
_SCALARS = (bool, int, float, np.bool_, np.integer, np.floating)


def is_autotuned(parts: KernelParts) -> bool:
    """Whether one of the kernel's layers is an autotuner (its configs carry their own
    ``num_warps`` and ``num_stages``)."""
    return any(hasattr(layer, "configs") for layer in parts.layers)


def _python_scalar(value: Any) -> Any:
    return value.item() if isinstance(value, np.generic) else value


def _untyped(value: Any) -> Any:
    """``value`` with jax's typed Python scalars (``TypedInt``, ``TypedFloat``: an int or
    float that carries a dtype, what jax hands a rule for a weakly typed scalar) as the plain
    int or float they are: they compute as that (their arithmetic is the built-in's), and only
    their ``repr`` and ``dtype`` differ, which would make a kernel's identity depend on jax."""
    kind = type(value)
    if kind.__module__ == "jax._src.literals":
        for plain in (bool, int, float, complex):
            if kind.__mro__[1] is plain:
                return plain(value)
    return value


def constants(parts: KernelParts, constexprs: Mapping[str, Any]) -> dict[str, Any]:
    """The kernel's arguments for ``constexprs``, as Triton's binder is to get them: a scalar
    for a parameter not annotated ``tl.constexpr`` wrapped in ``tl.constexpr`` (bound at
    compile time); anything else as given.

    Raises:
        KernelArgumentError: a name that is not a parameter of the kernel.
    """
    import triton.language as tl

    params = {p.name: p for p in parts.fn.params}
    unknown = [name for name in constexprs if name not in params]
    if unknown:
        raise KernelArgumentError(
            f"constexprs names {', '.join(map(repr, unknown))}, which "
            f"{'is not a parameter' if len(unknown) == 1 else 'are not parameters'} of "
            f"{parts.qualname} ({', '.join(parts.arg_names)})"
        )
    out: dict[str, Any] = {}
    for name, given in constexprs.items():
        value = _untyped(given)
        if not params[name].is_constexpr and isinstance(value, _SCALARS):
            out[name] = tl.constexpr(_python_scalar(value))
        else:
            out[name] = value
    return out


def tensor_parameters(parts: KernelParts, constexprs: Mapping[str, Any]) -> list[str]:
    """The parameters the rule's operands and results fill, in signature order: those
    ``constexprs`` does not name and no autotune config or heuristic sets."""
    layers = set_by_layers(parts)
    return [n for n in parts.arg_names if n not in constexprs and n not in layers]


def _aliases(
    aliases: Mapping[Any, Any] | None, operands: Sequence[ArgArray], results: Sequence[Any]
) -> dict[int, int]:
    """``{result index: operand index}`` from the rule's ``{operand index: result index}``.

    Raises:
        KernelArgumentError: an index out of range, an operand or a result aliased twice, or
            shapes and dtypes that differ.
    """
    found: dict[int, int] = {}
    for src, dst in dict(aliases or {}).items():
        if not isinstance(src, (int, np.integer)) or not 0 <= int(src) < len(operands):
            raise KernelArgumentError(
                f"input_output_aliases key {src!r}: an operand index (0..{len(operands) - 1})"
            )
        if not isinstance(dst, (int, np.integer)) or not 0 <= int(dst) < len(results):
            raise KernelArgumentError(
                f"input_output_aliases value {dst!r}: a result index (0..{len(results) - 1})"
            )
        if int(dst) in found or int(src) in found.values():
            raise KernelArgumentError("input_output_aliases must map one operand to one result")
        arr, out = operands[int(src)], results[int(dst)]
        if (arr.shape, arr.jax_dtype) != (tuple(out.shape), np.dtype(out.dtype)):
            raise KernelArgumentError(
                f"input_output_aliases: result {dst} ({out.dtype}{list(out.shape)}) cannot alias "
                f"operand {src} {arr}: shapes and dtypes must match"
            )
        found[int(dst)] = int(src)
    return found


def plan_rule(
    parts: KernelParts,
    inputs: Inputs,
    operands: Sequence[Any],
    results: Sequence[Any],
    constexprs: Mapping[str, Any],
    aliases: Mapping[Any, Any] | None,
) -> Plan:
    """The plan of a rule's call (see the module docstring). ``operands`` are the rule's
    operands (traced arrays), ``results`` its ``ctx.avals_out``.

    Raises:
        KernelArgumentError: the kernel's parameters do not fit the operands and results (the
            message says which parameter takes what, and what to change).
    """
    names = tensor_parameters(parts, constexprs)
    params = {p.name: p for p in parts.fn.params}
    where = f"{parts.qualname} ({', '.join(parts.arg_names)})"
    if len(names) < len(operands):
        raise KernelArgumentError(
            f"{len(operands)} operands, but {where} has only {len(names)} parameter(s) that "
            f"constexprs does not name ({', '.join(names) or 'none'}): the operands fill "
            "those, in order"
        )
    in_names = names[: len(operands)]
    out_names = names[len(operands) : len(operands) + len(results)]
    left = [n for n in names[len(operands) + len(results) :] if not params[n].has_default]
    if left:
        raise KernelArgumentError(
            f"{where}: {', '.join(left)} {'is' if len(left) == 1 else 'are'} neither an "
            "operand nor a result, and not named in constexprs: name every scalar in constexprs"
        )
    named: dict[str, Any] = {}
    arrays: list[ArgArray] = []
    for name, value in zip(in_names, operands, strict=True):
        if params[name].is_constexpr:
            raise KernelArgumentError(
                f"{where}: operand {len(arrays)} lands on {name}, a tl.constexpr; name it in "
                "constexprs (the operands fill the parameters constexprs does not name)"
            )
        arr = inputs.convert(value, name)
        assert isinstance(arr, ArgArray)
        arrays.append(arr)
        named[name] = arr
    outputs: list[ArgArray] = []
    for j, (name, out) in enumerate(zip(out_names, results, strict=False)):
        if params[name].is_constexpr:
            raise KernelArgumentError(
                f"{where}: result {j} lands on {name}, a tl.constexpr; name it in constexprs"
            )
        outputs.append(ArgArray(out.shape, out.dtype, ("out", j)))
        named[name] = outputs[-1]
    by_result = _aliases(aliases, arrays, results)
    unplaced = [j for j in range(len(outputs), len(results)) if j not in by_result]
    if unplaced:
        raise KernelArgumentError(
            f"{where}: result(s) {', '.join(map(str, unplaced))} have no parameter (the "
            f"parameters constexprs does not name are {', '.join(names)}: the {len(operands)} "
            "operands, then the results) and alias no operand (input_output_aliases)"
        )
    initial = {id(outputs[j]): arrays[i] for j, i in by_result.items() if j < len(outputs)}
    inplace = [arrays[by_result[j]] for j in range(len(outputs), len(results))]
    named.update(constants(parts, constexprs))
    visible: list[ArgArray] = [*outputs, *inplace]
    return Plan(
        named=named,
        kwargs={k: named[k] for k in constexprs},
        outputs=outputs,
        initial=initial,
        inplace=inplace,
        visible=visible,
        rebuild=list,
        zero_targets=list(outputs),
    )


def meta_grid(grid: Any, constexprs: Mapping[str, Any]) -> Any:
    """``grid`` as the bridge evaluates it (a function of every bound parameter): a callable
    grid sees the scalars ``constexprs`` gave as themselves (they are bound as
    ``tl.constexpr``); anything else is returned as is."""
    if not callable(grid):
        return grid
    given = dict(constexprs)

    def evaluated(bound: Mapping[str, Any]) -> Any:
        return grid({**bound, **{k: v for k, v in given.items() if k in bound}})

    wrapped: Callable[[Mapping[str, Any]], Any] = evaluated
    return wrapped
