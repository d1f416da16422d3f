"""Reductions over variable-length segments of one axis: ``embedding_bag``,
``segment_reduce`` and the CTC loss.

Segment boundaries are tensors (offsets, lengths), so their *values* are
traced, never needed on the host: each position gets its segment's number
(a ``searchsorted`` of the boundaries) and ``jax.ops.segment_*`` reduces,
with the number of segments -- the output shape -- taken from the
boundaries' *shape*.  Positions outside every segment get an out-of-range
number, which the segment ops drop.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from . import lowering
from ._util import canonical_dim

_SUM, _MEAN, _MAX = 0, 1, 2


def _segment_ids(starts, ends, n):
    """For positions 0..n-1: the number of the segment [starts[s], ends[s])
    holding it (segments in order, not overlapping), or len(starts) if none."""
    pos = jnp.arange(n, dtype=starts.dtype)
    seg = jnp.searchsorted(starts, pos, side="right") - 1
    inside = (seg >= 0) & (pos < jnp.take(ends, jnp.clip(seg, 0, None), mode="clip"))
    return jnp.where(inside, seg, starts.shape[0]).astype(jnp.int64)


# --------------------------------------------------------------- embedding_bag


def _bags(indices, offsets, include_last_offset):
    """(segment number per index, number of bags)."""
    n = indices.shape[0]
    bags = offsets.shape[0] - (1 if include_last_offset else 0)
    starts = offsets[:bags]
    end = offsets[bags] if include_last_offset else jnp.asarray(n, offsets.dtype)
    ends = jnp.concatenate([starts[1:], end[None]]) if bags else starts
    return _segment_ids(starts, ends, n), bags


@lowering("aten::_embedding_bag", "aten::_embedding_bag_forward_only")
def embedding_bag(weight, indices, offsets, scale_grad_by_freq=False, mode=_SUM, sparse=False,
                  per_sample_weights=None, include_last_offset=False, padding_idx=-1):
    """(output, offset2bag, bag_size, max_indices), with the shapes of torch's
    meta kernel (what a compiled graph expects): max_indices is empty except
    in max mode.  Indices equal to ``padding_idx`` count in no bag; an empty
    bag gives zeros."""
    seg, bags = _bags(indices, offsets, include_last_offset)
    keep = indices != padding_idx if padding_idx >= 0 else jnp.ones(indices.shape, bool)
    seg_kept = jnp.where(keep, seg, bags)
    rows = jnp.take(weight, indices, axis=0, mode="clip")
    sizes = jax.ops.segment_sum(keep.astype(jnp.int64), seg_kept, offsets.shape[0])
    if mode == _MAX:
        best = jax.ops.segment_max(rows, seg_kept, bags)
        empty = sizes[:bags, None] == 0
        # The index of each bag's maximum, per column: the first kept row equal to it.
        hit = (rows == jnp.take(best, jnp.clip(seg_kept, 0, max(bags - 1, 0)), axis=0, mode="clip")) \
            & keep[:, None] & (seg_kept < bags)[:, None]
        arg = jax.ops.segment_min(jnp.where(hit, indices[:, None], jnp.iinfo(jnp.int64).max), seg_kept, bags)
        output = jnp.where(empty, 0, best).astype(weight.dtype)
        return output, seg, sizes, jnp.where(empty, 0, arg).astype(jnp.int64)
    if per_sample_weights is not None:
        rows = rows * per_sample_weights[:, None].astype(rows.dtype)
    output = jax.ops.segment_sum(jnp.where(keep[:, None], rows, 0), seg_kept, bags)
    if mode == _MEAN:
        output = output / jnp.maximum(sizes[:bags], 1)[:, None].astype(output.dtype)
    return output.astype(weight.dtype), seg, sizes, jnp.zeros((0,), jnp.int64)


@lowering("aten::embedding_renorm")
def embedding_renorm(weight, indices, max_norm, norm_type):
    """The rows named by ``indices`` scaled down to norm ``max_norm`` where
    longer (torch's 1e-7 guard included); other rows unchanged."""
    rows = jnp.take(weight, indices, axis=0, mode="clip").astype(jnp.float32 if weight.dtype != jnp.float64
                                                                  else weight.dtype)
    norm = jnp.linalg.norm(rows, ord=norm_type, axis=-1) if norm_type != 2 else jnp.sqrt(jnp.sum(rows * rows, -1))
    scale = jnp.where(norm > max_norm, max_norm / (norm + 1e-7), 1.0)
    # each row once: a repeated index must not be scaled twice
    factor = jnp.ones((weight.shape[0],), scale.dtype).at[indices].set(scale)
    return (weight * factor[:, None]).astype(weight.dtype)


def _embedding_bag_weight_grad(grad, indices, offset2bag, bag_size, maximum_indices, num_weights,
                               scale_grad_by_freq, mode, per_sample_weights, padding_idx):
    keep = indices != padding_idx if padding_idx >= 0 else jnp.ones(indices.shape, bool)
    if mode == _MAX:
        bags, dim = grad.shape
        nonempty = (bag_size[:bags] > 0)[:, None]
        cols = jnp.broadcast_to(jnp.arange(dim), (bags, dim))
        return jnp.zeros((num_weights, dim), grad.dtype).at[maximum_indices, cols].add(
            jnp.where(nonempty, grad, 0), mode="drop")
    rows = jnp.take(grad, offset2bag, axis=0, mode="fill", fill_value=0)
    if mode == _MEAN:
        size = jnp.take(bag_size, offset2bag, mode="fill", fill_value=1)
        rows = rows / jnp.maximum(size, 1)[:, None].astype(rows.dtype)
    if per_sample_weights is not None:
        rows = rows * per_sample_weights[:, None].astype(rows.dtype)
    rows = jnp.where(keep[:, None], rows, 0)
    if scale_grad_by_freq:
        counts = jnp.zeros((num_weights,), rows.dtype).at[indices].add(1)
        rows = rows / jnp.take(counts, indices)[:, None]
    return jnp.zeros((num_weights, grad.shape[1]), grad.dtype).at[indices].add(rows, mode="drop")


@lowering("aten::_embedding_bag_dense_backward")
def embedding_bag_dense_backward(grad, indices, offset2bag, bag_size, maximum_indices, num_weights,
                                 scale_grad_by_freq, mode, per_sample_weights, padding_idx=-1):
    return _embedding_bag_weight_grad(grad, indices, offset2bag, bag_size, maximum_indices, num_weights,
                                      scale_grad_by_freq, mode, per_sample_weights, padding_idx)


def _offset2bag(offset2bag, indices, offsets, bags):
    """torch CPU's fast sum path leaves offset2bag empty (its backward then
    rebuilds it from the offsets): do the same."""
    if offset2bag.shape[0] == indices.shape[0]:
        return offset2bag
    return _bags(indices, offsets, offsets.shape[0] == bags + 1)[0]


@lowering("aten::_embedding_bag_backward")
def embedding_bag_backward(grad, indices, offsets, offset2bag, bag_size, maximum_indices, num_weights,
                           scale_grad_by_freq, mode, sparse, per_sample_weights, padding_idx=-1):
    offset2bag = _offset2bag(offset2bag, indices, offsets, grad.shape[0])
    if sparse:
        raise NotImplementedError("embedding_bag(sparse=True): sparse gradients are not supported on this device; "
                                  "use sparse=False")
    return _embedding_bag_weight_grad(grad, indices, offset2bag, bag_size, maximum_indices, num_weights,
                                      scale_grad_by_freq, mode, per_sample_weights, padding_idx)


@lowering("aten::_embedding_bag_per_sample_weights_backward")
def embedding_bag_per_sample_weights_backward(grad, weight, indices, offsets, offset2bag, mode, padding_idx=-1):
    offset2bag = _offset2bag(offset2bag, indices, offsets, grad.shape[0])
    rows = jnp.take(weight, indices, axis=0, mode="clip")
    out = jnp.sum(rows * jnp.take(grad, offset2bag, axis=0, mode="fill", fill_value=0), axis=1)
    return jnp.where(indices != padding_idx, out, 0) if padding_idx >= 0 else out


# -------------------------------------------------------------- segment_reduce


def _segment_reduce_one(data, starts, ends, reduce, initial):
    """data [N, ...] reduced over the segments [starts[s], ends[s]) -> [S, ...]."""
    count = starts.shape[0]
    seg = _segment_ids(starts, ends, data.shape[0])
    lengths = (ends - starts)
    lengths = lengths.reshape(lengths.shape + (1,) * (data.ndim - 1))
    empty = lengths == 0
    if reduce in ("max", "min"):
        fn = jax.ops.segment_max if reduce == "max" else jax.ops.segment_min
        out = fn(data, seg, count)
        if initial is not None:
            out = (jnp.maximum if reduce == "max" else jnp.minimum)(out, jnp.asarray(initial, data.dtype))
        if jnp.issubdtype(data.dtype, jnp.floating):  # NaN wins, as in torch's kernel
            nan = jax.ops.segment_max(jnp.isnan(data).astype(jnp.int8), seg, count) > 0
            out = jnp.where(nan, jnp.nan, out).astype(data.dtype)
        return out
    if reduce == "prod":
        out = jax.ops.segment_prod(data, seg, count)
        return out * (initial if initial is not None else 1)
    total = jax.ops.segment_sum(data, seg, count) + (initial if initial is not None else 0)
    if reduce == "sum":
        return total
    # mean: (initial + sum) / length; an empty segment is initial, or NaN without one
    mean = total / jnp.maximum(lengths, 1).astype(total.dtype)
    return jnp.where(empty, jnp.asarray(initial if initial is not None else jnp.nan, total.dtype), mean)


def _per_segment_row(one, tensors, lengths, offsets, axis):
    """``one(*tensors, offsets)`` for each row of the boundaries: segment
    reduction runs along ``axis``, and the boundaries' leading dims (torch
    allows a batch of them) are shared by the tensors; lengths become offsets."""
    if offsets is None:
        ends = jnp.cumsum(lengths, axis=-1)
        offsets = jnp.concatenate([jnp.zeros(ends.shape[:-1] + (1,), ends.dtype), ends], axis=-1)
    batch = offsets.ndim - 1
    axis = canonical_dim(axis, tensors[0].ndim)
    fn = one
    for _ in range(batch):
        fn = jax.vmap(fn)
    moved = [jnp.moveaxis(t, axis, batch) for t in tensors]
    return jnp.moveaxis(fn(*moved, offsets), batch, axis)


@lowering("aten::segment_reduce")
def segment_reduce(data, reduce, *, lengths=None, indices=None, offsets=None, axis=0, unsafe=False, initial=None):
    if indices is not None:
        raise NotImplementedError("segment_reduce(indices=...) is not implemented by torch either; pass lengths or "
                                  "offsets")
    return _per_segment_row(lambda d, o: _segment_reduce_one(d, o[:-1], o[1:], reduce, initial), [data],
                            lengths, offsets, axis)


@lowering("aten::_segment_reduce_backward")
def segment_reduce_backward(grad, output, data, reduce, *, lengths=None, offsets=None, axis=0, initial=None):
    """The gradient torch's kernel gives: max / min split it evenly among the
    elements equal to the result; prod divides the product by each element."""

    def one(g, out, d, o):
        starts, ends = o[:-1], o[1:]
        count = starts.shape[0]
        seg = _segment_ids(starts, ends, d.shape[0])
        spread = lambda v: jnp.take(v, seg, axis=0, mode="fill", fill_value=0)  # noqa: E731
        inside = (seg < count).reshape((-1,) + (1,) * (d.ndim - 1))
        if reduce == "sum":
            return jnp.where(inside, spread(g), 0)
        if reduce == "mean":
            length = (ends - starts).reshape((-1,) + (1,) * (d.ndim - 1))
            return jnp.where(inside, spread(g / jnp.maximum(length, 1).astype(g.dtype)), 0)
        if reduce in ("max", "min"):
            hit = inside & (d == spread(out))
            ties = jax.ops.segment_sum(hit.astype(g.dtype), seg, count)
            return jnp.where(hit, spread(g / jnp.maximum(ties, 1)), 0)
        # prod: out / x where x != 0; with zeros, the product of the others
        zero = d == 0
        zeros = jax.ops.segment_sum(zero.astype(jnp.int32), seg, count)
        others = jax.ops.segment_prod(jnp.where(zero, 1, d), seg, count)
        value = jnp.where(zero, jnp.where(spread(zeros) == 1, spread(others), 0),
                          spread(out) / jnp.where(zero, 1, d))
        return jnp.where(inside, spread(g) * value, 0)

    return _per_segment_row(one, [grad, output, data], lengths, offsets, axis)


# -------------------------------------------------------------------- CTC loss


def _ctc_targets(targets, target_lengths, batch):
    """Targets as [N, S] padded rows, from either of torch's layouts: padded
    [N, S], or all sequences concatenated (1-d), split by ``target_lengths``."""
    if targets.ndim == 2:
        return targets
    total = targets.shape[0]
    starts = jnp.cumsum(target_lengths) - target_lengths
    pos = starts[:, None] + jnp.arange(max(total, 1))[None, :]
    return jnp.take(targets, jnp.clip(pos, 0, max(total - 1, 0)), mode="clip").reshape(batch, -1) \
        if total else jnp.zeros((batch, 1), targets.dtype)


def _logsumexp(stacked):
    """log(sum(exp(.))) over axis 0, -inf where every term is -inf, with
    finite gradients there too (the untaken branch is kept finite)."""
    top = jnp.max(stacked, axis=0)
    finite = jnp.isfinite(top)
    safe = jnp.where(finite, top, 0)
    total = jnp.sum(jnp.exp(jnp.where(finite, stacked - safe, -jnp.inf)), axis=0)
    return jnp.where(finite, safe + jnp.log(jnp.where(finite, total, 1)), -jnp.inf)


def _ctc_alpha(log_probs, targets, input_lengths, target_lengths, blank):
    """(negative log likelihood [N], log_alpha [N, T, 2S+1]) by the forward
    recursion over the label sequence with blanks between and around."""
    big_t, batch, _ = log_probs.shape
    padded = _ctc_targets(targets, target_lengths, batch).astype(jnp.int64)
    s = padded.shape[1]
    width = 2 * s + 1
    ext = jnp.full((batch, width), blank, jnp.int64).at[:, 1::2].set(padded)
    # a label may be reached from two back when it is not blank and differs from it
    skip = jnp.concatenate([jnp.zeros((batch, 2), bool), (ext[:, 2:] != blank) & (ext[:, 2:] != ext[:, :-2])], 1)
    neg_inf = jnp.asarray(-jnp.inf, log_probs.dtype)
    lp = jnp.take_along_axis(jnp.moveaxis(log_probs, 1, 0), ext[:, None, :], axis=2)  # [N, T, W]
    first = jnp.where(jnp.arange(width)[None, :] < jnp.minimum(2, 2 * target_lengths[:, None] + 1), lp[:, 0], neg_inf)

    def step(alpha, xs):
        t, lp_t = xs
        prev1 = jnp.concatenate([jnp.full((batch, 1), neg_inf), alpha[:, :-1]], 1)
        prev2 = jnp.concatenate([jnp.full((batch, 2), neg_inf), alpha[:, :-2]], 1)
        new = _logsumexp(jnp.stack([alpha, prev1, jnp.where(skip, prev2, neg_inf)])) + lp_t
        new = jnp.where((t < input_lengths)[:, None], new, neg_inf)
        return new, new

    _, rest = jax.lax.scan(step, first, (jnp.arange(1, big_t), jnp.moveaxis(lp[:, 1:], 1, 0)))
    log_alpha = jnp.concatenate([first[:, None], jnp.moveaxis(rest, 0, 1)], 1)  # [N, T, W]
    last = jnp.take_along_axis(log_alpha, jnp.clip(input_lengths - 1, 0, big_t - 1)[:, None, None], axis=1)[:, 0]
    end = 2 * target_lengths
    a = jnp.take_along_axis(last, end[:, None], axis=1)[:, 0]
    b = jnp.where(end > 0, jnp.take_along_axis(last, jnp.maximum(end - 1, 0)[:, None], axis=1)[:, 0], neg_inf)
    return -_logsumexp(jnp.stack([a, b])), log_alpha


def _ctc_lengths(v):
    return jnp.asarray(np.asarray(v) if isinstance(v, (list, tuple)) else v).astype(jnp.int64)


@lowering("aten::_ctc_loss", "aten::_ctc_loss.Tensor")
def ctc_loss(log_probs, targets, input_lengths, target_lengths, blank=0, zero_infinity=False):
    """(per-sequence loss, log_alpha) as torch's ``_ctc_loss``: an impossible
    alignment is inf even under ``zero_infinity`` -- torch's composite
    ``ctc_loss`` around it zeroes it and reduces over the batch."""
    return _ctc_alpha(log_probs, targets, _ctc_lengths(input_lengths), _ctc_lengths(target_lengths), blank)


@lowering("aten::_ctc_loss_backward", "aten::_ctc_loss_backward.Tensor")
def ctc_loss_backward(grad, log_probs, targets, input_lengths, target_lengths, neg_log_likelihood, log_alpha, blank,
                      zero_infinity=False):
    """torch's kernel's gradient: ``exp(log_probs) * grad`` minus the label
    occupancies, for t below each input length (zero after).  That is the
    gradient with respect to the *logits* under a log_softmax (whose own
    backward then passes it through unchanged), not the derivative by
    ``log_probs`` alone; torch's users and its gradcheck rely on it, so the
    occupancies come from reverse mode through the forward recursion and
    the ``exp`` term is added."""
    inputs, labels = _ctc_lengths(input_lengths), _ctc_lengths(target_lengths)

    def loss(lp):
        nll, _ = _ctc_alpha(lp, targets, inputs, labels, blank)
        return nll

    nll, pullback = jax.vjp(loss, log_probs)
    g = grad.astype(log_probs.dtype)
    if zero_infinity:
        g = jnp.where(jnp.isinf(nll), 0, g)
    live = (jnp.arange(log_probs.shape[0])[:, None] < inputs[None, :])[..., None]
    out = pullback(g)[0] + jnp.where(live, jnp.exp(log_probs) * g[None, :, None], 0)
    return jnp.where(jnp.isnan(out), 0, out) if zero_infinity else out
