"""torchvision's detection ops: ``torchvision::nms``, ``roi_align``,
``roi_pool`` and the backwards torchvision registers for them.

Each follows torchvision's CPU kernel (``torchvision/csrc/ops/cpu``) rule
for rule: the same sampling grid, clipping and rounding, the same greedy
order, so detection models give CPU's detections.  The table is keyed by
name, so nothing here needs torchvision installed; the ops reach the device
only when torchvision (or anything defining the same schemas) is loaded.

- ``nms`` keeps a data-dependent number of boxes: the suppression runs as
  one device program (IoU matrix, then the greedy pass over the boxes in
  descending score order, ties in index order as torch's sort leaves them);
  only the kept mask comes to the host to size the result.
- ``roi_align`` is bilinear sampling averaged per bin, which separates into
  a row-weight and a column-weight matrix per region of interest; the bin
  values are two matrix products with them (exact float math, summed in
  another order than torchvision's loop, so equal to rounding).  The
  adaptive grid (``sampling_ratio <= 0``: ``ceil(roi size / bins)`` samples
  per bin, a value of the boxes) is bounded statically by the samples that
  can fall on the feature map (``2 * size + 6``), so it traces too.  Unlike
  torchvision's loop, a non-finite value anywhere in the feature maps of
  the batch reaches every bin through a zero weight (``0 * inf``).
- ``roi_pool`` is a max over a box per bin: a masked max over columns, then
  over rows, keeping the first maximum in row-major order as the kernel's
  strict ``>`` does (NaN never wins; nothing above ``-FLT_MAX`` gives
  ``-FLT_MAX`` and no argmax, -1).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from . import lowering
from ._util import index_of_max

_HIGHEST = jax.lax.Precision.HIGHEST
#: float32's lowest finite value: the kernels' start value for every dtype.
_FLT_LOWEST = -float(np.finfo(np.float32).max)


# ---------------------------------------------------------------- nms


@jax.jit
def _nms_kept(boxes: jax.Array, scores: jax.Array, threshold: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(the boxes' order by descending score, whether each box in that
    order is kept)."""
    order = jnp.argsort(scores, descending=True, stable=True)
    x1, y1, x2, y2 = (boxes[order, i] for i in range(4))
    areas = (x2 - x1) * (y2 - y1)
    w = jnp.maximum(jnp.minimum(x2[:, None], x2[None, :]) - jnp.maximum(x1[:, None], x1[None, :]), 0)
    h = jnp.maximum(jnp.minimum(y2[:, None], y2[None, :]) - jnp.maximum(y1[:, None], y1[None, :]), 0)
    inter = w * h
    overlap = inter / (areas[:, None] + areas[None, :] - inter)
    # The kernel compares the box dtype's IoU with the threshold as a double.
    n = boxes.shape[0]
    later = jnp.arange(n)[None, :] > jnp.arange(n)[:, None]
    suppresses = (overlap.astype(threshold.dtype) > threshold) & later

    def step(i: jax.Array, suppressed: jax.Array) -> jax.Array:
        return suppressed | (suppresses[i] & ~suppressed[i])

    suppressed = jax.lax.fori_loop(0, n, step, jnp.zeros((n,), bool))
    return order, ~suppressed


@lowering("torchvision::nms", data_dependent=True)
def nms(boxes, scores, iou_threshold):
    """Indices of the kept boxes (int64), by descending score."""
    if boxes.shape[0] == 0:
        return jnp.zeros((0,), jnp.int64)
    order, kept = _nms_kept(boxes, scores, jnp.asarray(iou_threshold, jnp.float64))
    return order[np.flatnonzero(np.asarray(kept))].astype(jnp.int64)


# ---------------------------------------------------------------- roi_align


