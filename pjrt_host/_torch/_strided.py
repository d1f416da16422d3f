"""Reading a tensor's values out of its storage and writing them back, as
traceable functions (they run inside each op's compiled function, so a read
through a slice or a write into one is fused with the op)."""

from __future__ import annotations

import math
from typing import Any

import jax.numpy as jnp
import numpy as np
from jax import lax

__all__ = ["as_elements", "gather_index", "read", "write"]


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
    kind, size, stride, extra, elem = static
    if elem is not None:
        array = as_elements(array, elem)
    if kind == "reshape":
        return array.reshape(size)
    if kind == "perm":
        sorted_size, inverse = extra
        return jnp.transpose(array.reshape(sorted_size), inverse)
    if kind == "range":
        return lax.dynamic_slice_in_dim(array.reshape(-1), offset, math.prod(size)).reshape(size)
    return array.reshape(-1)[gather_index(size, stride, offset)]


def write(array: Any, static: tuple | None, offset: Any, value: Any) -> Any:
    """The storage ``array`` with the view's elements replaced by ``value``
    (already of the view's shape and dtype)."""
    if static is None:
        return value
    kind, size, stride, extra, elem = static
    if elem is not None:
        elements = write(as_elements(array, elem), (kind, size, stride, extra, None), offset, value)
        return as_elements(elements, array.dtype).reshape(array.shape)
    if kind == "reshape":
        return value.reshape(array.shape)
    if kind == "perm":
        sorted_size, inverse = extra
        forward = tuple(inverse.index(d) for d in range(len(inverse)))
        return jnp.transpose(value, forward).reshape(array.shape)
    if kind == "range":
        return lax.dynamic_update_slice_in_dim(array.reshape(-1), value.reshape(-1), offset, 0).reshape(array.shape)
    flat = array.reshape(-1).at[gather_index(size, stride, offset)].set(value)
    return flat.reshape(array.shape)


def as_elements(array: Any, dtype: Any) -> Any:
    """The bytes of ``array`` read as a flat array of ``dtype`` (torch's
    ``view(dtype)`` of the whole storage; its size in bytes must be a
    multiple of ``dtype``'s).  Complex values are their (real, imag)
    pairs; bool bytes are nonzero or zero."""
    dtype = np.dtype(dtype)
    flat = array.reshape(-1)
    if flat.dtype == dtype:
        return flat
    if jnp.issubdtype(flat.dtype, jnp.complexfloating):
        flat = jnp.stack([jnp.real(flat), jnp.imag(flat)], axis=-1).reshape(-1)
    elif flat.dtype == jnp.bool_:
        flat = flat.astype(jnp.uint8)
    unit = dtype
    if jnp.issubdtype(dtype, jnp.complexfloating):
        unit = np.dtype(jnp.finfo(dtype).dtype)
    elif dtype == np.bool_:
        unit = np.dtype(np.uint8)
    old, new = flat.dtype.itemsize, unit.itemsize
    if flat.dtype != unit:
        if old > new:
            flat = lax.bitcast_convert_type(flat, unit).reshape(-1)
        elif old < new:
            flat = lax.bitcast_convert_type(flat.reshape(-1, new // old), unit)
        else:
            flat = lax.bitcast_convert_type(flat, unit)
    if unit != dtype:
        flat = lax.complex(flat[0::2], flat[1::2]) if dtype.kind == "c" else flat != 0
    return flat
