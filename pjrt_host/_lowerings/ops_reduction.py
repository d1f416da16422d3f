"""Reductions and scans: sum / mean / prod / extremes / arg-extremes,
variance and norms, logsumexp, cumulative ops, softmax, any / all.

torch's dtype rules for reductions: integral sums, products and cumulative
sums accumulate in int64 unless ``dtype=`` says otherwise; mean / var /
norm need floating input; any / all give bool (uint8 for uint8 input).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import torch

from . import lowering
from ._util import (as_float, canonical_dim, index_of_max, index_of_min, canonical_dims, cast, linspace_values, optional_jax_dtype, promote,
                    torch_dtype_of, widened)


def _accumulate_dtype(x, dtype):
    """The dtype sum / prod / cumsum compute in: ``dtype`` if given, else
    int64 for integral input, else the input's."""
    if dtype is not None:
        return dtype
    d = torch_dtype_of(x)
    return torch.int64 if not (d.is_floating_point or d.is_complex) else d


def _accumulated(x, dtype):
    """x in the dtype its reduction computes in: ``_accumulate_dtype``, and
    float32 when that is a 16-bit float (``x`` rounded to it first): torch
    accumulates bfloat16 / float16 in float32 and rounds the result once,
    whether the 16-bit dtype is the input's or an explicit ``dtype=``."""
    return _opmath_cast(x, _accumulate_dtype(x, dtype))


def _opmath_cast(x, dtype):
    return widened(cast(x, dtype))


def _dims(x, dim):
    return canonical_dims(dim, x.ndim)


@lowering("aten::sum", "aten::sum.dim_IntList")
def sum_(x, dim=None, keepdim=False, *, dtype=None):
    x = _accumulated(x, dtype)
    return jnp.sum(x, axis=_dims(x, dim), keepdims=keepdim)


@lowering("aten::nansum")
def nansum(x, dim=None, keepdim=False, *, dtype=None):
    x = _accumulated(x, dtype)
    return jnp.nansum(x, axis=_dims(x, dim), keepdims=keepdim)


@lowering("aten::mean", "aten::mean.dim")
def mean(x, dim=None, keepdim=False, *, dtype=None):
    if dtype is not None:
        x = cast(x, dtype)
    return jnp.mean(x, axis=_dims(x, dim), keepdims=keepdim)


@lowering("aten::nanmean")
def nanmean(x, dim=None, keepdim=False, *, dtype=None):
    if dtype is not None:
        x = cast(x, dtype)
    return jnp.nanmean(x, axis=_dims(x, dim), keepdims=keepdim)


@lowering("aten::prod", "aten::prod.dim_int")
def prod(x, dim=None, keepdim=False, *, dtype=None):
    x = _accumulated(x, dtype)
    if x.dtype == jnp.bool_:
        return jnp.all(x, axis=_dims(x, dim), keepdims=keepdim)
    return jnp.prod(x, axis=_dims(x, dim), keepdims=keepdim)


@lowering("aten::amax")
def amax(x, dim=(), keepdim=False):
    return jnp.max(x, axis=_dims(x, dim), keepdims=keepdim)


@lowering("aten::amin")
def amin(x, dim=(), keepdim=False):
    return jnp.min(x, axis=_dims(x, dim), keepdims=keepdim)


@lowering("aten::aminmax")
def aminmax(x, *, dim=None, keepdim=False):
    return amin(x, dim, keepdim), amax(x, dim, keepdim)


def _check_not_empty(x, name):
    if x.size == 0:  # a max of nothing has no value (torch.amax of an empty dim raises too)
        raise RuntimeError(f"{name}(): Expected reduction dim to be specified for input.numel() == 0. Specify the "
                           "reduction dim with the 'dim' argument.")


@lowering("aten::max", "aten::max.unary_out")
def max_all(x):
    _check_not_empty(x, "max")
    return jnp.max(x)


@lowering("aten::min")
def min_all(x):
    _check_not_empty(x, "min")
    return jnp.min(x)