def _axis_weights(start, bin_size, grid, pooled: int, size: int, fixed: bool):
    """``[K, pooled, size]``: for each region, bin and pixel row (or
    column), the summed bilinear weight of the bin's samples on it; samples
    outside ``[-1, size]`` weigh nothing (torchvision's rule).  ``grid``:
    the sampling ratio (an int) when ``fixed``, else the samples per bin
    of each region."""
    dtype = start.dtype
    p = jnp.arange(pooled, dtype=dtype)[None, :, None]
    start, bin_size = start[:, None, None], bin_size[:, None, None]
    base = start + p * bin_size
    if fixed:
        iy = jnp.arange(grid, dtype=dtype)[None, None, :]
    else:
        grid = grid[:, None, None]
        # Only samples that can land in [-1, size] matter: at most
        # 2 * size + 3 per bin (an adaptive grid's samples are >= 0.5
        # apart); start a little before the first one.
        step = jnp.where(grid > 0, bin_size / jnp.where(grid > 0, grid, 1), 1)
        step = jnp.where(step > 0, step, 1)
        first = jnp.maximum(jnp.floor((-1 - base) / step - 0.5) - 2, 0)
        iy = first + jnp.arange(2 * size + 6, dtype=dtype)[None, None, :]
    y = base + (iy + 0.5) * bin_size / grid
    valid = (iy < grid) & (y >= -1) & (y <= size)
    y = jnp.maximum(y, 0)
    low = jnp.floor(y).astype(jnp.int32)
    at_end = low >= size - 1
    high = jnp.where(at_end, size - 1, low + 1)
    low = jnp.where(at_end, size - 1, low)
    y = jnp.where(at_end, low.astype(dtype), y)
    ly = y - low
    hy = 1 - ly
    hy, ly = jnp.where(valid, hy, 0), jnp.where(valid, ly, 0)
    if fixed:  # a few samples per bin: one-hot sums (deterministic, no scatter)
        pixels = jnp.arange(size)
        return (hy[..., None] * (low[..., None] == pixels) + ly[..., None] * (high[..., None] == pixels)).sum(axis=2)
    # Up to 2 * size + 6 samples per bin: scattered, not one-hot ([K, P, S, size] would be large).
    k, p = jnp.arange(low.shape[0])[:, None, None], jnp.arange(pooled)[None, :, None]
    weights = jnp.zeros((low.shape[0], pooled, size), dtype)
    return weights.at[k, p, low].add(hy).at[k, p, high].add(ly)


def _align_geometry(rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned, height, width):
    """(row weights ``[K, PH, H]``, column weights ``[K, PW, W]``, the
    samples per bin ``[K]``)."""
    dtype = rois.dtype
    offset = 0.5 if aligned else 0.0
    start_w = rois[:, 1] * spatial_scale - offset
    start_h = rois[:, 2] * spatial_scale - offset
    roi_w = rois[:, 3] * spatial_scale - offset - start_w
    roi_h = rois[:, 4] * spatial_scale - offset - start_h
    if not aligned:
        roi_w = jnp.maximum(roi_w, 1)
        roi_h = jnp.maximum(roi_h, 1)
    bin_h = roi_h / pooled_height
    bin_w = roi_w / pooled_width
    fixed = sampling_ratio > 0
    if fixed:
        grid_h = grid_w = jnp.full(rois.shape[:1], sampling_ratio, dtype)
    else:
        grid_h, grid_w = jnp.ceil(roi_h / pooled_height), jnp.ceil(roi_w / pooled_width)
    wy = _axis_weights(start_h, bin_h, sampling_ratio if fixed else grid_h, pooled_height, height, fixed)
    wx = _axis_weights(start_w, bin_w, sampling_ratio if fixed else grid_w, pooled_width, width, fixed)
    count = jnp.maximum(grid_h * grid_w, 1)
    return wy, wx, count


def _batch_rows(rois, batch: int, wy):
    """``[K, PH, N, H]``: the row weights placed at each region's image."""
    image = rois[:, 0].astype(jnp.int32)  # the kernel truncates the index
    return wy[:, :, None, :] * (image[:, None] == jnp.arange(batch))[:, None, :, None].astype(wy.dtype)


@lowering("torchvision::roi_align")
def roi_align(input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned):
    batch, _, height, width = input.shape
    rois = rois.astype(input.dtype)
    wy, wx, count = _align_geometry(rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned,
                                    height, width)
    rows = jnp.einsum("kpnr,ncrs->kpcs", _batch_rows(rois, batch, wy), input, precision=_HIGHEST)
    out = jnp.einsum("kpcs,kqs->kcpq", rows, wx, precision=_HIGHEST)
    return (out / count[:, None, None, None]).astype(input.dtype)


@lowering("torchvision::_roi_align_backward")
def roi_align_backward(grad, rois, spatial_scale, pooled_height, pooled_width, batch_size, channels, height, width,
                       sampling_ratio, aligned):
    rois = rois.astype(grad.dtype)
    wy, wx, count = _align_geometry(rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned,
                                    height, width)
    cols = jnp.einsum("kcpq,kqs->kcps", grad / count[:, None, None, None], wx, precision=_HIGHEST)
    out = jnp.einsum("kpnr,kcps->ncrs", _batch_rows(rois, batch_size, wy), cols, precision=_HIGHEST)
    return out.astype(grad.dtype).reshape(batch_size, channels, height, width)


