"""``aten::_softmax_backward_data`` in plain jax: the pure-Python route.

``output * (grad - sum(grad * output))``: the reference lowering's
``g - output * sum(g)`` with ``g = grad * output``, written with one
product fewer over the whole tensor.
"""

from __future__ import annotations

import jax.numpy as jnp

__all__ = ["applies", "softmax_backward"]


def applies(grad_output, output, dim, input_dtype) -> bool:
    """Floats of one dtype throughout: torch's ``input_dtype`` differs from
    the output's only after ``half_to_float``, left to the reference."""
    name = jnp.dtype(output.dtype).name
    return (jnp.issubdtype(output.dtype, jnp.floating) and grad_output.dtype == output.dtype
            and str(input_dtype).removeprefix("torch.") == name)


def softmax_backward(grad_output, output, dim, input_dtype):
    """The gradient of softmax's input, in the output's dtype; 16-bit floats
    are computed in float32 and rounded once, as torch's CPU kernel does."""
    wide = jnp.promote_types(output.dtype, jnp.float32)
    g, y = grad_output.astype(wide), output.astype(wide)
    total = jnp.sum(g * y, axis=dim if y.ndim else None, keepdims=True)  # a 0-dim input is one element
    return (y * (g - total)).astype(output.dtype)
