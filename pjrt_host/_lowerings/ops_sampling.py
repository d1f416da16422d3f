"""Sampling lowerings: 3-d grid sampling, antialiased resampling and
fractional max pooling, with their backward ops.

Each follows torch's CPU kernel where rounding decides the result: which
corner of a grid cell is inside the input, which input rows a resampling
window covers, where a pooling interval starts.  Values torch's kernel
computes in the input's dtype (interpolation weights, interval starts) are
computed in that dtype here too, with the same double-precision steps, so
the integer decisions taken from them agree.
"""

from __future__ import annotations

import functools
import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np

from . import lowering
from ._util import index_of_max
from .ops_nn import _output_size, _scatter_to_input, _tuple

# ------------------------------------------------------------- grid sampling
# torch's enums: GridSamplerInterpolation and GridSamplerPadding.
_BILINEAR, _NEAREST, _BICUBIC = 0, 1, 2
_ZEROS, _BORDER, _REFLECTION = 0, 1, 2


def _clip_coordinates(x, size):
    """torch's clip_coordinates, min(size - 1, max(x, 0)), with its
    comparisons: NaN passes the max and becomes size - 1 at the min.  The
    gradient is 0 on both borders, as torch's backward has it."""
    x = jnp.where(x <= 0, jnp.zeros((), x.dtype), x)
    return jnp.where(x < size - 1, x, jnp.asarray(size - 1, x.dtype))


def _reflect_coordinates(x, twice_low, twice_high):
    """Reflect x into [low, high] (bounds given doubled, so that half-integers are ints)."""
    if twice_low == twice_high:
        return jnp.zeros_like(x)
    low = twice_low / 2
    span = (twice_high - twice_low) / 2
    d = x - low
    d = jnp.where(d < 0, -d, d)  # |d| with torch's backward sign (+1 at 0, where jnp.abs has 0)
    extra = jnp.fmod(d, span)
    # XLA turns a division by a broadcast scalar (barrier or not) into a
    # multiply by its reciprocal, which puts multiples of span (41, 82 ...)
    # on the wrong side of a flip; dividing by span + 0 * d keeps the true
    # division, rounded as torch's.
    flips = jnp.floor(d / (span + 0 * d))
    return jnp.where(jnp.fmod(flips, 2) == 0, extra + low, span - extra + low)


@functools.partial(jax.custom_jvp, nondiff_argnums=(1,))
def _rounded_product(a, k):
    """a * k (k a small int), rounded as a product of its own: XLA fuses a
    product with the sum that follows (an FMA, or the sum kept in float64),
    rounding once where torch rounds twice, and so moves the half-way points
    that nearest sampling rounds to even.  For float32 the product is exact
    in float64 and is rounded to float32 with integer ops, which no compiler
    merges with what follows."""
    if a.dtype != jnp.float32:
        return a * k
    bits = jax.lax.bitcast_convert_type(a.astype(jnp.float64) * k, jnp.int64)
    dropped = bits & (2**29 - 1)  # the float64 significand bits float32 has no room for
    kept = bits - dropped
    up = (dropped > 2**28) | ((dropped == 2**28) & ((kept >> 29) & 1 == 1))  # to nearest, ties to even
    return jax.lax.bitcast_convert_type(jnp.where(up, kept + 2**29, kept), jnp.float64).astype(jnp.float32)


@_rounded_product.defjvp
def _rounded_product_jvp(k, primals, tangents):
    return _rounded_product(primals[0], k), tangents[0] * k


def _source_index(coord, size, padding_mode, align_corners):
    """torch's grid_sampler_compute_source_index: a grid coordinate in
    [-1, 1] to a fractional input index along an axis of ``size``."""
    if align_corners:
        x = (coord + 1) / 2 * (size - 1)
    else:
        x = (_rounded_product(coord + 1, size) - 1) / 2
    if padding_mode == _BORDER:
        x = _clip_coordinates(x, size)
    elif padding_mode == _REFLECTION:
        twice = (0, 2 * (size - 1)) if align_corners else (-1, 2 * size - 1)
        x = _clip_coordinates(_reflect_coordinates(x, *twice), size)
    return x