# ---------------------------------------------------------------- roi_pool


def _round_half_away(x):
    """C's ``round``: halves away from zero (``jnp.round`` goes to even)."""
    return jnp.where(x >= 0, jnp.floor(x + 0.5), -jnp.floor(-x + 0.5))


def _pool_bounds(start, end, pooled: int, size: int, dtype):
    """``[K, pooled]`` first and past-the-end pixel of each bin, clipped
    (bin sizes in the input's ``dtype``, as the kernel's ``T``)."""
    extent = jnp.maximum(end - start + 1, 1)
    bin_size = extent.astype(dtype) / pooled
    p = jnp.arange(pooled, dtype=dtype)[None, :]
    lo = jnp.floor(p * bin_size[:, None]).astype(jnp.int32) + start[:, None]
    hi = jnp.ceil((p + 1) * bin_size[:, None]).astype(jnp.int32) + start[:, None]
    return jnp.clip(lo, 0, size), jnp.clip(hi, 0, size)


@lowering("torchvision::roi_pool")
def roi_pool(input, rois, spatial_scale, pooled_height, pooled_width):
    _, channels, height, width = input.shape
    rois = rois.astype(input.dtype)
    image = rois[:, 0].astype(jnp.int32)
    corner = _round_half_away(rois[:, 1:] * jnp.asarray(spatial_scale, input.dtype)).astype(jnp.int32)
    h_lo, h_hi = _pool_bounds(corner[:, 1], corner[:, 3], pooled_height, height, input.dtype)
    w_lo, w_hi = _pool_bounds(corner[:, 0], corner[:, 2], pooled_width, width, input.dtype)
    rows, cols = jnp.arange(height), jnp.arange(width)
    in_h = (rows >= h_lo[..., None]) & (rows < h_hi[..., None])  # [K, PH, H]
    in_w = (cols >= w_lo[..., None]) & (cols < w_hi[..., None])  # [K, PW, W]
    values = input[image]  # [K, C, H, W]
    values = jnp.where(jnp.isnan(values), -jnp.inf, values)  # NaN never wins the kernel's `>`
    # Columns first: [K, C, H, PW, W] -> the first maximum of each row's window.
    masked = jnp.where(in_w[:, None, None, :, :], values[:, :, :, None, :], -jnp.inf)
    col = index_of_max(masked, axis=-1)
    col_max = jnp.take_along_axis(masked, col[..., None], axis=-1)[..., 0]  # [K, C, H, PW]
    # Then rows: [K, C, PH, PW, H] -> the first row holding the maximum.
    masked = jnp.where(in_h[:, None, :, None, :], jnp.moveaxis(col_max, 2, -1)[:, :, None, :, :], -jnp.inf)
    row = index_of_max(masked, axis=-1)
    best = jnp.take_along_axis(masked, row[..., None], axis=-1)[..., 0]  # [K, C, PH, PW]
    cols_of_rows = jnp.broadcast_to(jnp.moveaxis(col, 2, -1)[:, :, None, :, :], masked.shape)
    best_col = jnp.take_along_axis(cols_of_rows, row[..., None], axis=-1)[..., 0]
    empty = ((h_hi <= h_lo)[:, :, None] | (w_hi <= w_lo)[:, None, :])[:, None]  # [K, 1, PH, PW]
    found = best > _FLT_LOWEST
    out = jnp.where(empty, 0, jnp.where(found, best, _FLT_LOWEST)).astype(input.dtype)
    argmax = jnp.where(empty | ~found, -1, row * width + best_col).astype(jnp.int32)
    return out, jnp.broadcast_to(argmax, out.shape)


@lowering("torchvision::_roi_pool_backward")
def roi_pool_backward(grad, rois, argmax, spatial_scale, pooled_height, pooled_width, batch_size, channels, height,
                      width):
    image = rois[:, 0].astype(jnp.int32)
    k, c = grad.shape[:2]
    flat = argmax.reshape(k, c, -1)
    picked = flat >= 0
    target = (image[:, None, None] * channels + jnp.arange(c)[None, :, None]) * (height * width) + flat
    size = batch_size * channels * height * width
    target = jnp.where(picked, target, size)  # out of range: dropped
    out = jnp.zeros((size,), grad.dtype)
    out = out.at[target.reshape(-1)].add(jnp.where(picked, grad.reshape(k, c, -1), 0).reshape(-1), mode="drop")
    return out.reshape(batch_size, channels, height, width)