def _arg_extreme(x, dim, keepdim, largest):
    """Index of the first max (min), NaN counting as the largest, like torch."""
    flat = dim is None
    if flat:
        x = x.reshape(-1)
        axis = 0
    else:
        axis = canonical_dim(dim, x.ndim)
    if x.ndim == 0:
        return jnp.zeros((), jnp.int64)
    out = index_of_max(x, axis=axis) if largest else index_of_min(x, axis=axis)
    if jnp.issubdtype(x.dtype, jnp.floating):
        nan = jnp.isnan(x)
        out = jnp.where(jnp.any(nan, axis=axis), index_of_max(nan, axis=axis), out)
    out = out.astype(jnp.int64)
    if keepdim:
        out = jnp.expand_dims(out, axis) if not flat else out.reshape((1,) * x.ndim)
    return out


@lowering("aten::argmax")
def argmax(x, dim=None, keepdim=False):
    if dim is None and keepdim:
        return _arg_extreme(x, None, False, True).reshape((1,) * x.ndim)
    return _arg_extreme(x, dim, keepdim, True)


@lowering("aten::argmin")
def argmin(x, dim=None, keepdim=False):
    if dim is None and keepdim:
        return _arg_extreme(x, None, False, False).reshape((1,) * x.ndim)
    return _arg_extreme(x, dim, keepdim, False)


@lowering("aten::max.dim")
def max_dim(x, dim, keepdim=False):
    return amax(x, dim, keepdim), _arg_extreme(x, dim, keepdim, True)


@lowering("aten::min.dim")
def min_dim(x, dim, keepdim=False):
    return amin(x, dim, keepdim), _arg_extreme(x, dim, keepdim, False)


# ------------------------------------------------------- variance and norms


def _correction(correction, unbiased):
    if correction is not None:
        return correction
    return 1 if unbiased is None or unbiased else 0


@lowering("aten::var", "aten::var.dim", "aten::var.correction")
def var(x, dim=None, unbiased=None, keepdim=False, *, correction=None):
    if isinstance(dim, bool):  # var(x, unbiased)
        dim, unbiased = None, dim
    axes = _dims(x, dim)
    n = 1
    for a in axes:
        n *= x.shape[a]
    centered = x - jnp.mean(x, axis=axes, keepdims=True)
    squares = jnp.real(centered * jnp.conj(centered))
    total = jnp.sum(squares, axis=axes, keepdims=keepdim)
    return total / max(n - _correction(correction, unbiased), 0)


@lowering("aten::std", "aten::std.dim", "aten::std.correction")
def std(x, dim=None, unbiased=None, keepdim=False, *, correction=None):
    return jnp.sqrt(var(x, dim, unbiased, keepdim, correction=correction))


@lowering("aten::var_mean", "aten::var_mean.dim", "aten::var_mean.correction")
def var_mean(x, dim=None, unbiased=None, keepdim=False, *, correction=None):
    if isinstance(dim, bool):
        dim, unbiased = None, dim
    return var(x, dim, unbiased, keepdim, correction=correction), mean(x, dim, keepdim)


@lowering("aten::std_mean", "aten::std_mean.dim", "aten::std_mean.correction")
def std_mean(x, dim=None, unbiased=None, keepdim=False, *, correction=None):
    if isinstance(dim, bool):
        dim, unbiased = None, dim
    return std(x, dim, unbiased, keepdim, correction=correction), mean(x, dim, keepdim)


@lowering("aten::linalg_vector_norm")
def vector_norm(x, ord=2, dim=None, keepdim=False, *, dtype=None):
    if dtype is not None:
        x = cast(x, dtype)
    axes = _dims(x, dim)
    a = jnp.abs(x)
    if ord == float("inf"):
        return jnp.max(a, axis=axes, keepdims=keepdim)
    if ord == float("-inf"):
        return jnp.min(a, axis=axes, keepdims=keepdim)
    if ord == 0:
        return jnp.sum((a != 0).astype(a.dtype), axis=axes, keepdims=keepdim)
    if ord == 1:
        return jnp.sum(a, axis=axes, keepdims=keepdim)
    if ord == 2:
        return jnp.sqrt(jnp.sum(a * a, axis=axes, keepdims=keepdim))
    return jnp.sum(a**ord, axis=axes, keepdims=keepdim) ** (1.0 / ord)


@lowering("aten::norm.Scalar", "aten::norm.ScalarOpt_dim", "aten::norm.ScalarOpt_dim_dtype",
          "aten::norm.ScalarOpt_dtype", "aten::norm.names_ScalarOpt_dim")