def _grid_sample(x, grid, mode, padding_mode, align_corners):
    """x [N, C, *S] sampled at grid [N, *O, n] -> [N, C, *O].  The grid's
    last axis lists coordinates from the last spatial axis (x = W) back."""
    # torch's decomposition of 2-d sampling refuses other modes; its CPU and
    # cuda kernels check neither and return their output uninitialised
    if mode not in (_BILINEAR, _NEAREST, _BICUBIC):
        raise RuntimeError(f"Invalid interpolation mode {mode}")
    if padding_mode not in (_ZEROS, _BORDER, _REFLECTION):
        raise RuntimeError(f"Invalid padding mode {padding_mode}")
    if mode not in (_BILINEAR, _NEAREST):
        raise NotImplementedError(
            f"pjrt_host: grid sampling of {x.ndim - 2}-d inputs in interpolation mode {mode} (bicubic) has no lowering "
            "(2-d bicubic runs forward through torch's decomposition, not backward); use mode='bilinear', or "
            "pjrt_host.config(cpu_fallback=True) around the backward")
    n = grid.shape[-1]
    sizes = x.shape[2:]
    batch, channels = x.shape[:2]
    out_shape = grid.shape[1:-1]
    coords = [_source_index(grid[..., n - 1 - i], sizes[i], padding_mode, align_corners) for i in range(n)]
    planes = x.reshape(batch, channels, math.prod(sizes))
    index_dtype = jnp.int32 if math.prod(sizes) < 2**31 else jnp.int64
    strides = [math.prod(sizes[i + 1:]) for i in range(n)]

    def corner(positions):
        """Values at integer-valued positions (one array per axis), and where they are inside."""
        inside = True
        for p, size in zip(positions, sizes):
            inside = inside & (p >= 0) & (p <= size - 1)  # NaN and huge coordinates are outside
        flat = sum(jnp.where(inside, p, 0).astype(index_dtype) * s for p, s in zip(positions, strides))
        values = jnp.take_along_axis(planes, flat.reshape(batch, 1, math.prod(out_shape)), axis=2)
        return values.reshape((batch, channels) + out_shape), inside[:, None]

    if mode == _NEAREST:
        values, inside = corner([jnp.round(c) for c in coords])  # half to even, as torch's nearbyint
        return jnp.where(inside, values, jnp.zeros((), x.dtype))
    lows = [jnp.floor(c) for c in coords]
    out = jnp.zeros((batch, channels) + out_shape, x.dtype)
    # Corners in torch's order (first axis outermost); each weight is the
    # product of the x, y[, z] factors in that order, as torch multiplies.
    for ks in itertools.product((0, 1), repeat=n):
        weight = None
        for i in reversed(range(n)):
            factor = coords[i] - lows[i] if ks[i] else lows[i] + 1 - coords[i]
            weight = factor if weight is None else weight * factor
        values, inside = corner([low + k for low, k in zip(lows, ks)])
        out = out + jnp.where(inside, values * weight[:, None], jnp.zeros((), x.dtype))
    return out


@lowering("aten::grid_sampler_3d")
def grid_sampler_3d(x, grid, interpolation_mode, padding_mode, align_corners):
    return _grid_sample(x, grid, interpolation_mode, padding_mode, align_corners)


@lowering("aten::grid_sampler_3d_backward", "aten::grid_sampler_2d_backward")
def grid_sampler_3d_backward(grad_output, x, grid, interpolation_mode, padding_mode, align_corners, output_mask):
    """Also 2-d's (the forward of 2-d runs torch's decomposition; bicubic
    has no lowering here and says so)."""
    _, pullback = jax.vjp(lambda x_, g_: _grid_sample(x_, g_, interpolation_mode, padding_mode, align_corners),
                          x, grid)
    grad_x, grad_grid = pullback(grad_output)
    return (grad_x if output_mask[0] else None), grad_grid


# ---------------------------------------------------- antialiased resampling
# torch's separable kernel: per axis, each output pixel averages the input
# pixels under a filter stretched by the downscale factor (PIL's approach).
# The weights depend on sizes only, so each axis is one static matrix.


def _scalar_type(dtype):
    """numpy scalar type torch's kernel computes weights in for ``dtype``."""
    return np.float64 if dtype == jnp.float64 else np.float32


def _triangle(x, f):
    x = abs(x)
    return f(1.0 - float(x)) if x < 1.0 else f(0)


