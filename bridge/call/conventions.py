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

Each gives a :class:`~.tracing.Plan`: arguments and outputs by parameter, and how the results
become what the caller gets back. This module chooses the reading; :mod:`.out_shape` plans the
two ``out_shape=`` conventions and :mod:`.out_type` the ``out_type=`` one (imported when a call
takes it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..exceptions import KernelArgumentError
from .kernel_objects import KernelParts, set_by_layers
from .out_shape import JAX_TRITON_03, ROCM_FORK, plan_out_shape
from .placeholders import ArgArray
from .tracing import Inputs, Plan, leaf_arrays

#: jax-triton 0.4's convention= value (the out_shape= ones are :mod:`.out_shape`'s)
JAX_TRITON_04 = "0.4"
#: convention= values, and what each names
CONVENTIONS = {
    JAX_TRITON_03: "jax-triton 0.3",
    JAX_TRITON_04: "jax-triton 0.4",
    ROCM_FORK: "the ROCm fork of jax-triton",
}


def _misfit(parts: KernelParts, plan: Plan) -> str:
    """Why a plan does not fit the kernel's signature ("" when it does): a non-constexpr
    parameter nothing fills, or an array on a constexpr."""
    layers = set_by_layers(parts)
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
        from .out_type import plan_04

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
