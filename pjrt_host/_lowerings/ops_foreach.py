"""``_foreach_*`` ops: the list-of-tensors forms that torch.optim uses on
non-CPU devices.  Each is the per-tensor lowering mapped over the list,
with the second operand a list, a scalar, a list of scalars or one tensor
depending on the overload.
"""

from __future__ import annotations

import jax.numpy as jnp

from . import lookup, lowering
from . import ops_pointwise as pw


class _Name:
    """Looks like an OpOverload to :func:`lookup`."""

    def __init__(self, name: str) -> None:
        self._name = name

    def name(self) -> str:
        return self._name


def _pairs(other, n):
    """The second operand for each of n tensors."""
    return other if isinstance(other, (list, tuple)) else [other] * n


def _binary(fn, with_alpha):
    if with_alpha:
        def lower(tensors, other, alpha=1):
            return [fn(t, o, alpha) for t, o in zip(tensors, _pairs(other, len(tensors)))]
    else:
        def lower(tensors, other):
            return [fn(t, o) for t, o in zip(tensors, _pairs(other, len(tensors)))]
    return lower


_BINARY = {
    "add": (pw.add, True), "sub": (pw.sub, True), "mul": (pw.mul, False), "div": (pw.div, False),
    "maximum": (pw.maximum, False), "minimum": (pw.minimum, False), "pow": (pw.pow, False),
    "clamp_min": (pw.clamp_min, False), "clamp_max": (pw.clamp_max, False),
}
# Their scalars are traced from the first call (``traced_scalars``): torch.optim
# passes step sizes and bias corrections that change every step (lists of
# Python floats in its default, non-capturable foreach step), and a trial of
# a step over every parameter at once may be too large to run twice.
for _name, (_fn, _alpha) in _BINARY.items():
    lowering(*(f"aten::_foreach_{_name}.{o}" for o in ("List", "Scalar", "ScalarList", "Tensor")),
             traced_scalars=True)(_binary(_fn, _alpha))


def _unary(fn):
    def lower(tensors):
        return [fn(t) for t in tensors]

    return lower


for _name in ("sqrt", "exp", "abs", "neg", "log", "log1p", "expm1", "sigmoid", "tanh", "sin", "cos", "reciprocal",
              "floor", "ceil", "round", "trunc", "frac", "sign", "erf", "rsqrt", "log2", "log10", "exp2",
              "tan", "asin", "acos", "atan", "sinh", "cosh", "erfc", "lgamma"):
    _fn = lookup(_Name(f"aten::{_name}"))
    if _fn is not None:
        lowering(f"aten::_foreach_{_name}")(_unary(_fn.fn))


@lowering("aten::_foreach_pow.ScalarAndTensor")
def foreach_pow_scalar_and_tensor(base, exponents):
    """``base ** e`` for each tensor ``e``: the capturable optimizers' bias
    corrections (``torch._foreach_pow(beta1, state_steps)``)."""
    return [pw.pow(base, e) for e in exponents]


@lowering("aten::_foreach_max")
def foreach_max(tensors):
    """Each tensor's largest element (clip_grad_norm_'s inf norm)."""
    return [jnp.max(t) for t in tensors]


@lowering("aten::_foreach_clone")
def foreach_clone(tensors, memory_format=None):
    return [jnp.array(t, copy=True) for t in tensors]


@lowering("aten::_foreach_zero")
def foreach_zero(tensors):
    return [jnp.zeros_like(t) for t in tensors]


def _ternary(fn):
    def lower(tensors, tensors1, tensors2, scalars=1):
        if isinstance(scalars, (list, tuple)):
            values = scalars
        elif getattr(scalars, "ndim", 0) > 0:  # .Tensor: a 1-D tensor of one value per tensor
            values = [scalars[i] for i in range(len(tensors))]
        else:  # a number, or a traced one (a 0-d array)
            values = [scalars] * len(tensors)
        return [fn(t, a, b, value=v) for t, a, b, v in zip(tensors, tensors1, tensors2, values)]

    return lower


lowering("aten::_foreach_addcmul.Scalar", "aten::_foreach_addcmul.ScalarList", "aten::_foreach_addcmul.Tensor",
         traced_scalars=True)(_ternary(pw.addcmul))
lowering("aten::_foreach_addcdiv.Scalar", "aten::_foreach_addcdiv.ScalarList", "aten::_foreach_addcdiv.Tensor",
         traced_scalars=True)(_ternary(pw.addcdiv))


@lowering("aten::_foreach_lerp.List", "aten::_foreach_lerp.Scalar", "aten::_foreach_lerp.ScalarList",
          traced_scalars=True)
def foreach_lerp(tensors, ends, weight):
    return [pw.lerp(t, e, w) for t, e, w in zip(tensors, ends, _pairs(weight, len(tensors)))]


# ---------------------------------------------------------------- torch.amp.GradScaler
# The functional forms; the dispatcher runs the in-place ones GradScaler
# calls (``_amp_foreach_non_finite_check_and_unscale_``, ``_amp_update_scale_``)
# through them and writes the results back.


@lowering("aten::_amp_foreach_non_finite_check_and_unscale.default")
def amp_foreach_non_finite_check_and_unscale(tensors, found_inf, inv_scale):
    """Each gradient times ``inv_scale``; ``found_inf`` becomes 1 if any
    element of any gradient is inf or NaN (torch's CUDA kernel's rule)."""
    bad = jnp.zeros((), dtype=jnp.bool_)
    for t in tensors:
        bad = bad | ~jnp.all(jnp.isfinite(t))
    scale = inv_scale.reshape(())
    unscaled = [(t * scale.astype(t.dtype)).astype(t.dtype) for t in tensors]
    return unscaled, jnp.maximum(found_inf, bad.astype(found_inf.dtype))


@lowering("aten::_amp_update_scale.default")
def amp_update_scale(scale, growth_tracker, found_inf, growth_factor, backoff_factor, growth_interval):
    """torch's _amp_update_scale: back off and reset on inf/NaN; grow (if the
    grown scale stays finite) after ``growth_interval`` clean steps.  Each
    input is one element of any shape (a 0-d scale with a ``(1,)`` tracker,
    as CPU accepts); each result keeps its input's shape."""
    for name, t in (("current_scale", scale), ("growth_tracker", growth_tracker), ("found_inf", found_inf)):
        if t.size != 1:  # CPU's kernel's check and words
            raise RuntimeError(f"{name} must be a 1-element tensor.")
    found = found_inf.reshape(()) != 0  # CPU's `if (*found_inf)`: NaN backs off too
    current, tracker = scale.reshape(()), growth_tracker.reshape(())
    successful = tracker + 1
    grow = successful >= growth_interval
    grown = current * growth_factor
    grown = jnp.where(jnp.isfinite(grown), grown, current)
    new_scale = jnp.where(found, current * backoff_factor, jnp.where(grow, grown, current))
    new_tracker = jnp.where(found | grow, jnp.zeros_like(tracker), successful)
    return (new_scale.astype(scale.dtype).reshape(scale.shape),
            new_tracker.astype(growth_tracker.dtype).reshape(growth_tracker.shape))


@lowering("aten::_foreach_copy.default")
def foreach_copy(tensors, src, non_blocking=False):
    """Each tensor gets its source's values (broadcast, in its own dtype);
    FSDP2 copies its unsharded parameters in this way."""
    return [jnp.broadcast_to(s, t.shape).astype(t.dtype) for t, s in zip(tensors, src)]