def _keys_cubic(x, f):
    # Keys' cubic with a = -0.5 (PIL's), in the scalar type as torch's
    # cubic_convolution1/2 compute it.
    a = f(-0.5)
    x = abs(x)
    if x < 1.0:
        return ((a + f(2)) * x - (a + f(3))) * x * x + f(1)
    if x < 2.0:
        return ((a * x - f(5) * a) * x + f(8) * a) * x - f(4) * a
    return f(0)


def _aa_matrix(size, out, interp_size, align_corners, scale, f):
    """[out, size] weights of torch's antialiased resampling along one axis
    (``_compute_indices_min_size_weights_aa``).  ``f`` is the scalar type;
    ``float(...)`` marks the steps torch's C++ takes in double."""
    if align_corners:
        s = f(size - 1) / f(out - 1) if out > 1 else f(0)
    elif scale is not None and scale > 0:
        s = f(1.0 / scale)
    else:
        s = f(size) / f(out)
    # Downscaling widens the filter by the factor (and shrinks its argument).
    support = f(interp_size * 0.5 * float(s)) if s >= 1.0 else f(interp_size * 0.5)
    invscale = f(1.0 / float(s)) if s >= 1.0 else f(1.0)
    max_taps = int(math.ceil(support)) * 2 + 1
    filt = _triangle if interp_size == 2 else _keys_cubic
    matrix = np.zeros((out, size), np.float64)
    for i in range(out):
        center = f(float(s) * (i + 0.5))
        xmin = max(int(float(center - support) + 0.5), 0)
        taps = min(max(min(int(float(center + support) + 0.5), size) - xmin, 0), max_taps)
        weights = [filt(f((float(f(xmin + j) - center) + 0.5) * float(invscale)), f) for j in range(taps)]
        total = f(0)
        for w in weights:
            total = total + w
        for j, w in enumerate(weights):
            matrix[i, xmin + j] = w / total if total != 0 else w
    return matrix


def _along(x, matrix, axis, transpose=False):
    """x with ``axis`` mapped through ``matrix`` ([out, in]; its transpose for a gradient)."""
    m = jnp.asarray(matrix, x.dtype)
    return jnp.moveaxis(jnp.tensordot(x, m, axes=([axis], [0 if transpose else 1])), -1, axis)


def _upsample_aa(x, output_size, align_corners, scales, interp_size):
    f = _scalar_type(x.dtype)
    # Width first, then height, as torch; an axis whose size stays is left
    # untouched (even where a given scale would not make its weights 1).
    for axis in (x.ndim - 1, x.ndim - 2):
        i = axis - (x.ndim - 2)
        if x.shape[axis] != output_size[i]:
            x = _along(x, _aa_matrix(x.shape[axis], output_size[i], interp_size, align_corners, scales[i], f), axis)
    return x


def _aa_lowering(interp_size):
    def lower(x, output_size, align_corners, scales_h=None, scales_w=None):
        return _upsample_aa(x, list(output_size), align_corners, (scales_h, scales_w), interp_size)

    return lower


def _aa_vec_lowering(interp_size):
    def lower(x, output_size, align_corners, scale_factors):
        size = _output_size(x, output_size, scale_factors, 2)
        scales = tuple(scale_factors) if scale_factors else (None, None)
        return _upsample_aa(x, size, align_corners, scales, interp_size)

    return lower


def _aa_backward_lowering(interp_size):
    def lower(grad_output, output_size, input_size, align_corners, scales_h=None, scales_w=None):
        # torch's backward kernel applies every axis's weights, including an
        # axis whose size stays (which its forward skips).
        f = _scalar_type(grad_output.dtype)
        g = grad_output
        for i, scale in enumerate((scales_h, scales_w)):
            axis = g.ndim - 2 + i
            g = _along(g, _aa_matrix(input_size[axis], output_size[i], interp_size, align_corners, scale, f), axis,
                       transpose=True)
        return g

    return lower


for _interp_size, _name in ((2, "_upsample_bilinear2d_aa"), (4, "_upsample_bicubic2d_aa")):
    lowering(f"aten::{_name}")(_aa_lowering(_interp_size))
    lowering(f"aten::{_name}.vec")(_aa_vec_lowering(_interp_size))
    lowering(f"aten::{_name}_backward")(_aa_backward_lowering(_interp_size))