def norm(x, p=2, dim=None, keepdim=False, *, dtype=None):
    return vector_norm(x, 2 if p is None else p, dim, keepdim, dtype=dtype)


@lowering("aten::_foreach_norm.Scalar")
def foreach_norm(tensors, ord=2, dtype=None):
    return [vector_norm(t, ord, dtype=dtype) for t in tensors]


@lowering("aten::logsumexp")
def logsumexp(x, dim, keepdim=False):
    x = as_float(x)
    axes = _dims(x, dim)
    if x.size == 0:
        return jnp.log(jnp.sum(jnp.exp(x), axis=axes, keepdims=keepdim))
    m = jnp.max(x, axis=axes, keepdims=True)
    m = jnp.where(jnp.isfinite(m), m, 0)
    out = jnp.log(jnp.sum(jnp.exp(x - m), axis=axes, keepdims=True)) + m
    return out if keepdim else jnp.squeeze(out, axes)


@lowering("aten::count_nonzero", "aten::count_nonzero.dim_IntList")
def count_nonzero(x, dim=None):
    if isinstance(dim, int):
        dim = [dim]
    return jnp.sum(x != 0, axis=_dims(x, dim)).astype(jnp.int64)


@lowering("aten::any", "aten::any.dim", "aten::any.dims")
def any_(x, dim=None, keepdim=False):
    out = jnp.any(x != 0, axis=_dims(x, dim), keepdims=keepdim)
    return out.astype(jnp.uint8) if x.dtype == jnp.uint8 else out


@lowering("aten::all", "aten::all.dim", "aten::all.dims")
def all_(x, dim=None, keepdim=False):
    out = jnp.all(x != 0, axis=_dims(x, dim), keepdims=keepdim)
    return out.astype(jnp.uint8) if x.dtype == jnp.uint8 else out


@lowering("aten::_is_all_true")
def is_all_true(x):
    """``torch._is_all_true`` of a bool tensor: how torch.distributions
    checks its arguments (``validate_args``, on by default)."""
    return jnp.all(x)


@lowering("aten::_is_any_true")
def is_any_true(x):
    return jnp.any(x)


# ----------------------------------------------------------------- scans


@lowering("aten::cumsum")
def cumsum(x, dim, *, dtype=None):
    x = _accumulated(x, dtype)
    return jnp.cumsum(x, axis=canonical_dim(dim, x.ndim)) if x.ndim else x


@lowering("aten::cumprod")
def cumprod(x, dim, *, dtype=None):
    x = _accumulated(x, dtype)
    return jnp.cumprod(x, axis=canonical_dim(dim, x.ndim)) if x.ndim else x


@lowering("aten::logcumsumexp")
def logcumsumexp(x, dim):
    if x.ndim == 0:
        return x
    return jax.lax.cumlogsumexp(x, axis=canonical_dim(dim, x.ndim))


def _cumulative_extreme(x, dim, better):
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    axis = canonical_dim(dim, x.ndim)
    shape = [1] * x.ndim
    shape[axis] = x.shape[axis]
    index = jnp.broadcast_to(jnp.arange(x.shape[axis], dtype=jnp.int64).reshape(shape), x.shape)

    def combine(a, b):
        # torch keeps a running best and moves to a later element when it is
        # at least as good (ties take the later index); NaN sticks.
        (va, ia), (vb, ib) = a, b
        take_b = better(vb, va) | (vb == va)
        if jnp.issubdtype(x.dtype, jnp.floating):
            take_b = (take_b | jnp.isnan(vb)) & ~(jnp.isnan(va) & ~jnp.isnan(vb))
        return jnp.where(take_b, vb, va), jnp.where(take_b, ib, ia)

    return jax.lax.associative_scan(combine, (x, index), axis=axis)


@lowering("aten::cummax")
def cummax(x, dim):
    return _cumulative_extreme(x, dim, jnp.greater)


@lowering("aten::cummin")
def cummin(x, dim):
    return _cumulative_extreme(x, dim, jnp.less)


# ---------------------------------------------------------------- softmax


def _softmax_input(x, dtype=None, half_to_float=False):
    if dtype is not None:
        return _opmath_cast(x, dtype)
    if half_to_float:
        return x.astype(jnp.float32)
    return as_float(x)


