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
    flat = array.reshape(-1)
    index = gather_index(size, stride, offset)
    if may_overlap(size, stride):
        # Several of the view's elements are one memory location (an
        # expanded tensor, which index_put_, fill_ and a few other kernels
        # write into): torch's kernel writes the elements the op wrote, so
        # an element it left as it was must not write its old value back
        # over another's new one.  Only the elements whose bits changed are
        # written (an unchanged one holds its location's old value).
        changed = ~_same_bits(value, flat[index])
        index = jnp.where(changed, index, flat.shape[0])  # past the end: dropped
        return flat.at[index].set(value, mode="drop").reshape(array.shape)
    return flat.at[index].set(value).reshape(array.shape)


def may_overlap(size: tuple[int, ...], stride: tuple[int, ...]) -> bool:
    """Whether two elements of a view of these sizes and strides may be one
    memory location (False only when they surely are not): each dim's
    stride, smallest first, must pass the extent of the dims before it."""
    extent = 0
    for st, n in sorted((abs(st), n) for n, st in zip(size, stride) if n > 1):
        if st <= extent:
            return True
        extent += st * (n - 1)
    return False


def _same_bits(a: Any, b: Any) -> Any:
    """Elementwise: whether ``a`` and ``b`` (one dtype) hold the same bits
    (NaN equals NaN, -0.0 differs from 0.0)."""
    if jnp.issubdtype(a.dtype, jnp.complexfloating):
        return _same_bits(jnp.real(a), jnp.real(b)) & _same_bits(jnp.imag(a), jnp.imag(b))
    if jnp.issubdtype(a.dtype, jnp.floating):
        unit = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint64}[np.dtype(a.dtype).itemsize]
        return lax.bitcast_convert_type(a, unit) == lax.bitcast_convert_type(b, unit)
    return a == b


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
