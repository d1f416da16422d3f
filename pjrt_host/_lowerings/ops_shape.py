"""Shape and indexing lowerings: views as functional ops, joining and
splitting, flips and rolls, gathers and scatters, advanced indexing,
padding, triangles, sorting and selection.

Views are lowered as the value they produce (the device core keeps the
aliasing); each view op is also registered under its ``*_copy`` name, the
form functionalization emits.  Gathers go through :func:`_util.take`, which
honours the plugin's ``dense_gather_factor``.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import torch

from . import lowering as _lowering
from ._dtypes import jax_dtype
from ._util import (broadcast_shapes_or_raise, canonical_dim, canonical_dims, cast, dense_gather_factor,
                    linspace_values, logical_elements, result_type, take, torch_dtype_of)

# No lowering here widens 16-bit floats (Lowering.opmath): moving, selecting
# and comparing values is exact in any dtype, so widening would only double
# the bytes a gather, concatenation or sort moves (XLA keeps the converts
# around them); and torch accumulates scatter_add, index_add and
# index_put(accumulate=True) in the tensor's own dtype, rounding per add.
lowering = functools.partial(_lowering, opmath=False)


def _view_lowering(*names: str):
    """Register under each view op's name and its functional ``_copy`` twin."""
    full = []
    for name in names:
        full.append(name)
        packet, dot, overload = name.partition(".")
        full.append(f"{packet}_copy{dot}{overload}")
    return lowering(*full)


def _values(x) -> np.ndarray:
    """The values of ``x`` on the host, for ops whose output *shape* depends
    on them (nonzero, masked_select, boolean indexing, unique).  Under
    ``jax.jit`` this raises jax's TracerArrayConversionError, upon which the
    device runs the op eagerly."""
    return np.asarray(x)


# ------------------------------------------------------------------- views


@_view_lowering("aten::view", "aten::_unsafe_view", "aten::reshape", "aten::_reshape_alias")
def view(x, size, *_strides):
    return jnp.reshape(x, tuple(size))


@_view_lowering("aten::view.dtype")
def view_dtype(x, dtype):
    return jax.lax.bitcast_convert_type(x, jnp.dtype(cast(0, dtype).dtype)) if x.dtype.itemsize == torch.empty(
        (), dtype=dtype).element_size() else _bitcast_resize(x, dtype)