@lowering("aten::_softmax", "aten::softmax.int")
def softmax(x, dim, half_to_float=False, *, dtype=None):
    if not isinstance(half_to_float, bool):  # softmax.int(x, dim, dtype)
        dtype, half_to_float = half_to_float, False
    x = _softmax_input(x, dtype, half_to_float)
    if x.ndim == 0:  # one element: 1, or NaN for NaN and inf (exp(x - x)), as CPU computes it
        return jax.nn.softmax(x.reshape(1), axis=0).reshape(())
    return jax.nn.softmax(x, axis=canonical_dim(dim, x.ndim))


@lowering("aten::_log_softmax", "aten::log_softmax.int")
def log_softmax(x, dim, half_to_float=False, *, dtype=None):
    if not isinstance(half_to_float, bool):
        dtype, half_to_float = half_to_float, False
    x = _softmax_input(x, dtype, half_to_float)
    if x.ndim == 0:  # 0, or NaN for NaN and inf, as CPU computes it
        return jax.nn.log_softmax(x.reshape(1), axis=0).reshape(())
    return jax.nn.log_softmax(x, axis=canonical_dim(dim, x.ndim))


@lowering("aten::_safe_softmax")
def safe_softmax(x, dim, dtype=None):
    """Softmax whose fully masked rows (all -inf) are 0 instead of NaN."""
    x = _softmax_input(x, dtype)
    axis = canonical_dim(dim, x.ndim)
    masked = jnp.all(x == -jnp.inf, axis=axis, keepdims=True)
    return jnp.where(masked, 0, jax.nn.softmax(x, axis=axis)).astype(x.dtype)


@lowering("aten::_softmax_backward_data")
def softmax_backward(grad_output, output, dim, input_dtype):
    g = grad_output * output
    # a 0-dim input is one element (dim 0 or -1): the sum over it is itself
    out = g - output * jnp.sum(g, axis=dim if g.ndim else None, keepdims=True)
    return out.astype(optional_jax_dtype(input_dtype))


@lowering("aten::_log_softmax_backward_data")
def log_softmax_backward(grad_output, output, dim, input_dtype):
    out = grad_output - jnp.exp(output) * jnp.sum(grad_output, axis=dim if grad_output.ndim else None, keepdims=True)
    return out.astype(optional_jax_dtype(input_dtype))


@lowering("aten::mode")
def mode(x, dim=-1, keepdim=False):
    """The most frequent value along ``dim`` (the smallest among ties) and
    the last index where it occurs, as torch CPU returns them."""
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    axis = canonical_dim(dim, x.ndim)
    moved = jnp.moveaxis(x, axis, -1)
    same = moved[..., :, None] == moved[..., None, :]
    counts = jnp.sum(same, axis=-1)
    best = jnp.max(counts, axis=-1, keepdims=True)
    candidates = jnp.where(counts == best, moved, jnp.max(moved, axis=-1, keepdims=True))
    value = jnp.min(candidates, axis=-1, keepdims=True)
    n = moved.shape[-1]
    index = jnp.max(jnp.where(moved == value, jnp.arange(n), -1), axis=-1, keepdims=True).astype(jnp.int64)
    value, index = jnp.moveaxis(value, -1, axis), jnp.moveaxis(index, -1, axis)
    if not keepdim:
        value, index = jnp.squeeze(value, axis), jnp.squeeze(index, axis)
    return value, index


@lowering("aten::dist")
def dist(x, other, p=2):
    _, (x, other) = promote(x, other)
    return vector_norm(x - other, p)


@lowering("aten::histc")
def histc(x, bins=100, min=0, max=0):
    lo, hi = jnp.asarray(min, x.dtype), jnp.asarray(max, x.dtype)
    if min == 0 and max == 0 and x.size:  # torch: the data's own range
        lo, hi = jnp.min(x), jnp.max(x)
    lo, hi = jnp.where(lo == hi, lo - 1, lo), jnp.where(lo == hi, hi + 1, hi)
    inside = (x >= lo) & (x <= hi)
    index = jnp.clip(((x - lo) * bins / (hi - lo)).astype(jnp.int64), 0, bins - 1)
    return jnp.zeros((bins,), x.dtype).at[index.reshape(-1)].add(inside.reshape(-1).astype(x.dtype))


