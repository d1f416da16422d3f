"""Reading a tensor's values out of its storage and writing them back, as
traceable functions (they run inside each op's compiled function, so a read
through a slice or a write into one is fused with the op)."""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
from jax import lax

__all__ = ["read", "write", "gather_index"]


def gather_index(size: tuple[int, ...], stride: tuple[int, ...], offset: Any) -> Any:
    """Flat storage indices of a strided view, shape ``size``."""
    idx = jnp.zeros(size, dtype=jnp.int64) + offset
    for dim, (n, st) in enumerate(zip(size, stride)):
        if n > 1 and st != 0:
            shape = [1] * len(size)
            shape[dim] = n
            idx = idx + (lax.iota(jnp.int64, n) * st).reshape(shape)
    return idx


def read(array: Any, static: tuple | None, offset: Any) -> Any:
    """The view's values, from the storage ``array``."""
    if static is None:
        return array
    kind, size, stride, extra = static
    if kind == "reshape":
        return array.reshape(size)
    if kind == "perm":
        sorted_size, inverse = extra
        return jnp.transpose(array.reshape(sorted_size), inverse)
    return array.reshape(-1)[gather_index(size, stride, offset)]


def write(array: Any, static: tuple | None, offset: Any, value: Any) -> Any:
    """The storage ``array`` with the view's elements replaced by ``value``
    (already of the view's shape and the storage's dtype)."""
    if static is None:
        return value
    kind, size, stride, extra = static
    if kind == "reshape":
        return value.reshape(array.shape)
    if kind == "perm":
        sorted_size, inverse = extra
        forward = tuple(inverse.index(d) for d in range(len(inverse)))
        return jnp.transpose(value, forward).reshape(array.shape)
    flat = array.reshape(-1).at[gather_index(size, stride, offset)].set(value)
    return flat.reshape(array.shape)