# ------------------------------------------------- fractional max pooling


def _interval_starts(sample, size, out, k):
    """torch's generate_intervals along one axis: window starts [..., out]
    from each plane's sample [...], in the sample's dtype."""
    last = jnp.full(sample.shape + (min(out, 1),), size - k, jnp.int32)
    if out <= 1:
        return last
    f = _scalar_type(sample.dtype)
    alpha = jnp.asarray(f(size - k) / f(out - 1), sample.dtype)
    i = jnp.arange(out - 1, dtype=sample.dtype)
    # Truncation towards zero, as torch's int casts.
    starts = ((i + sample[..., None]) * alpha).astype(jnp.int32) - (sample * alpha).astype(jnp.int32)[..., None]
    return jnp.concatenate([starts, last], axis=-1)


def _fractional_max_pool(x, kernel_size, output_size, samples, n):
    k, o = _tuple(kernel_size, n), _tuple(output_size, n)
    batched = x.ndim == n + 2
    if not batched:
        x = x[None]
    batch, channels = x.shape[:2]
    sizes = x.shape[2:]
    samples = samples.reshape(batch, channels, n)
    # Which sample drives which axis: 2-d takes (W, H), 3-d (T, H, W).
    sample_of_axis = (1, 0) if n == 2 else (0, 1, 2)
    flat = jnp.zeros((batch, channels) + (1,) * (2 * n), jnp.int32)
    for i in range(n):
        starts = _interval_starts(samples[..., sample_of_axis[i]], sizes[i], o[i], k[i])
        # a window of no taps (kernel size <= 0) keeps its start: torch's
        # kernels give -inf there, with the start as its index
        taps = max(k[i], 1)
        pos = starts[..., :, None] + jnp.arange(taps, dtype=jnp.int32)
        shape = [batch, channels] + [1] * (2 * n)
        shape[2 + i], shape[2 + n + i] = o[i], taps
        flat = flat + pos.reshape(shape) * math.prod(sizes[i + 1:])
    # [N, C, *out, *kernel] -> [N, C, prod(out), prod(kernel)]: taps in torch's scan order.
    taps = tuple(max(ki, 1) for ki in k)
    windows = (batch, channels, math.prod(o), math.prod(taps))
    flat = jnp.broadcast_to(flat, (batch, channels) + tuple(o) + taps).reshape(windows)
    if min(k) <= 0:
        out = jnp.full((batch, channels) + tuple(o), -jnp.inf, x.dtype)
        indices = flat[..., 0].reshape((batch, channels) + tuple(o)).astype(jnp.int64)
        return (out, indices) if batched else (out[0], indices[0])
    values = jnp.take_along_axis(x.reshape(batch, channels, math.prod(sizes)),
                                 flat.reshape(batch, channels, windows[2] * windows[3]), axis=2).reshape(windows)
    # torch keeps the first maximum, but any NaN wins and a later NaN replaces it.
    nan = jnp.isnan(values)
    last_nan = values.shape[-1] - 1 - index_of_max(nan[..., ::-1], axis=-1)
    best = jnp.where(jnp.any(nan, axis=-1), last_nan, index_of_max(values, axis=-1))[..., None]
    out = jnp.take_along_axis(values, best, axis=-1).reshape((batch, channels) + tuple(o))
    indices = jnp.take_along_axis(flat, best, axis=-1).reshape((batch, channels) + tuple(o)).astype(jnp.int64)
    return (out, indices) if batched else (out[0], indices[0])


@lowering("aten::fractional_max_pool2d")
def fractional_max_pool2d(x, kernel_size, output_size, random_samples):
    return _fractional_max_pool(x, kernel_size, output_size, random_samples, 2)


@lowering("aten::fractional_max_pool3d")
def fractional_max_pool3d(x, kernel_size, output_size, random_samples):
    return _fractional_max_pool(x, kernel_size, output_size, random_samples, 3)


@lowering("aten::fractional_max_pool2d_backward")
def fractional_max_pool2d_backward(grad_output, x, kernel_size, output_size, indices):
    return _scatter_to_input(grad_output, x, indices, 2)


@lowering("aten::fractional_max_pool3d_backward")
def fractional_max_pool3d_backward(grad_output, x, kernel_size, output_size, indices):
    return _scatter_to_input(grad_output, x, indices, 3)