@lowering("aten::histogram.bin_ct")
def histogram(x, bins=100, *, range=None, weight=None, density=False):
    """(counts, bin edges): histogramdd of one column, as torch computes it."""
    column = x.reshape(-1, 1)
    edges = _histogramdd_edges(column, [bins], range)
    return _histogramdd(column, edges, weight, density), edges[0]


@lowering("aten::histogram.bins_tensor")
def histogram_edges(x, bins, *, weight=None, density=False):
    """Counts over the given (increasing) bin edges, the last bin closed."""
    return _histogramdd(x.reshape(-1, 1), [bins], weight, density), bins


def _histogramdd_edges(x, bins, range_):
    """One edge array per column of x [N, D]: ``bins[d]`` equal bins over
    ``range_`` (pairs) or the column's min and max, widened by 0.5 each way
    when they are equal (torch's rule)."""
    edges = []
    for d, count in enumerate(bins):
        if range_ is not None:
            lo, hi = jnp.asarray(range_[2 * d], x.dtype), jnp.asarray(range_[2 * d + 1], x.dtype)
        elif x.shape[0]:
            lo, hi = jnp.min(x[:, d]), jnp.max(x[:, d])
        else:  # no data: [0, 1]
            lo, hi = jnp.zeros((), x.dtype), jnp.ones((), x.dtype)
        lo, hi = jnp.where(lo == hi, lo - 0.5, lo), jnp.where(lo == hi, hi + 0.5, hi)
        edges.append(linspace_values(lo, hi, count + 1, x.dtype))
    return edges


def _histogramdd(x, edges, weight, density):
    """Counts over the cells of the given per-dimension edges: each bin
    closed on the left, the last also on the right; points outside are
    dropped (torch finds bins by searching the edges, as here)."""
    x = x.reshape(-1, len(edges))
    shape = tuple(e.shape[0] - 1 for e in edges)
    flat = jnp.zeros((x.shape[0],), jnp.int64)
    inside = jnp.ones((x.shape[0],), bool)
    for d, e in enumerate(edges):
        col = x[:, d]
        n = e.shape[0] - 1
        index = jnp.clip(jnp.searchsorted(e, col, side="right") - 1, 0, max(n - 1, 0))
        inside &= (col >= e[0]) & (col <= e[-1])
        flat = flat * n + index
    w = jnp.ones((x.shape[0],), x.dtype) if weight is None else weight.reshape(-1).astype(x.dtype)
    hist = jnp.zeros((math.prod(shape),), x.dtype).at[flat].add(jnp.where(inside, w, 0)).reshape(shape)
    if density:
        hist = hist / jnp.sum(hist)
        for d, e in enumerate(edges):
            widths = jnp.diff(e).reshape(tuple(-1 if i == d else 1 for i in range(len(edges))))
            hist = hist / widths
    return hist


@lowering("aten::_histogramdd_bin_edges")
def histogramdd_bin_edges(x, bins, *, range=None, weight=None, density=False):
    return _histogramdd_edges(x.reshape(-1, len(bins)), bins, range)


@lowering("aten::_histogramdd_from_bin_cts")
def histogramdd_from_bin_cts(x, bins, *, range=None, weight=None, density=False):
    return _histogramdd(x, _histogramdd_edges(x.reshape(-1, len(bins)), bins, range), weight, density)


@lowering("aten::_histogramdd_from_bin_tensors")
def histogramdd_from_bin_tensors(x, bins, *, weight=None, density=False):
    return _histogramdd(x, list(bins), weight, density)


@lowering("aten::hash_tensor")
def hash_tensor(x, dim=(), *, keepdim=False, mode=0):
    """torch's mode 0: each element widened to its 64-bit float / integer
    type, its bits read as uint64, xor-reduced over ``dim`` (all if empty)."""
    if mode != 0:
        raise NotImplementedError(f"hash_tensor(mode={mode}): torch defines only mode 0 (xor)")
    wide = x.astype(jnp.float64 if jnp.issubdtype(x.dtype, jnp.floating) else
                    jnp.uint64 if jnp.issubdtype(x.dtype, jnp.unsignedinteger) else jnp.int64)
    bits = jax.lax.bitcast_convert_type(wide, jnp.uint64)
    dims = canonical_dims(dim, x.ndim)
    out = jax.lax.reduce(bits, np.uint64(0), jax.lax.bitwise_xor, dims)
    return jnp.expand_dims(out, dims) if keepdim else out