def _bitcast_resize(x, dtype):
    target = cast(0, dtype).dtype
    ratio = x.dtype.itemsize / target.itemsize
    if ratio > 1:
        out = jax.lax.bitcast_convert_type(x, target)
        return out.reshape(x.shape[:-1] + (x.shape[-1] * int(ratio),)) if x.ndim else out.reshape(-1)
    k = int(1 / ratio)
    return jax.lax.bitcast_convert_type(x.reshape(x.shape[:-1] + (x.shape[-1] // k, k)), target)


@_view_lowering("aten::permute")
def permute(x, dims):
    return jnp.transpose(x, [canonical_dim(d, x.ndim) for d in dims]) if x.ndim else x


@_view_lowering("aten::transpose.int")
def transpose(x, dim0, dim1):
    if x.ndim < 2:
        return x
    return jnp.swapaxes(x, canonical_dim(dim0, x.ndim), canonical_dim(dim1, x.ndim))


@_view_lowering("aten::t")
def t(x):
    return x if x.ndim < 2 else x.T


@lowering("aten::numpy_T", "aten::mT", "aten::matrix_H", "aten::adjoint", "aten::mH")
def matrix_transpose(x):
    return jnp.swapaxes(x, -1, -2)


@_view_lowering("aten::expand")
def expand(x, size, *, implicit=False):
    size = tuple(size)
    lead = len(size) - x.ndim
    shape = tuple(x.shape[i - lead] if s == -1 else s for i, s in enumerate(size))
    return jnp.broadcast_to(x, shape)


@lowering("aten::expand_as")
def expand_as(x, other):
    return jnp.broadcast_to(x, other.shape)


@_view_lowering("aten::squeeze", "aten::squeeze.dim", "aten::squeeze.dims")
def squeeze(x, dim=None):
    dims = canonical_dims(dim, x.ndim) if dim is not None else tuple(range(x.ndim))
    return jnp.squeeze(x, tuple(d for d in dims if x.shape[d] == 1)) if x.ndim else x


@_view_lowering("aten::unsqueeze")
def unsqueeze(x, dim):
    return jnp.expand_dims(x, canonical_dim(dim, x.ndim + 1))


@_view_lowering("aten::select.int")
def select(x, dim, index):
    dim = canonical_dim(dim, x.ndim)
    return jax.lax.index_in_dim(x, index % x.shape[dim], dim, keepdims=False)


def _slice_bounds(size, start, end, step):
    return slice(start, end, step).indices(size)


@_view_lowering("aten::slice.Tensor")
def slice_(x, dim=0, start=None, end=None, step=1):
    dim = canonical_dim(dim, x.ndim)
    lo, hi, step = _slice_bounds(x.shape[dim], start, end, step)
    hi = max(hi, lo)
    return jax.lax.slice_in_dim(x, lo, hi, step, axis=dim)


@_view_lowering("aten::narrow")
def narrow(x, dim, start, length):
    dim = canonical_dim(dim, x.ndim)
    start = start % x.shape[dim] if start < 0 else start
    return jax.lax.slice_in_dim(x, start, start + length, axis=dim)


@_view_lowering("aten::diagonal")
def diagonal(x, offset=0, dim1=0, dim2=1):
    return jnp.diagonal(x, offset, canonical_dim(dim1, x.ndim), canonical_dim(dim2, x.ndim))


@_view_lowering("aten::alias", "aten::detach")
def alias(x):
    return x


@_view_lowering("aten::unfold")
def unfold(x, dimension, size, step):
    if x.ndim == 0:
        return x.reshape(1)
    dim = canonical_dim(dimension, x.ndim)
    windows = (x.shape[dim] - size) // step + 1
    index = jnp.arange(windows)[:, None] * step + jnp.arange(size)[None, :]
    out = jnp.take(x, index, axis=dim)  # (..., windows, size, ...)
    return jnp.moveaxis(out, dim + 1, -1)


@_view_lowering("aten::as_strided")
def as_strided(x, size, stride, storage_offset=None):
    """The value of a strided view of ``x``'s elements laid out contiguously."""
    index = np.full(tuple(size), storage_offset or 0, dtype=np.int64)
    for d, (n, s) in enumerate(zip(size, stride)):
        shape = [1] * len(size)
        shape[d] = n
        index = index + np.arange(n, dtype=np.int64).reshape(shape) * s
    return jnp.ravel(x)[jnp.asarray(index)]


@lowering("aten::clone", "aten::contiguous", "aten::lift", "aten::lift_fresh_copy", "aten::_conj_copy")
def clone(x, *, memory_format=None):
    return x


@lowering("aten::copy", "aten::copy_", opmath=False)
def copy(x, src, non_blocking=False):
    """The functional ``copy_`` (and ``copy_``'s new value of ``x``): ``src``
    broadcast to ``x``'s shape, in ``x``'s dtype."""
    return jnp.broadcast_to(src.astype(x.dtype), x.shape)


@lowering("aten::fill.Scalar", "aten::fill.Tensor")
def fill(x, value):
    return jnp.full(x.shape, cast(value, torch_dtype_of(x)) if not hasattr(value, "dtype") else value.astype(x.dtype))


@lowering("aten::zero")
def zero(x):
    return jnp.zeros_like(x)


# ---------------------------------------------------- joining and splitting


@lowering("aten::cat", "aten::concat", "aten::concatenate")
def cat(tensors, dim=0):
    # torch skips legacy empty 1-d inputs of shape (0,) and promotes dtypes.
    dtype = result_type(*tensors)
    kept = [t for t in tensors if not (t.ndim == 1 and t.shape[0] == 0)] or list(tensors[:1])
    ndim = kept[0].ndim
    return jnp.concatenate([cast(t, dtype) for t in kept], axis=canonical_dim(dim, ndim))


@lowering("aten::stack")
def stack(tensors, dim=0):
    dtype = result_type(*tensors)
    return jnp.stack([cast(t, dtype) for t in tensors], axis=canonical_dim(dim, tensors[0].ndim + 1))


@lowering("aten::hstack")
def hstack(tensors):
    return cat([jnp.atleast_1d(t) for t in tensors], 0 if all(t.ndim <= 1 for t in tensors) else 1)


@lowering("aten::vstack")
def vstack(tensors):
    return cat([jnp.atleast_2d(t) for t in tensors], 0)


@_view_lowering("aten::split.Tensor", "aten::unsafe_split.Tensor")
def split(x, split_size, dim=0):
    dim = canonical_dim(dim, x.ndim)
    n = x.shape[dim]
    sizes = [min(split_size, n - i) for i in range(0, n, split_size)] if split_size else [0]
    return split_with_sizes(x, sizes or [0], dim)


@_view_lowering("aten::split_with_sizes", "aten::unsafe_split_with_sizes")
def split_with_sizes(x, split_sizes, dim=0):
    dim = canonical_dim(dim, x.ndim)
    out, start = [], 0
    for size in split_sizes:
        out.append(jax.lax.slice_in_dim(x, start, start + size, axis=dim))
        start += size
    return out


@_view_lowering("aten::unbind.int")
def unbind(x, dim=0):
    dim = canonical_dim(dim, x.ndim)
    return [jax.lax.index_in_dim(x, i, dim, keepdims=False) for i in range(x.shape[dim])]


@lowering("aten::chunk")
def chunk(x, chunks, dim=0):
    dim = canonical_dim(dim, x.ndim)
    return split(x, math.ceil(x.shape[dim] / chunks) if x.shape[dim] else 0, dim)


# -------------------------------------------------------- rearrangements


@lowering("aten::flip")
def flip(x, dims):
    return jnp.flip(x, canonical_dims(dims, x.ndim)) if dims else x


@lowering("aten::roll")
def roll(x, shifts, dims=()):
    if not dims:
        return jnp.roll(x.reshape(-1), tuple(shifts)).reshape(x.shape)
    return jnp.roll(x, tuple(shifts), tuple(canonical_dim(d, x.ndim) for d in dims))


@lowering("aten::rot90")
def rot90(x, k=1, dims=(0, 1)):
    return jnp.rot90(x, k, tuple(canonical_dim(d, x.ndim) for d in dims))


@lowering("aten::repeat")
def repeat(x, repeats):
    repeats = tuple(repeats)
    x = x.reshape((1,) * (len(repeats) - x.ndim) + x.shape)
    return jnp.tile(x, repeats)


@lowering("aten::repeat_interleave.Tensor", data_dependent=True)
def repeat_interleave(repeats, *, output_size=None):
    """Index ``i`` repeated ``repeats[i]`` times; the length is the sum of
    the repeats, so it needs their values unless ``output_size`` gives it."""
    total = int(_values(repeats).sum()) if output_size is None else output_size
    return jnp.repeat(jnp.arange(repeats.shape[0], dtype=jnp.int64), repeats, total_repeat_length=total)


@lowering("aten::tril")
def tril(x, diagonal=0):
    return jnp.tril(x, diagonal)


@lowering("aten::triu")
def triu(x, diagonal=0):
    return jnp.triu(x, diagonal)


@lowering("aten::diag_embed")
def diag_embed(x, offset=0, dim1=-2, dim2=-1):
    m = x.shape[-1]
    n = m + abs(offset)
    rows = jnp.arange(m) + max(-offset, 0)
    cols = jnp.arange(m) + max(offset, 0)
    square = jnp.zeros(x.shape[:-1] + (n, n), x.dtype).at[..., rows, cols].set(x)
    ndim = x.ndim + 1
    return jnp.moveaxis(square, (-2, -1), (canonical_dim(dim1, ndim), canonical_dim(dim2, ndim)))


@lowering("aten::diag")
def diag(x, diagonal=0):
    return jnp.diag(x, diagonal)


# ------------------------------------------------ functional view scatters


def _check_scatter_src(src, slice_shape):
    """torch's refusal of a view scatter's ``src`` that is not the slice's
    shape (a scatter would broadcast it, or cut it short)."""
    if tuple(src.shape) != tuple(slice_shape):
        raise RuntimeError(f"expected src to have a size equal to the slice of self. src size = {list(src.shape)}, "
                           f"slice size = {list(slice_shape)}")


@lowering("aten::select_scatter")
def select_scatter(x, src, dim, index):
    dim = canonical_dim(dim, x.ndim)
    _check_scatter_src(src, x.shape[:dim] + x.shape[dim + 1:])
    return jax.lax.dynamic_update_index_in_dim(x, src.astype(x.dtype), index % x.shape[dim], dim)


@lowering("aten::slice_scatter")
def slice_scatter(x, src, dim=0, start=None, end=None, step=1):
    dim = canonical_dim(dim, x.ndim)
    lo, hi, step = _slice_bounds(x.shape[dim], start, end, step)
    where = [slice(None)] * x.ndim
    where[dim] = slice(lo, max(hi, lo), step)
    _check_scatter_src(src, x[tuple(where)].shape)
    return x.at[tuple(where)].set(src.astype(x.dtype))


@lowering("aten::diagonal_scatter")
def diagonal_scatter(x, src, offset=0, dim1=0, dim2=1):
    d1, d2 = canonical_dim(dim1, x.ndim), canonical_dim(dim2, x.ndim)
    n = src.shape[-1]
    i = jnp.arange(n) + max(-offset, 0)
    j = jnp.arange(n) + max(offset, 0)
    moved = jnp.moveaxis(x, (d1, d2), (-2, -1))
    rows, cols = moved.shape[-2:]
    _check_scatter_src(src, moved.shape[:-2] + (max(0, min(rows - max(-offset, 0), cols - max(offset, 0))),))
    moved = moved.at[..., i, j].set(src.astype(x.dtype))
    return jnp.moveaxis(moved, (-2, -1), (d1, d2))


@lowering("aten::as_strided_scatter")
def as_strided_scatter(x, src, size, stride, storage_offset=None):
    index = np.full(tuple(size), storage_offset or 0, dtype=np.int64)
    for d, (n, s) in enumerate(zip(size, stride)):
        shape = [1] * len(size)
        shape[d] = n
        index = index + np.arange(n, dtype=np.int64).reshape(shape) * s
    return jnp.ravel(x).at[jnp.asarray(index)].set(src.astype(x.dtype)).reshape(x.shape)


@lowering("aten::select_backward")
def select_backward(grad_output, input_sizes, dim, index):
    return select_scatter(jnp.zeros(tuple(input_sizes), grad_output.dtype), grad_output, dim, index)


@lowering("aten::slice_backward")
def slice_backward(grad_output, input_sizes, dim, start, end, step):
    return slice_scatter(jnp.zeros(tuple(input_sizes), grad_output.dtype), grad_output, dim, start, end, step)


@lowering("aten::diagonal_backward")
def diagonal_backward(grad_output, input_sizes, offset, dim1, dim2):
    return diagonal_scatter(jnp.zeros(tuple(input_sizes), grad_output.dtype), grad_output, offset, dim1, dim2)


@lowering("aten::unfold_backward")
def unfold_backward(grad_in, input_sizes, dim, size, step):
    if jnp.issubdtype(grad_in.dtype, jnp.inexact):
        x = jnp.zeros(tuple(input_sizes), grad_in.dtype)
        _, pullback = jax.vjp(lambda t: unfold(t, dim, size, step), x)
        return pullback(grad_in)[0]
    # Integers and bools: jax's pullback of an integer function is float0
    # (zeros), so each window's values are added where the window read them
    # (torch.compile's functionalization writes through an unfold view of an
    # integer tensor with this op; a bool's sum is "any", as on CPU).
    sizes = tuple(input_sizes) or (1,)
    dim = canonical_dim(dim, len(sizes))
    g = jnp.moveaxis(grad_in.reshape(grad_in.shape if input_sizes else (1, size)), dim, -2)  # (..., n, size)
    where = (jnp.arange(g.shape[-2])[:, None] * step + jnp.arange(size)[None, :]).reshape(-1)
    acc = jnp.int32 if grad_in.dtype == jnp.bool_ else grad_in.dtype
    moved = sizes[:dim] + sizes[dim + 1:] + (sizes[dim],)
    # the windows' elements in a row (spelt out: jax cannot infer a -1 beside an empty dim)
    out = jnp.zeros(moved, acc).at[..., where].add(g.reshape(g.shape[:-2] + (g.shape[-2] * g.shape[-1],)).astype(acc))
    out = jnp.moveaxis(out, -1, dim).reshape(tuple(input_sizes))
    return out != 0 if grad_in.dtype == jnp.bool_ else out


# ------------------------------------------------------- gather / scatter


def _index_grid(index, dim):
    """Full index tuple for ``x.at[...]``: ``index`` along ``dim``, iota elsewhere."""
    grid = list(jnp.indices(index.shape, sparse=True))
    grid[dim] = index
    return tuple(grid)


@lowering("aten::gather")
def gather(x, dim, index, *, sparse_grad=False):
    if index.size == 0:  # torch accepts any empty index, whatever its rank
        return jnp.zeros(index.shape, x.dtype)
    if x.ndim == 0:
        return x.reshape(index.shape)
    dim = canonical_dim(dim, x.ndim)
    index = index % max(x.shape[dim], 1)
    # index may be smaller than x in the other dims: gather reads a prefix.
    x = x[tuple(slice(0, n) if d != dim else slice(None) for d, n in enumerate(index.shape))]
    size = x.shape[dim]
    factor = dense_gather_factor()
    if factor > 0 and index.shape[dim] <= factor * size and jnp.issubdtype(x.dtype, jnp.floating):
        onehot = jnp.moveaxis(index, dim, -1)[..., None] == jnp.arange(size)
        picked = jnp.einsum("...is,...s->...i", onehot.astype(x.dtype), jnp.moveaxis(x, dim, -1),
                            precision=jax.lax.Precision.HIGHEST)
        return jnp.moveaxis(picked, -1, dim)
    return jnp.take_along_axis(x, index, axis=dim, mode="clip")


def _add_at(at, values):
    """``at.add`` that also serves bool (add is logical or, as in torch)."""
    return at.max(values) if values.dtype == jnp.bool_ else at.add(values)


def _multiply_at(at, values):
    return at.min(values) if values.dtype == jnp.bool_ else at.multiply(values)


def _scatter_operands(x, dim, index, src):
    """(x, index grid, values) with 0-dim x as 1-d, ``src`` cut to
    ``index``'s shape (torch reads a prefix of src) or broadcast from a scalar."""
    if x.ndim == 0:
        x, index, dim = x.reshape(1), index.reshape(-1), 0
    dim = canonical_dim(dim, x.ndim)
    if index.size == 0:
        # torch accepts an empty index of any rank (gather's gradient of
        # one): nothing is written
        empty = jnp.zeros((0,) * x.ndim, index.dtype)
        return x, _index_grid(empty, dim), jnp.zeros(empty.shape, x.dtype)
    if not hasattr(src, "shape") or src.ndim == 0:
        values = jnp.broadcast_to(cast(src, torch_dtype_of(x)) if not hasattr(src, "dtype") else src.astype(x.dtype), index.shape)
    else:
        values = src.reshape((1,) * (index.ndim - src.ndim) + src.shape) if src.ndim < index.ndim else src
        values = values[tuple(slice(0, n) for n in index.shape)].astype(x.dtype).reshape(index.shape)
    return x, _index_grid(index % max(x.shape[dim], 1), dim), values


@lowering("aten::scatter.src", "aten::scatter.value")
def scatter(x, dim, index, src):
    flat, grid, values = _scatter_operands(x, dim, index, src)
    return flat.at[grid].set(values).reshape(x.shape)


@lowering("aten::scatter.reduce", "aten::scatter.value_reduce")
def scatter_reduce_legacy(x, dim, index, src, *, reduce):
    flat, grid, values = _scatter_operands(x, dim, index, src)
    at = flat.at[grid]
    return (_add_at(at, values) if reduce == "add" else _multiply_at(at, values)).reshape(x.shape)


@lowering("aten::scatter_add")
def scatter_add(x, dim, index, src):
    return scatter_reduce_legacy(x, dim, index, src, reduce="add")


def _reduce_identity(reduce, dtype):
    if reduce in ("sum", "mean"):
        return 0
    if reduce == "prod":
        return 1
    if jnp.issubdtype(dtype, jnp.floating):
        return -jnp.inf if reduce == "amax" else jnp.inf
    info = jnp.iinfo(dtype) if dtype != jnp.bool_ else None
    if info is None:
        return reduce == "amin"
    return info.min if reduce == "amax" else info.max


@lowering("aten::scatter_reduce.two")
def scatter_reduce(x, dim, index, src, reduce, *, include_self=True):
    flat, grid, values = _scatter_operands(x, dim, index, src)
    if not include_self:  # scattered-to positions start from the reduction's identity
        flat = flat.at[grid].set(jnp.asarray(_reduce_identity(reduce, flat.dtype), flat.dtype))
    at = flat.at[grid]
    out = {"sum": _add_at, "mean": _add_at, "prod": _multiply_at,
           "amax": lambda a, v: a.max(v), "amin": lambda a, v: a.min(v)}[reduce](at, values)
    if reduce == "mean":
        count = jnp.full(flat.shape, 1 if include_self else 0, jnp.int64).at[grid].add(1)
        count = jnp.maximum(count, 1)
        if jnp.issubdtype(flat.dtype, jnp.inexact):
            out = out / count.astype(flat.dtype)
        else:
            out = jnp.floor_divide(out, count).astype(flat.dtype)
    return out.reshape(x.shape)


# ----------------------------------------------------------------- indexing


def _index_tuple(x, indices):
    """torch's list of optional index tensors as a numpy-style index tuple;
    bool masks become integer indices (data-dependent, so eager only)."""
    out = []
    for idx in indices:
        if idx is None:
            out.append(slice(None))
        elif idx.dtype in (jnp.bool_, jnp.uint8):
            out.extend(jnp.asarray(i) for i in np.nonzero(_values(idx)))
        else:
            out.append(idx)
    return tuple(out)


@lowering("aten::index.Tensor", "aten::_unsafe_index.Tensor")
def index(x, indices):
    given = [(d, i) for d, i in enumerate(indices) if i is not None]
    if given and all(i.dtype not in (jnp.bool_, jnp.uint8) for _, i in given):
        inside = logical_elements(0) if x.ndim else None
        if inside is not None:
            # read padded (dynamic dims): a negative index counts from the
            # logical end of its dim, not from its bucket's
            def length(d, dtype):
                others = tuple(a for a in range(x.ndim) if a != d)
                return jnp.maximum(jnp.sum(jnp.any(inside, axis=others) if others else inside).astype(dtype), 1)
        else:
            def length(d, dtype):
                return max(x.shape[d], 1)
        if len(given) == 1:
            d, idx = given[0]
            return take(x, idx % length(d, idx.dtype), axis=d)
        if inside is not None:
            indices = list(indices)
            for d, idx in given:
                indices[d] = idx % length(d, idx.dtype)
    return x[_index_tuple(x, indices)]


def _mask_put(x, mask, values, accumulate):
    """``x[mask] = values`` with a single scalar value: traceable."""
    values = values.reshape(()).astype(x.dtype)
    mask = jnp.broadcast_to(mask.reshape(mask.shape + (1,) * (x.ndim - mask.ndim)), x.shape)
    return jnp.where(mask, x + values if accumulate else values, x)


@lowering("aten::index_put", "aten::_unsafe_index_put", "aten::_index_put_impl")
def index_put(x, indices, values, accumulate=False, unsafe=False):
    values = jnp.asarray(values)
    if (len(indices) == 1 and indices[0] is not None and indices[0].dtype == jnp.bool_
            and values.size == 1 and indices[0].ndim <= x.ndim):
        return _mask_put(x, indices[0], values, accumulate)
    where = _index_tuple(x, indices)
    target = x[where].shape
    if values.ndim > len(target) or any(v not in (1, t) for v, t in zip(values.shape[::-1], target[::-1])):
        raise RuntimeError(f"shape mismatch: value tensor of shape {list(values.shape)} cannot be broadcast to "
                           f"indexing result of shape {list(target)}")
    at = x.at[where]
    values = values.astype(x.dtype)
    return _add_at(at, values) if accumulate else at.set(values)


@lowering("aten::index_select")
def index_select(x, dim, index):
    if x.ndim == 0:
        return x
    dim = canonical_dim(dim, x.ndim)
    return take(x, index.reshape(-1) % max(x.shape[dim], 1), axis=dim)


def _index_along(x, dim, index):
    dim = canonical_dim(dim, x.ndim)
    where = [slice(None)] * x.ndim
    where[dim] = index.reshape(-1) % max(x.shape[dim], 1)
    return tuple(where)


@lowering("aten::index_add")
def index_add(x, dim, index, source, *, alpha=1):
    if x.ndim == 0:
        return x + (source.reshape(()) * alpha).astype(x.dtype) * index.size
    source = source.astype(x.dtype) * cast(alpha, torch_dtype_of(x)) if alpha != 1 else source.astype(x.dtype)
    return _add_at(x.at[_index_along(x, dim, index)], source)


@lowering("aten::index_copy")
def index_copy(x, dim, index, source):
    if x.ndim == 0:
        return source.reshape(()).astype(x.dtype)
    return x.at[_index_along(x, dim, index)].set(source.astype(x.dtype))


@lowering("aten::index_fill.int_Scalar", "aten::index_fill.int_Tensor")
def index_fill(x, dim, index, value):
    if isinstance(value, complex) and not jnp.issubdtype(x.dtype, jnp.complexfloating):
        raise RuntimeError("index_fill_(): Converting complex Scalar to non-complex type is not supported")
    value = cast(value, torch_dtype_of(x)) if not hasattr(value, "dtype") else value.astype(x.dtype)
    if x.ndim == 0:
        return jnp.where(index.size > 0, value, x)
    return x.at[_index_along(x, dim, index)].set(value)


@lowering("aten::index_reduce")
def index_reduce(x, dim, index, source, reduce, *, include_self=True):
    if x.ndim == 0:
        x, source = x.reshape(1), source.reshape(-1)
        out = index_reduce(x, 0, index * 0, source, reduce, include_self=include_self)
        return out.reshape(())
    dim = canonical_dim(dim, x.ndim)
    where = _index_along(x, dim, index)
    source = source.astype(x.dtype)
    if not include_self:
        fill = {"prod": 1, "mean": 0}.get(reduce)
        if fill is None:
            floating = jnp.issubdtype(x.dtype, jnp.floating)
            info = None if floating else jnp.iinfo(x.dtype)
            fill = (-jnp.inf if floating else info.min) if reduce == "amax" else (jnp.inf if floating else info.max)
        x = x.at[where].set(jnp.asarray(fill, x.dtype))
    at = x.at[where]
    out = {"prod": _multiply_at, "mean": _add_at, "amax": lambda a, v: a.max(v),
           "amin": lambda a, v: a.min(v)}[reduce](at, source)
    if reduce == "mean":
        counts = jnp.zeros(x.shape[dim], jnp.int64).at[index.reshape(-1) % x.shape[dim]].add(1)
        counts = counts + (1 if include_self else 0)
        shape = [1] * x.ndim
        shape[dim] = x.shape[dim]
        counts = jnp.maximum(counts, 1).reshape(shape)
        out = out / counts if jnp.issubdtype(x.dtype, jnp.floating) else jnp.floor_divide(out, counts)
        out = out.astype(x.dtype)
    return out


@lowering("aten::masked_scatter")
def masked_scatter(x, mask, source):
    """Fill the masked positions of ``x`` from ``source`` in order: the k-th
    True element (row-major) takes ``source.flatten()[k]``."""
    shape = jnp.broadcast_shapes(x.shape, mask.shape)
    x = jnp.broadcast_to(x, shape)
    mask = jnp.broadcast_to(mask, shape).reshape(-1)
    position = jnp.clip(jnp.cumsum(mask) - 1, 0, max(source.size - 1, 0))
    picked = jnp.take(source.reshape(-1), position, mode="clip") if source.size else jnp.zeros_like(position, x.dtype)
    return jnp.where(mask, picked.astype(x.dtype), x.reshape(-1)).reshape(shape)


@lowering("aten::masked_scatter_backward")
def masked_scatter_backward(grad_output, mask, sizes):
    """``source``'s gradient: the k-th True element's gradient goes to
    ``source.flatten()[k]``, zeros past the mask's count (torch's
    masked_select padded to ``sizes``, without a data-dependent shape)."""
    numel = math.prod(sizes)
    shape = jnp.broadcast_shapes(grad_output.shape, mask.shape)
    mask = jnp.broadcast_to(mask, shape).reshape(-1)
    grad = jnp.broadcast_to(grad_output, shape).reshape(-1)
    position = jnp.where(mask, jnp.cumsum(mask) - 1, numel)
    out = jnp.zeros((numel,), grad.dtype).at[position].add(grad, mode="drop")
    return out.reshape(tuple(sizes))


@lowering("aten::masked_select", data_dependent=True)
def masked_select(x, mask):
    if mask.dtype != jnp.bool_:
        raise RuntimeError("masked_select: expected BoolTensor for mask")
    shape = broadcast_shapes_or_raise(mask.shape, x.shape)
    return jnp.broadcast_to(x, shape)[_values(jnp.broadcast_to(mask, shape))]


@lowering("aten::nonzero", data_dependent=True)
def nonzero(x):
    if x.ndim == 0:
        return jnp.zeros((int(_values(x) != 0), 0), jnp.int64)
    found = np.nonzero(_values(x))
    return jnp.asarray(np.stack(found, axis=-1).astype(np.int64).reshape(-1, x.ndim))


@lowering("aten::nonzero_static")
def nonzero_static(x, *, size, fill_value=-1):
    if x.size == 0:  # jnp.nonzero pads an empty input with 0, not fill_value
        return jnp.full((size, max(x.ndim, 1) if x.ndim else 0), fill_value, jnp.int64)
    if x.ndim == 0:
        x = x.reshape(1)
        return jnp.zeros((size, 0), jnp.int64)
    found = jnp.nonzero(x, size=size, fill_value=fill_value)
    return jnp.stack(found, axis=-1).astype(jnp.int64)


@lowering("aten::_unique2", data_dependent=True)
def unique2(x, sorted=True, return_inverse=False, return_counts=False):
    values, inverse, counts = np.unique(_values(x).reshape(-1), return_inverse=True, return_counts=True)
    return (jnp.asarray(values), jnp.asarray(inverse.reshape(x.shape).astype(np.int64)) if return_inverse
            else jnp.zeros((0,), jnp.int64), jnp.asarray(counts.astype(np.int64)) if return_counts
            else jnp.zeros((0,), jnp.int64))


def _slices_along(x, dim):
    """(x's slices along ``dim`` as rows of a 2-d array, a function putting
    such rows back into x's layout)."""
    v = np.moveaxis(_values(x), dim, 0)
    rest = v.shape[1:]
    rows = v.reshape(v.shape[0], math.prod(rest))  # not -1: the selected dim may be empty
    return rows, lambda r: jnp.asarray(np.moveaxis(r.reshape((r.shape[0],) + rest), 0, dim))


@lowering("aten::unique_dim", data_dependent=True)
def unique_dim(x, dim, sorted=True, return_inverse=False, return_counts=False):
    """The distinct slices along ``dim``, sorted lexicographically (torch
    sorts them whatever ``sorted`` says), the inverse and the counts."""
    dim = canonical_dim(dim, x.ndim)
    rows, back = _slices_along(x, dim)
    values, inverse, counts = np.unique(rows, axis=0, return_inverse=True, return_counts=True)
    return back(values), jnp.asarray(inverse.reshape(-1).astype(np.int64)), jnp.asarray(counts.astype(np.int64))


@lowering("aten::unique_dim_consecutive", data_dependent=True)
def unique_dim_consecutive(x, dim, return_inverse=False, return_counts=False):
    dim = canonical_dim(dim, x.ndim)
    rows, back = _slices_along(x, dim)
    starts = np.concatenate([[True], np.any(rows[1:] != rows[:-1], axis=1)]) if rows.shape[0] else np.zeros(0, bool)
    inverse = (np.cumsum(starts) - 1).astype(np.int64)
    counts = np.diff(np.append(np.nonzero(starts)[0], rows.shape[0])).astype(np.int64)
    return back(rows[starts]), jnp.asarray(inverse), jnp.asarray(counts)


@lowering("aten::unique_consecutive", data_dependent=True)
def unique_consecutive(x, return_inverse=False, return_counts=False, dim=None):
    if dim is not None:
        return unique_dim_consecutive(x, dim, return_inverse, return_counts)
    flat = _values(x).reshape(-1)
    starts = np.concatenate([[True], flat[1:] != flat[:-1]]) if flat.size else np.zeros(0, bool)
    values = flat[starts]
    inverse = (np.cumsum(starts) - 1).reshape(x.shape).astype(np.int64)
    counts = np.diff(np.append(np.nonzero(starts)[0], flat.size)).astype(np.int64)
    return (jnp.asarray(values), jnp.asarray(inverse) if return_inverse else jnp.zeros((0,), jnp.int64),
            jnp.asarray(counts) if return_counts else jnp.zeros((0,), jnp.int64))


@lowering("aten::bincount", data_dependent=True)
def bincount(x, weights=None, minlength=0):
    length = max(int(_values(x).max(initial=-1)) + 1, minlength)
    if weights is None:
        return jnp.zeros((length,), jnp.int64).at[x].add(1)
    dtype = weights.dtype if jnp.issubdtype(weights.dtype, jnp.floating) else jnp.float64
    return jnp.zeros((length,), dtype).at[x].add(weights.astype(dtype))


@lowering("aten::put")
def put(x, index, source, accumulate=False):
    flat = x.reshape(-1)
    at = flat.at[index.reshape(-1) % max(flat.size, 1)]
    source = source.reshape(-1).astype(x.dtype)
    return (_add_at(at, source) if accumulate else at.set(source)).reshape(x.shape)


@lowering("aten::take")
def take_flat(x, index):
    return take(x.reshape(-1), index % max(x.size, 1), axis=0)


@lowering("aten::take_along_dim")
def take_along_dim(x, indices, dim=None):
    if dim is None:
        return jnp.take(x.reshape(-1), indices.reshape(-1) % max(x.size, 1))
    dim = canonical_dim(dim, x.ndim)
    shape = list(jnp.broadcast_shapes(x.shape, indices.shape))
    xs, ids = list(shape), list(shape)
    xs[dim], ids[dim] = x.shape[dim], indices.shape[dim]
    return jnp.take_along_axis(jnp.broadcast_to(x, xs), jnp.broadcast_to(indices, ids) % max(x.shape[dim], 1),
                               axis=dim)


@lowering("aten::linspace.Tensor_Tensor", "aten::linspace.Tensor_Scalar", "aten::linspace.Scalar_Tensor")
def linspace(start, end, steps, *, dtype=None, layout=None, device=None, pin_memory=None):
    """linspace with 0-dim tensor bounds (the number overloads are device factories)."""
    return linspace_values(start, end, steps, jax_dtype(dtype or torch.get_default_dtype()))


# ----------------------------------------------------------------- padding


@lowering("aten::constant_pad_nd")
def constant_pad_nd(x, pad, value=0):
    n = len(pad) // 2
    config = [(0, 0, 0)] * (x.ndim - n) + [(pad[2 * i], pad[2 * i + 1], 0) for i in reversed(range(n))]
    return jax.lax.pad(x, jnp.asarray(value, x.dtype), config)


def _source_index(size, before, after, mode):
    """For each position of a padded axis, the input position it copies
    (a negative width crops that side)."""
    i = np.arange(size + before + after) - before
    if mode == "edge":
        return np.clip(i, 0, size - 1)
    if mode == "wrap":
        return i % size
    period = 2 * (size - 1)  # reflect: mirror about the edge elements
    i = np.abs(i) % period if period else np.zeros_like(i)
    return np.where(i > size - 1, period - i, i)


def _index_pad(mode):
    def lower(x, padding):
        for k in range(len(padding) // 2):
            axis = x.ndim - 1 - k
            x = jnp.take(x, jnp.asarray(_source_index(x.shape[axis], padding[2 * k], padding[2 * k + 1], mode)),
                         axis=axis)
        return x

    return lower


lowering("aten::reflection_pad1d", "aten::reflection_pad2d", "aten::reflection_pad3d")(_index_pad("reflect"))
lowering("aten::replication_pad1d", "aten::replication_pad2d", "aten::replication_pad3d")(_index_pad("edge"))
lowering("aten::_pad_circular")(_index_pad("wrap"))


@lowering("aten::replication_pad1d_backward", "aten::replication_pad2d_backward",
          "aten::replication_pad3d_backward")
def replication_pad_backward(grad_output, x, padding):
    """The edge padding's gradient (torch has no decomposition for it: a
    replicate-padded convolution could not train): each edge element
    gathers the gradients of its copies."""
    _, pullback = jax.vjp(lambda t: _index_pad("edge")(t, padding), x)
    return pullback(grad_output.astype(x.dtype))[0]


@lowering("aten::channel_shuffle", "aten::native_channel_shuffle")
def channel_shuffle(x, groups):
    n, c = x.shape[:2]
    grouped = x.reshape((n, groups, c // groups) + x.shape[2:])
    return jnp.swapaxes(grouped, 1, 2).reshape(x.shape)


@lowering("aten::atleast_1d")
def atleast_1d(x):
    return jnp.atleast_1d(x)


@lowering("aten::atleast_2d")
def atleast_2d(x):
    return jnp.atleast_2d(x)


@lowering("aten::atleast_3d")
def atleast_3d(x):
    return jnp.atleast_3d(x)


# --------------------------------------------------------- sort and select


def _sort_key(x, descending):
    """A key whose ascending order is torch's order: NaN largest."""
    if x.dtype == jnp.bool_:
        x = x.astype(jnp.int8)
    return x


@lowering("aten::sort", "aten::sort.stable")
def sort(x, dim=-1, descending=False, *, stable=None):
    if isinstance(dim, bool) or dim is None:  # sort.stable(x, *, stable, dim, descending) given positionally
        dim = -1 if dim is None or isinstance(dim, bool) else dim
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    axis = canonical_dim(dim, x.ndim)
    key = _sort_key(x, descending)
    order = jnp.argsort(key, axis=axis, stable=True, descending=descending).astype(jnp.int64)
    return jnp.take_along_axis(x, order, axis=axis), order


@lowering("aten::argsort", "aten::argsort.stable")
def argsort(x, dim=-1, descending=False, *, stable=False):
    return sort(x, dim, descending)[1]


@lowering("aten::msort")
def msort(x):
    return sort(x, 0)[0]


@lowering("aten::topk")
def topk(x, k, dim=-1, largest=True, sorted=True):
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    values, order = sort(x, dim, descending=largest)
    axis = canonical_dim(dim, x.ndim)
    return jax.lax.slice_in_dim(values, 0, k, axis=axis), jax.lax.slice_in_dim(order, 0, k, axis=axis)


@lowering("aten::kthvalue")
def kthvalue(x, k, dim=-1, keepdim=False):
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    axis = canonical_dim(dim, x.ndim)
    values, order = sort(x, axis)
    v = jax.lax.index_in_dim(values, k - 1, axis, keepdims=keepdim)
    i = jax.lax.index_in_dim(order, k - 1, axis, keepdims=keepdim)
    return v, i


def _median(x, dim, keepdim, ignore_nan):
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    axis = canonical_dim(dim, x.ndim)
    values, order = sort(x, axis)
    n = x.shape[axis]
    if ignore_nan and jnp.issubdtype(x.dtype, jnp.floating):
        valid = jnp.sum(~jnp.isnan(x), axis=axis, keepdims=True)
        k = jnp.maximum(valid - 1, 0) // 2
    else:
        k = jnp.full([1 if d == axis else s for d, s in enumerate(x.shape)], (n - 1) // 2)
        if jnp.issubdtype(x.dtype, jnp.floating):  # a NaN makes the median NaN: its first index
            has_nan = jnp.any(jnp.isnan(x), axis=axis, keepdims=True)
            k = jnp.where(has_nan, jnp.sum(~jnp.isnan(x), axis=axis, keepdims=True), k)
    v = jnp.take_along_axis(values, k, axis=axis)
    i = jnp.take_along_axis(order, k, axis=axis)
    if not keepdim:
        v, i = jnp.squeeze(v, axis), jnp.squeeze(i, axis)
    return v, i


@lowering("aten::median.dim")
def median_dim(x, dim, keepdim=False):
    return _median(x, dim, keepdim, ignore_nan=False)


@lowering("aten::median")
def median(x):
    return _median(x.reshape(-1), 0, False, ignore_nan=False)[0]


@lowering("aten::nanmedian.dim")
def nanmedian_dim(x, dim, keepdim=False):
    return _median(x, dim, keepdim, ignore_nan=True)


@lowering("aten::nanmedian")
def nanmedian(x):
    return _median(x.reshape(-1), 0, False, ignore_nan=True)[0]


@lowering("aten::searchsorted.Tensor", "aten::searchsorted.Scalar")
def searchsorted(sorted_sequence, x, *, out_int32=False, right=False, side=None, sorter=None):
    side = side or ("right" if right else "left")
    x = jnp.asarray(x) if not hasattr(x, "dtype") else x
    if sorter is not None:
        sorted_sequence = jnp.take_along_axis(sorted_sequence, sorter, axis=-1)
    dtype = jnp.int32 if out_int32 else jnp.int64
    if sorted_sequence.ndim == 1:
        return jnp.searchsorted(sorted_sequence, x, side=side).astype(dtype)
    search = jnp.vectorize(lambda s, v: jnp.searchsorted(s, v, side=side), signature="(n),(m)->(m)")
    return search(sorted_sequence, x).astype(dtype)


@lowering("aten::bucketize.Tensor", "aten::bucketize.Scalar")
def bucketize(x, boundaries, *, out_int32=False, right=False):
    x = jnp.asarray(x) if not hasattr(x, "dtype") else x
    side = "right" if right else "left"
    return jnp.searchsorted(boundaries, x, side=side).astype(jnp.int32 if out_int32 else jnp.int64)


#: Above this many element pairs ``isin`` searches the sorted test
#: elements instead of comparing every pair (a ``[n, m]`` array of bools).
_ISIN_PAIRS = 1 << 20


@lowering("aten::isin.Tensor_Tensor", "aten::isin.Tensor_Scalar", "aten::isin.Scalar_Tensor", opmath=False)
def isin(elements, test_elements, *, assume_unique=False, invert=False):
    """``torch.isin``: one op, where torch's decomposition runs several
    (transformers' stopping criteria and logits processors call it every
    token).  Numbers stay weakly typed, so promotion is torch's; a NaN is
    in nothing."""
    if not hasattr(test_elements, "ndim") or test_elements.ndim == 0:
        return elements != test_elements if invert else elements == test_elements
    size = getattr(elements, "size", 1)
    method = "compare_all" if size * test_elements.size <= _ISIN_PAIRS else "binary_search"
    return jnp.isin(elements, test_elements, invert=invert, method=method)


# ------------------------------------------------------------------- complex views


@lowering("aten::view_as_real")
def view_as_real(self):
    return jnp.stack([jnp.real(self), jnp.imag(self)], axis=-1)


@lowering("aten::view_as_complex")
def view_as_complex(self):
    return jax.lax.complex(self[..., 0], self[..., 1])


@lowering("aten::_assert_async", "aten::_assert_async.msg")
def assert_async(cond, assert_msg=None):
    """Nothing to compute: the device's value check of the condition
    (``_torch._value_checks``) reports a false one as torch does."""
    return None
