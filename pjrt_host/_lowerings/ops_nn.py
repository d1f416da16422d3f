"""Neural-network lowerings: matrix products, convolution, normalisation,
embedding, losses, pooling, resampling, attention, and the backward ops the
autograd engine asks for.

A backward op is the vector-Jacobian product of its forward lowering
(``jax.vjp``) wherever that is the same math, so forward and backward
cannot drift apart; closed forms are used where torch's gradient is not the
plain derivative (max-pool indices, embedding's padding_idx / frequency
scaling).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from . import lowering
from ._invoke import REDUCED_FLOATS, current_context
from ._util import as_stored, cast, draw, index_of_max, logical_elements, promote, take, torch_dtype_of

def _accumulate(*xs):
    """float32 for 16-bit float operands: the matmul family keeps them
    16-bit (the fast path of every accelerator) and accumulates in float32,
    rounding once at the end, as torch does on CPU and CUDA."""
    return jnp.float32 if any(x.dtype in REDUCED_FLOATS for x in xs) else None


def _matmul(a, b):
    """Matrix product.  Its float precision is the device configuration's
    (``jax.default_matmul_precision``, set by the dispatcher), not fixed here."""
    if a.dtype == jnp.bool_:
        return jnp.matmul(a.astype(jnp.int64), b.astype(jnp.int64)).astype(jnp.bool_)
    wide = _accumulate(a, b)
    if wide is not None and current_context().widen_16bit_matmul_operands:
        # the plugin's compiler refuses 16-bit x 16-bit = float32 dots
        # (XLA:CPU inside larger programs: a padded backward under bf16
        # autocast): the same values, the operands widened first
        return jnp.matmul(a.astype(wide), b.astype(wide))
    return jnp.matmul(a, b, preferred_element_type=wide)


def _scaled(x, factor):
    return x if factor == 1 else x * cast(factor, torch_dtype_of(x))


def _beta_input(x, beta):
    # beta == 0 ignores the input entirely (NaN and inf included), as torch documents.
    return jnp.zeros_like(x) if beta == 0 else _scaled(x, beta)


# ------------------------------------------------------------ matrix products


@lowering("aten::_grouped_mm")
def grouped_mm(a, b, offs=None, bias=None, out_dtype=None):
    """torch's grouped matrix product (``torch._grouped_mm``, what
    transformers' mixture-of-experts layers call off the CPU), in its four
    forms; ``offs`` holds each group's end along the dim it splits:

    - 2-d x 3-d: the rows of ``a`` in groups, group g times ``b[g]``
      (rows past the last end: zeros);
    - 2-d x 2-d: the contraction dim in groups, one product per group (its
      backward's weight gradient);
    - 3-d x 2-d: the columns of ``b`` in groups, ``a[g]`` times group g;
    - 3-d x 3-d: one product per group (no ``offs``).

    Static shapes: each form computes every group's product over masked
    operands (a group's elements zero elsewhere) and adds them, G times the
    work of the grouped kernel and no data-dependent shape."""
    if bias is not None:
        raise NotImplementedError("pjrt_host: torch._grouped_mm with bias= has no lowering (torch's own kernels "
                                  "take none either); add the bias after the product")
    if a.ndim == 3 and b.ndim == 3:
        out = _matmul(a, b)
    else:
        if offs is None:
            raise RuntimeError("grouped gemm 2D inputs require offsets")  # torch's text
        ends = offs.astype(jnp.int32)
        starts = jnp.concatenate([jnp.zeros((1,), jnp.int32), ends[:-1]])

        def member(n):  # [G, n]: whether position i of a split dim of n lies in group g
            i = jnp.arange(n, dtype=jnp.int32)[None, :]
            return (i >= starts[:, None]) & (i < ends[:, None])

        zero = jnp.zeros((), a.dtype)
        if a.ndim == 2 and b.ndim == 3:  # rows in groups
            rows = member(a.shape[0])
            out = _matmul(jnp.where(rows[:, :, None], a[None], zero), b).sum(0)
        elif a.ndim == 2 and b.ndim == 2:  # the contraction dim in groups
            inner = member(a.shape[1])
            out = _matmul(jnp.where(inner[:, None, :], a[None], zero), b)
        elif a.ndim == 3 and b.ndim == 2:  # the columns of b in groups
            cols = member(b.shape[1])
            products = _matmul(a, b)
            out = jnp.where(cols[:, None, :], products, jnp.zeros((), products.dtype)).sum(0)
        else:
            raise RuntimeError(f"grouped gemm takes 2-d or 3-d inputs, got {a.ndim}-d and {b.ndim}-d")
    return out.astype(a.dtype) if out_dtype is None else cast(out, out_dtype)


@lowering("aten::mm", "aten::bmm", "aten::matmul", "aten::mv", "aten::dot", opmath=False)
def mm(a, b):
    return _matmul(a, b)


@lowering("aten::inner")
def inner(a, b):
    return jnp.inner(a, b)


@lowering("aten::vdot")
def vdot(a, b):
    return _matmul(jnp.conj(a), b)


@lowering("aten::outer", "aten::ger")
def outer(a, b):
    _, (a, b) = promote(a, b)
    return a[:, None] * b[None, :]


def _widened(x, a, b):
    acc = _accumulate(x, a, b)
    return x if acc is None else x.astype(acc)


@lowering("aten::addmm", "aten::addmv", "aten::baddbmm", opmath=False)
def addmm(x, a, b, *, beta=1, alpha=1):
    return _beta_input(_widened(x, a, b), beta) + _scaled(_matmul(a, b), alpha)


@lowering("aten::addbmm", opmath=False)
def addbmm(x, a, b, *, beta=1, alpha=1):
    acc = _accumulate(x, a, b)
    if acc is None or a.shape[0] == 0:
        return _beta_input(_widened(x, a, b), beta) + _scaled(jnp.sum(_matmul(a, b), axis=0), alpha)
    # 16-bit: torch adds one batch's product at a time into the 16-bit
    # result (beta * x kept in float32 until the first), rounding each time.
    out_dtype = jnp.result_type(x.dtype, a.dtype, b.dtype)
    start = jnp.broadcast_to(_beta_input(x.astype(acc), beta), (a.shape[1], b.shape[2]))

    def step(carry, ab):
        return (carry.astype(acc) + _scaled(_matmul(*ab), alpha)).astype(out_dtype), None

    first = step(start, (a[0], b[0]))[0]
    return jax.lax.scan(step, first, (a[1:], b[1:]))[0]


@lowering("aten::addr")
def addr(x, a, b, *, beta=1, alpha=1):
    product = outer(a, b)
    if x.dtype == jnp.bool_:
        return (x & (beta != 0)) | (product & (alpha != 0))
    return _beta_input(x, beta) + _scaled(product, alpha)


@lowering("aten::linear", opmath=False)
def linear(x, weight, bias=None):
    out = _matmul(x, weight.T)
    return out if bias is None else out + bias.astype(out.dtype)


@lowering("aten::_cdist_forward")
def cdist(x1, x2, p, compute_mode=None):
    diff = jnp.abs(x1[..., :, None, :] - x2[..., None, :, :])
    if p == 0:
        return jnp.sum(diff != 0, axis=-1).astype(x1.dtype)
    if p == float("inf"):
        return jnp.max(diff, axis=-1)
    if p == 2:
        return jnp.sqrt(jnp.sum(diff * diff, axis=-1))
    return jnp.sum(diff**p, axis=-1) ** (1 / p)


def _cdist_grad_terms(grad, x1, x2, p, dist):
    """d dist[i, j] / d x1[i] times grad[i, j], per (i, j, k), in torch's
    closed forms (Distance.cpp): zero where the distance is zero (jax's
    derivative of the norm there is NaN)."""
    diff = x1[..., :, None, :] - x2[..., None, :, :]
    g, d = grad[..., None], dist[..., None]
    zero = jnp.zeros((), diff.dtype)
    safe = jnp.where(d == 0, jnp.ones((), d.dtype), d)
    if p == 0:
        return jnp.zeros_like(diff * g)
    if p == 1:
        return jnp.sign(diff) * g
    if p == float("inf"):
        return jnp.sign(diff) * (jnp.abs(diff) == d) * g
    if p == 2:
        return jnp.where(d == 0, zero, g * diff / safe)
    if p < 2:
        small = (d == 0) | ((diff == 0) & (p < 1))
        return jnp.where(small, zero,
                         jnp.sign(diff) * jnp.abs(diff) ** (p - 1) * g / safe ** (p - 1))
    return jnp.where(d == 0, zero, diff * jnp.abs(diff) ** (p - 2) * g / safe ** (p - 1))


@lowering("aten::_cdist_backward")
def cdist_backward(grad, x1, x2, p, dist):
    """x1's gradient (autograd asks again with x1 and x2 swapped for x2's);
    torch has no decomposition, so torch.cdist could not train."""
    # batch dims broadcast against x2's stay broadcast, as torch's kernel
    # gives them (autograd sums them back to x1's shape)
    return jnp.sum(_cdist_grad_terms(grad, x1, x2, p, dist), axis=-2).astype(x1.dtype)


# ---------------------------------------------------------------- convolution


def _spatial_spec(n):
    letters = "DHW"[-n:] if n <= 3 else None
    return ("NC" + letters, "OI" + letters, "NC" + letters)


def _as_matmul(x, weight, stride, padding, dilation, groups) -> bool:
    """Whether the plugin asks for this convolution as patches x kernel
    (``conv_as_matmul_max_positions``): 2-d, ungrouped, an output of at most
    that many positions per image."""
    limit = current_context().conv_as_matmul_max_positions
    if not limit or groups != 1 or weight.ndim != 4 or x.ndim != 4:
        return False
    out = [(size + 2 * p - d * (k - 1) - 1) // s + 1
           for size, k, s, p, d in zip(x.shape[2:], weight.shape[2:], stride, padding, dilation)]
    return 0 < out[0] * out[1] <= limit and weight.shape[2] * weight.shape[3] > 1


def _conv2d_as_matmul(x, weight, stride, padding, dilation):
    """A 2-d convolution as one matmul: the kernel's taps gather shifted,
    strided views of the padded input into patches (N, C*kh*kw, positions),
    which the kernel (O, C*kh*kw) multiplies.  Its gradient is the same
    shape of computation (slices and a matmul)."""
    n, c, h, w = x.shape
    o, _, kh, kw = weight.shape
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    ho = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    wo = (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    xp = jnp.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    taps = [jax.lax.slice(xp, (0, 0, i * dh, j * dw), (n, c, i * dh + sh * (ho - 1) + 1, j * dw + sw * (wo - 1) + 1),
                          (1, 1, sh, sw))
            for i in range(kh) for j in range(kw)]
    patches = jnp.stack(taps, axis=2).reshape(n, c * kh * kw, ho * wo)
    out = jnp.einsum("ok,nkp->nop", weight.reshape(o, c * kh * kw), patches,
                     preferred_element_type=_accumulate(x, weight))
    return out.reshape(n, o, ho, wo)


def _check_convolution(x, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    """torch's refusals of a convolution's parameters and shapes, in its
    order and words (ATen's check_shape_forward: its meta kernel checks
    none of them, and jax's would name jax's arguments)."""
    if any(s <= 0 for s in stride):
        raise RuntimeError("non-positive stride is not supported")
    if any(p < 0 for p in padding):
        raise RuntimeError("negative padding is not supported")
    if any(p < 0 for p in output_padding):
        raise RuntimeError("negative output_padding is not supported")
    if any(d <= 0 for d in dilation):
        raise RuntimeError(f"dilation should be greater than zero, but got {list(dilation)}")
    if groups <= 0:
        raise RuntimeError("non-positive groups is not supported")
    w = list(weight.shape)
    if w[0] < groups:
        raise RuntimeError(f"Given groups={groups}, expected weight to be at least {groups} at dimension 0, but got "
                           f"weight of size {w} instead")
    if w[0] % groups:
        raise RuntimeError(f"Given groups={groups}, expected weight to be divisible by {groups} at dimension 0, but "
                           f"got weight of size {w} instead")
    channels, outputs = (w[0], w[1] * groups) if transposed else (w[1] * groups, w[0])
    if x.ndim != weight.ndim or x.shape[1] != channels:
        given = f"Given transposed=1, weight of size {w}" if transposed else \
            f"Given groups={groups}, weight of size {w}"
        raise RuntimeError(f"{given}, expected input{list(x.shape)} to have {channels} channels, but got "
                           f"{x.shape[1] if x.ndim > 1 else 0} channels instead")
    if bias is not None and (bias.ndim != 1 or bias.shape[0] != outputs):
        given = f"Given transposed=1, weight of size {w}" if transposed else f"Given weight of size {w}"
        raise RuntimeError(f"{given}, expected bias to be 1-dimensional with {outputs} elements, but got bias of "
                           f"size {list(bias.shape)} instead")
    if transposed and any(p >= s and p >= d for p, s, d in zip(output_padding, stride, dilation)):
        names = ("depth", "height", "width")[-len(stride):]
        raise RuntimeError("output padding must be smaller than either stride or dilation, but got " + " ".join(
            [f"output_padding_{k}: {v}" for k, v in zip(names, output_padding)]
            + [f"stride_{k}: {v}" for k, v in zip(names, stride)]
            + [f"dilation_{k}: {v}" for k, v in zip(names, dilation)]))


@lowering("aten::convolution", "aten::_convolution", opmath=False)
def convolution(x, weight, bias, stride, padding, dilation, transposed, output_padding, groups, *_flags):
    n = weight.ndim - 2
    stride, padding, dilation = (list(v) * n if len(v) == 1 else list(v) for v in (stride, padding, dilation))
    output_padding = list(output_padding) * n if len(output_padding) == 1 else list(output_padding)
    _check_convolution(x, weight, bias, stride, padding, dilation, transposed, output_padding, groups)
    if not transposed and _as_matmul(x, weight, stride, padding, dilation, groups):
        out = _conv2d_as_matmul(x, weight, stride, padding, dilation)
    elif not transposed:
        out = jax.lax.conv_general_dilated(
            x, weight, window_strides=stride, padding=[(p, p) for p in padding], rhs_dilation=dilation,
            dimension_numbers=_spatial_spec(n), feature_group_count=groups,
            preferred_element_type=_accumulate(x, weight))
    else:
        # A transposed convolution is the convolution of the stride-dilated
        # input with the spatially flipped kernel, in and out channels swapped.
        c_in, c_out_g = weight.shape[:2]
        k = weight.shape[2:]
        w = weight.reshape((groups, c_in // groups, c_out_g) + k)
        w = jnp.swapaxes(w, 1, 2).reshape((groups * c_out_g, c_in // groups) + k)
        w = jnp.flip(w, tuple(range(2, 2 + n)))
        pads = [(d * (kk - 1) - p, d * (kk - 1) - p + op) for kk, p, d, op in zip(k, padding, dilation, output_padding)]
        out = jax.lax.conv_general_dilated(
            x, w, window_strides=[1] * n, padding=pads, lhs_dilation=stride, rhs_dilation=dilation,
            dimension_numbers=_spatial_spec(n), feature_group_count=groups,
            preferred_element_type=_accumulate(x, w))
    if bias is not None:
        out = out + bias.reshape((1, -1) + (1,) * n).astype(out.dtype)
    return out


@lowering("aten::convolution_backward", opmath=False)
def convolution_backward(grad_output, x, weight, bias_sizes, stride, padding, dilation, transposed,
                         output_padding, groups, output_mask):
    def forward(x_, w_):
        return convolution(x_, w_, None, stride, padding, dilation, transposed, output_padding, groups)

    out, pullback = jax.vjp(forward, x, weight)
    grad_x, grad_w = pullback(grad_output.astype(out.dtype))
    acc = _accumulate(grad_output)
    grad_b = jnp.sum(grad_output, axis=(0,) + tuple(range(2, grad_output.ndim)), dtype=acc) \
        if output_mask[2] else None
    return (grad_x if output_mask[0] else None, grad_w if output_mask[1] else None, grad_b)


# ----------------------------------------------------------- normalisation


def _layer_norm(x, normalized_shape, weight, bias, eps):
    axes = tuple(range(x.ndim - len(normalized_shape), x.ndim))
    mean = jnp.mean(x, axis=axes, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=axes, keepdims=True)
    rstd = jax.lax.rsqrt(var + eps)
    out = (x - mean) * rstd
    if weight is not None:
        out = out * weight
    if bias is not None:
        out = out + bias
    return out, mean, rstd


@lowering("aten::native_layer_norm")
def native_layer_norm(x, normalized_shape, weight, bias, eps):
    return _layer_norm(x, normalized_shape, weight, bias, eps)


@lowering("aten::native_layer_norm_backward")
def native_layer_norm_backward(grad_out, x, normalized_shape, mean, rstd, weight, bias, output_mask):
    _, pullback = jax.vjp(lambda x_, w_, b_: _ln_with_stats(x_, w_, b_, normalized_shape, mean, rstd), x,
                          weight if weight is not None else jnp.ones(tuple(normalized_shape), x.dtype),
                          bias if bias is not None else jnp.zeros(tuple(normalized_shape), x.dtype))
    gx, gw, gb = pullback(grad_out)
    return (gx if output_mask[0] else None, gw if output_mask[1] and weight is not None else None,
            gb if output_mask[2] and bias is not None else None)


def _ln_with_stats(x, weight, bias, normalized_shape, mean, rstd):
    """Layer norm whose gradient flows through the statistics too, with the
    saved rstd's eps: var is rebuilt as 1/rstd^2 - var(x) + var(x)."""
    axes = tuple(range(x.ndim - len(normalized_shape), x.ndim))
    m = jnp.mean(x, axis=axes, keepdims=True)
    v = jnp.mean(jnp.square(x - m), axis=axes, keepdims=True)
    eps = jax.lax.stop_gradient(1 / jnp.square(rstd) - v)
    return (x - m) * jax.lax.rsqrt(v + eps) * weight + bias


def _batch_stats(x, inside=None):
    """Per channel the mean and (biased) variance over the batch and the
    spatial dims, and how many elements they are of; ``inside``: the mask
    of ``x``'s logical elements where it is read padded along its batch
    (dynamic dimensions), whose padding then counts for nothing."""
    axes = (0,) + tuple(range(2, x.ndim))
    if inside is None:
        mean = jnp.mean(x, axis=axes)
        var = jnp.mean(jnp.square(x - _channel(mean, x)), axis=axes)
        return mean, var, x.size // x.shape[1]
    n = _logical_count(inside)
    mean = jnp.sum(jnp.where(inside, x, 0), axis=axes) / n.astype(x.dtype)
    var = jnp.sum(jnp.where(inside, jnp.square(x - _channel(mean, x)), 0), axis=axes) / n.astype(x.dtype)
    return mean, var, n


def _logical_count(inside):
    """The logical elements of one channel of a batch-norm input read
    padded (``inside``: the mask of its logical elements)."""
    return jnp.sum(inside[:, 0], dtype=jnp.int32)


def _channel(v, x):
    return v.reshape((1, -1) + (1,) * (x.ndim - 2))


def _normalise(x, mean, invstd, weight, bias):
    out = (x - _channel(mean, x)) * _channel(invstd, x)
    if weight is not None:
        out = out * _channel(weight, x)
    if bias is not None:
        out = out + _channel(bias, x)
    return out


def _batch_norm(x, weight, bias, running_mean, running_var, training, momentum, eps):
    """(out, save_mean, save_invstd, new_running_mean, new_running_var)."""
    if training:
        mean, var, n = _batch_stats(x, logical_elements(0))
        # torch CPU stores 16-bit inputs' statistics in their dtype and
        # normalises with those rounded values.
        mean, invstd = as_stored(mean), as_stored(jax.lax.rsqrt(var + eps))
        new_mean = new_var = None
        if running_mean is not None:
            new_mean = (1 - momentum) * running_mean + momentum * mean.astype(running_mean.dtype)
        if running_var is not None:
            unbiased = var * (n / jnp.maximum(n - 1, 1) if type(n) is not int else n / max(n - 1, 1))
            new_var = (1 - momentum) * running_var + momentum * unbiased.astype(running_var.dtype)
        return _normalise(x, mean, invstd, weight, bias), mean, invstd, new_mean, new_var
    invstd = jax.lax.rsqrt(running_var + eps)
    out = _normalise(x, running_mean, invstd, weight, bias)
    empty = jnp.zeros((0,), x.dtype)
    return out, empty, empty, running_mean, running_var


@lowering("aten::native_batch_norm", "aten::_native_batch_norm_legit")
def native_batch_norm(x, weight, bias, running_mean, running_var, training, momentum, eps):
    """The normalised output and saved statistics.  These ops also update
    the running statistics in place, which a pure function cannot: the
    device writes them back from ``_native_batch_norm_legit_functional``."""
    return _batch_norm(x, weight, bias, running_mean, running_var, training, momentum, eps)[:3]


@lowering("aten::_native_batch_norm_legit_functional")
def native_batch_norm_functional(x, weight, bias, running_mean, running_var, training, momentum, eps):
    return _batch_norm(x, weight, bias, running_mean, running_var, training, momentum, eps)


@lowering("aten::_native_batch_norm_legit.no_stats")
def native_batch_norm_no_stats(x, weight, bias, training, momentum, eps):
    return _batch_norm(x, weight, bias, None, None, True, momentum, eps)[:3]


@lowering("aten::_native_batch_norm_legit_no_training")
def native_batch_norm_no_training(x, weight, bias, running_mean, running_var, momentum, eps):
    return _batch_norm(x, weight, bias, running_mean, running_var, False, momentum, eps)[:3]


@lowering("aten::native_batch_norm_backward")
def native_batch_norm_backward(grad_out, x, weight, running_mean, running_var, save_mean, save_invstd, train, eps,
                               output_mask):
    w = weight if weight is not None else jnp.ones(x.shape[1], x.dtype)
    if train and save_mean is not None and save_invstd is not None and save_mean.size == x.shape[1]:
        # torch's closed form from the saved statistics (no second pass over
        # x for its mean and variance): with xhat = (x - mean) * invstd,
        # dx = w * invstd / n * (n * g - sum(g) - xhat * sum(g * xhat)).
        axes = (0,) + tuple(range(2, x.ndim))
        inside = logical_elements(1)  # (read padded along the batch: its padding, and grad_out's, is zeros)
        n = x.size // x.shape[1] if inside is None else _logical_count(inside).astype(x.dtype)
        mean, invstd = save_mean.astype(x.dtype), save_invstd.astype(x.dtype)
        xhat = (x - _channel(mean, x)) * _channel(invstd, x)
        g = grad_out.astype(x.dtype)
        gb = jnp.sum(g, axis=axes)
        gw = jnp.sum(g * xhat, axis=axes)
        gx = _channel(w * invstd / n, x) * (n * g - _channel(gb, x) - xhat * _channel(gw, x))
        return (gx if output_mask[0] else None, gw if output_mask[1] else None, gb if output_mask[2] else None)
    if train:
        def forward(x_, w_):
            mean, var, _ = _batch_stats(x_, logical_elements(1))
            return _normalise(x_, mean, jax.lax.rsqrt(var + eps), w_, None)
    else:
        def forward(x_, w_):
            return _normalise(x_, running_mean, jax.lax.rsqrt(running_var + eps), w_, None)
    _, pullback = jax.vjp(forward, x, w)
    gx, gw = pullback(grad_out)
    gb = jnp.sum(grad_out, axis=(0,) + tuple(range(2, x.ndim)))
    return (gx if output_mask[0] else None, gw if output_mask[1] else None, gb if output_mask[2] else None)


@lowering("aten::batch_norm_backward")
def batch_norm_backward(grad_out, x, weight, running_mean, running_var, save_mean, save_var, update, eps,
                        output_mask, reserve):
    return native_batch_norm_backward(grad_out, x, weight, running_mean, running_var, save_mean, save_var,
                                      update, eps, output_mask)


def _group_norm(x, weight, bias, n, c, group, eps):
    grouped = x.reshape(n, group, math.prod(x.shape[1:]) // group)  # not -1: n may be 0
    mean = jnp.mean(grouped, axis=-1)
    var = jnp.mean(jnp.square(grouped - mean[..., None]), axis=-1)
    rstd = jax.lax.rsqrt(var + eps)
    out = ((grouped - mean[..., None]) * rstd[..., None]).reshape(x.shape)
    if weight is not None:
        out = out * _channel(weight, x)
    if bias is not None:
        out = out + _channel(bias, x)
    return out, mean, rstd


@lowering("aten::native_group_norm")
def native_group_norm(x, weight, bias, n, c, hxw, group, eps):
    return _group_norm(x, weight, bias, n, c, group, eps)


@lowering("aten::native_group_norm_backward")
def native_group_norm_backward(grad_out, x, mean, rstd, weight, n, c, hxw, group, output_mask):
    def forward(x_, w_):
        grouped = x_.reshape(n, group, -1)
        m = jnp.mean(grouped, axis=-1, keepdims=True)
        v = jnp.mean(jnp.square(grouped - m), axis=-1, keepdims=True)
        eps = jax.lax.stop_gradient(1 / jnp.square(rstd[..., None]) - v)
        out = ((grouped - m) * jax.lax.rsqrt(v + eps)).reshape(x_.shape)
        return out * _channel(w_, x_)

    w = weight if weight is not None else jnp.ones((c,), x.dtype)
    _, pullback = jax.vjp(forward, x, w)
    gx, gw = pullback(grad_out)
    gb = jnp.sum(grad_out, axis=(0,) + tuple(range(2, x.ndim)))
    return (gx if output_mask[0] else None, gw if output_mask[1] and weight is not None else None,
            gb if output_mask[2] and weight is not None else None)


def _weight_norm_axes(v, dim):
    # torch._weight_norm takes the fused op only for dim 0 or the last one;
    # the norm is over every other dimension, kept (g's shape)
    dim = dim % v.ndim if v.ndim else 0
    return tuple(i for i in range(v.ndim) if i != dim)


@lowering("aten::_weight_norm_interface")
def weight_norm_interface(v, g, dim=0):
    norm = jnp.sqrt(jnp.sum(jnp.square(v), axis=_weight_norm_axes(v, dim), keepdims=True))
    return v * (g / norm), norm


@lowering("aten::_weight_norm_interface_backward")
def weight_norm_interface_backward(grad_w, saved_v, saved_g, saved_norms, dim):
    """Closed form with the forward's saved norms, as torch's kernels: for
    w = v * g / |v|, dg = sum(dw * v) / |v| and
    dv = g / |v| * (dw - v * sum(dw * v) / |v|^2), sums over every dimension
    but ``dim``.  (The autograd engine asks for it whenever the backward
    itself is not differentiated; without it a weight-normed layer -- the
    positional convolution of wav2vec2 / HuBERT -- could not train.)"""
    dot = jnp.sum(grad_w * saved_v, axis=_weight_norm_axes(saved_v, dim), keepdims=True)
    grad_g = dot / saved_norms
    grad_v = (saved_g / saved_norms) * (grad_w - saved_v * (dot / jnp.square(saved_norms)))
    return grad_v, grad_g


# ------------------------------------------------------------------ embedding


@lowering("aten::embedding")
def embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    return take(weight, indices % weight.shape[0], axis=0)


@lowering("aten::embedding_dense_backward")
def embedding_dense_backward(grad_output, indices, num_weights, padding_idx, scale_grad_by_freq):
    flat = indices.reshape(-1)
    grad = grad_output.reshape(flat.shape[0], -1)
    if padding_idx >= 0:
        grad = jnp.where((flat == padding_idx)[:, None], 0, grad)
    if scale_grad_by_freq:
        counts = jnp.zeros((num_weights,), grad.dtype).at[flat].add(1)
        grad = grad / counts[flat][:, None]
    return jnp.zeros((num_weights, grad.shape[1]), grad_output.dtype).at[flat].add(grad)


# --------------------------------------------------------------------- losses

_NONE, _MEAN, _SUM = 0, 1, 2


def _reduce(loss, reduction):
    if reduction == _MEAN:
        return jnp.mean(loss)
    if reduction == _SUM:
        return jnp.sum(loss)
    return loss


def _nll(x, target, weight, reduction, ignore_index):
    """(loss, total_weight) with the class dimension at axis 1 (or 0 unbatched)."""
    class_axis = 0 if x.ndim == 1 else 1
    n_classes = x.shape[class_axis]
    valid = target != ignore_index
    safe = jnp.where(valid, target, 0)
    picked = -jnp.take_along_axis(x, jnp.expand_dims(safe, class_axis), axis=class_axis).squeeze(class_axis)
    w = jnp.ones((n_classes,), x.dtype) if weight is None else weight
    w = jnp.where(valid, w[safe], 0).astype(x.dtype)
    loss = picked * w
    total = jnp.sum(w)
    if reduction == _MEAN:
        return jnp.sum(loss) / total, total
    if reduction == _SUM:
        return jnp.sum(loss), total
    return loss, jnp.zeros((), x.dtype)


@lowering("aten::nll_loss_forward", "aten::nll_loss2d_forward")
def nll_loss_forward(x, target, weight, reduction, ignore_index):
    return _nll(x, target, weight, reduction, ignore_index)


@lowering("aten::nll_loss_backward", "aten::nll_loss2d_backward")
def nll_loss_backward(grad_output, x, target, weight, reduction, ignore_index, total_weight):
    class_axis = 0 if x.ndim == 1 else 1
    valid = target != ignore_index
    safe = jnp.where(valid, target, 0)
    w = jnp.ones((x.shape[class_axis],), x.dtype) if weight is None else weight
    w = jnp.where(valid, w[safe], 0).astype(x.dtype)
    g = -w * grad_output
    if reduction == _MEAN:
        g = g / total_weight
    onehot = jnp.expand_dims(safe, class_axis) == jnp.expand_dims(
        jnp.arange(x.shape[class_axis]).reshape((-1,) + (1,) * (x.ndim - class_axis - 1)), 0 if x.ndim > 1 else 0)
    if x.ndim == 1:
        onehot = safe == jnp.arange(x.shape[0])
    return jnp.where(onehot, jnp.expand_dims(g, class_axis) if x.ndim > 1 else g, 0).astype(x.dtype)


@lowering("aten::mse_loss")
def mse_loss(x, target, reduction=_MEAN):
    return _reduce(jnp.square(x - target), reduction)


@lowering("aten::mse_loss_backward")
def mse_loss_backward(grad_output, x, target, reduction):
    scale = 2 / x.size if reduction == _MEAN else 2
    return (scale * (x - target) * grad_output).astype(x.dtype)


@lowering("aten::l1_loss")
def l1_loss(x, target, reduction=_MEAN):
    return _reduce(jnp.abs(x - target), reduction)


def _smooth_l1(x, target, beta):
    d = jnp.abs(x - target)
    return d if beta == 0 else jnp.where(d < beta, 0.5 * d * d / beta, d - 0.5 * beta)


@lowering("aten::smooth_l1_loss")
def smooth_l1_loss(x, target, reduction=_MEAN, beta=1.0):
    return _reduce(_smooth_l1(x, target, beta), reduction)


@lowering("aten::smooth_l1_loss_backward")
def smooth_l1_loss_backward(grad_output, x, target, reduction, beta):
    _, pullback = jax.vjp(lambda x_: smooth_l1_loss(x_, target, reduction, beta), x)
    return pullback(grad_output.astype(x.dtype))[0]


def _huber(x, target, delta):
    d = jnp.abs(x - target)
    return jnp.where(d < delta, 0.5 * d * d, delta * (d - 0.5 * delta))


@lowering("aten::huber_loss")
def huber_loss(x, target, reduction=_MEAN, delta=1.0):
    return _reduce(_huber(x, target, delta), reduction)


@lowering("aten::huber_loss_backward")
def huber_loss_backward(grad_output, x, target, reduction, delta):
    _, pullback = jax.vjp(lambda x_: huber_loss(x_, target, reduction, delta), x)
    return pullback(grad_output.astype(x.dtype))[0]


@lowering("aten::binary_cross_entropy")
def binary_cross_entropy(x, target, weight=None, reduction=_MEAN):
    # torch clamps each log at -100 so that a 0 or 1 prediction stays finite.
    loss = -(target * jnp.maximum(jnp.log(x), -100) + (1 - target) * jnp.maximum(jnp.log1p(-x), -100))
    if weight is not None:
        loss = loss * weight
    return _reduce(loss, reduction)


@lowering("aten::binary_cross_entropy_backward")
def binary_cross_entropy_backward(grad_output, x, target, weight=None, reduction=_MEAN):
    g = grad_output * (x - target) / jnp.maximum((1 - x) * x, 1e-12)
    if weight is not None:
        g = g * weight
    if reduction == _MEAN:
        g = g / x.size
    return g.astype(x.dtype)


@lowering("aten::binary_cross_entropy_with_logits")
def binary_cross_entropy_with_logits(x, target, weight=None, pos_weight=None, reduction=_MEAN):
    softplus_neg = jnp.log1p(jnp.exp(-jnp.abs(x))) + jnp.maximum(-x, 0)  # log(1 + exp(-x)), stably
    if pos_weight is not None:
        loss = (1 - target) * x + ((pos_weight - 1) * target + 1) * softplus_neg
    else:
        loss = (1 - target) * x + softplus_neg
    if weight is not None:
        loss = loss * weight
    return _reduce(loss, reduction)


@lowering("aten::soft_margin_loss")
def soft_margin_loss(x, target, reduction=_MEAN):
    """As torch's kernel (the same on CPU and cuda): ``-x`` then multiplied
    by the target in place, so a target must broadcast to x's shape (a
    longer one is refused, where torch's meta kernel broadcasts) and a bool
    target is its truth."""
    shape = tuple(jnp.broadcast_shapes(x.shape, target.shape))
    if shape != tuple(x.shape):
        raise RuntimeError(f"output with shape {list(x.shape)} doesn't match the broadcast shape {list(shape)}")
    return _reduce(jnp.log1p(jnp.exp(-x * target)), reduction)


@lowering("aten::kl_div")
def kl_div(x, target, reduction=_MEAN, log_target=False):
    loss = jnp.exp(target) * (target - x) if log_target else jax.scipy.special.xlogy(target, target) - target * x
    return _reduce(loss, reduction)


# -------------------------------------------------------------------- pooling


def _tuple(v, n):
    v = list(v) if isinstance(v, (list, tuple)) else [v]
    return v * n if len(v) == 1 else v


def _pool_out_size(size, k, s, p, d, ceil_mode):
    out = (size + 2 * p - d * (k - 1) - 1 + (s - 1 if ceil_mode else 0)) // s + 1
    if ceil_mode and (out - 1) * s >= size + p:  # the last window must start inside the input or left padding
        out -= 1
    return out


def _window_pads(size, out, k, s, p, d):
    """(low, high) padding of one dim so that ``out`` windows fit (ceil mode
    may need more on the high side than ``p``)."""
    return p, max((out - 1) * s + d * (k - 1) + 1 - size - p, 0)


def _window_indices(size, k, s, p, d, ceil_mode):
    """(positions [out, k], valid [out, k]) of each window's taps along one dim."""
    out = _pool_out_size(size, k, s, p, d, ceil_mode)
    pos = np.arange(out)[:, None] * s - p + np.arange(k)[None, :] * d
    return pos, (pos >= 0) & (pos < size)


def _windows(x, taps):
    """Gather every pooling window: x [N?, C, *S] -> [..., *out, prod(k)],
    with the flat input index of each tap and whether it is inside."""
    lead = x.ndim - len(taps)
    spatial = x.shape[lead:]
    flat, valid = _tap_indices(taps, spatial)
    values = jnp.take(x.reshape(x.shape[:lead] + (math.prod(spatial),)), jnp.asarray(flat), axis=lead)
    return values, flat, valid


def _windows_by_slices(x, taps, k, s, p, d):
    """Every pooling window as the last axis, [..., *out, prod(k)], built
    from strided slices of the input padded with the dtype's lowest value
    (cheaper than gathering flat indices), and the flat input index of
    each tap (a constant)."""
    n = len(taps)
    lead = x.ndim - n
    spatial = x.shape[lead:]
    outs = [pos.shape[0] for pos, _ in taps]
    pads = [(0, 0)] * lead + [_window_pads(size, o, kk, ss, pp, dd)
                              for size, o, kk, ss, pp, dd in zip(spatial, outs, k, s, p, d)]
    xp = jnp.pad(x, pads, constant_values=jnp.asarray(_lowest(x.dtype), x.dtype))
    slices = []
    for offsets in np.ndindex(*k):
        start = [0] * lead + [o * dd for o, dd in zip(offsets, d)]
        limit = list(xp.shape[:lead]) + [st + ss * (o - 1) + 1 for st, ss, o in zip(start[lead:], s, outs)]
        slices.append(jax.lax.slice(xp, start, limit, [1] * lead + list(s)))
    return jnp.stack(slices, axis=-1), _tap_indices(taps, spatial)[0]


def _tap_indices(taps, spatial):
    """(flat input index [*out, prod(k)] of each window's taps, clipped into
    the input; whether each tap is inside it), numpy constants."""
    n = len(taps)
    outs = [pos.shape[0] for pos, _ in taps]
    ks = [pos.shape[1] for pos, _ in taps]
    flat = np.zeros(tuple(outs) + tuple(ks), np.int64)
    valid = np.ones(tuple(outs) + tuple(ks), bool)
    stride = 1
    for i in reversed(range(n)):
        pos, ok = taps[i]
        shape = [1] * (2 * n)
        shape[i], shape[n + i] = outs[i], ks[i]
        flat = flat + np.clip(pos, 0, spatial[i] - 1).reshape(shape) * stride
        valid = valid & ok.reshape(shape)
        stride *= spatial[i]
    return flat.reshape(tuple(outs) + (-1,)), valid.reshape(tuple(outs) + (-1,))


def _lowest(dtype):
    return -jnp.inf if jnp.issubdtype(dtype, jnp.floating) else jnp.iinfo(dtype).min


def _max_pool(x, kernel_size, stride, padding, dilation, ceil_mode, n):
    k = _tuple(kernel_size, n)
    s = _tuple(stride, n) if stride else k
    p, d = _tuple(padding, n), _tuple(dilation, n)
    taps = [_window_indices(x.shape[x.ndim - n + i], k[i], s[i], p[i], d[i], ceil_mode) for i in range(n)]
    values, flat = _windows_by_slices(x, taps, k, s, p, d)
    best = index_of_max(values, axis=-1)  # NaN wins, as in torch
    out = jnp.take_along_axis(values, best[..., None], axis=-1)[..., 0]
    index_map = jnp.broadcast_to(jnp.asarray(flat), values.shape)
    indices = jnp.take_along_axis(index_map, best[..., None], axis=-1)[..., 0]
    return out, indices.astype(jnp.int64)


def _max_pool_lowering(n):
    def lower(x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
        return _max_pool(x, kernel_size, stride, padding, dilation, ceil_mode, n)

    return lower


def _scatter_to_input(grad_output, x, indices, n):
    """Add each output gradient to the input element its index names."""
    lead_shape = x.shape[: x.ndim - n]
    # Explicit sizes: a -1 cannot be inferred for an empty batch.
    g = grad_output.reshape(lead_shape + (math.prod(grad_output.shape[len(lead_shape):]),))
    idx = indices.reshape(lead_shape + (math.prod(indices.shape[len(lead_shape):]),))
    grid = tuple(i[..., None] for i in np.indices(lead_shape, sparse=True))
    out = jnp.zeros(lead_shape + (int(np.prod(x.shape[x.ndim - n:])),), grad_output.dtype)
    return out.at[grid + (idx,)].add(g).reshape(x.shape)


def _max_pool_backward_lowering(n):
    def lower(grad_output, x, kernel_size, stride, padding, dilation, ceil_mode, indices):
        return _scatter_to_input(grad_output, x, indices, n)

    return lower


for _n in (1, 2, 3):
    lowering(f"aten::max_pool{_n}d_with_indices")(_max_pool_lowering(_n))
    lowering(f"aten::max_pool{_n}d_with_indices_backward")(_max_pool_backward_lowering(_n))


@lowering("aten::max_pool1d", "aten::max_pool2d", "aten::max_pool3d")
def max_pool(x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    n = len(kernel_size) if len(kernel_size) > 1 else None
    if n is None:  # a single size: the op's own rank decides, via the input
        n = max(x.ndim - 2, 1)
    k = _tuple(kernel_size, n)
    s = _tuple(stride, n) if stride else k
    p, d = _tuple(padding, n), _tuple(dilation, n)
    # The values alone (no indices): one reduce_window, not a gather of
    # every window (about 10x faster on XLA:CPU).
    lead = x.ndim - n
    pads = [(0, 0)] * lead
    for size, kk, ss, pp, dd in zip(x.shape[lead:], k, s, p, d):
        pads.append(_window_pads(size, _pool_out_size(size, kk, ss, pp, dd, ceil_mode), kk, ss, pp, dd))
    return jax.lax.reduce_window(x, jnp.asarray(_lowest(x.dtype), x.dtype), jax.lax.max, (1,) * lead + tuple(k),
                                 (1,) * lead + tuple(s), pads, window_dilation=(1,) * lead + tuple(d))


def _avg_pool(x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override, n):
    k = _tuple(kernel_size, n)
    s = _tuple(stride, n) if stride else k
    p = _tuple(padding, n)
    taps = [_window_indices(x.shape[x.ndim - n + i], k[i], s[i], p[i], 1, ceil_mode) for i in range(n)]
    values, _, valid = _windows(x, taps)
    total = jnp.sum(jnp.where(jnp.asarray(valid), values, 0), axis=-1)
    if divisor_override:
        return (total / divisor_override).astype(x.dtype)
    if count_include_pad:
        # Taps in the padding count; taps past it (ceil mode) do not.
        counts = np.ones(valid.shape[:-1], np.int64)
        for i, (pos, _) in enumerate(taps):
            size = x.shape[x.ndim - n + i]
            inside_padded = ((pos >= -p[i]) & (pos < size + p[i])).sum(axis=1)
            shape = [1] * n
            shape[i] = -1
            counts = counts * inside_padded.reshape(shape)
    else:
        counts = valid.sum(axis=-1)
    return (total / jnp.asarray(counts, x.dtype)).astype(x.dtype)


def _avg_pool_lowering(n):
    def lower(x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True, divisor_override=None):
        return _avg_pool(x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override, n)

    return lower


def _avg_pool_backward_lowering(n):
    def lower(grad_output, x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
        _, pullback = jax.vjp(lambda t: _avg_pool(t, kernel_size, stride, padding, ceil_mode, count_include_pad,
                                                  divisor_override, n), x)
        return pullback(grad_output)[0]

    return lower


for _n in (1, 2, 3):
    lowering(f"aten::avg_pool{_n}d")(_avg_pool_lowering(_n))
    lowering(f"aten::avg_pool{_n}d_backward")(_avg_pool_backward_lowering(_n))


def _adaptive_taps(size, out):
    start = (np.arange(out) * size) // out
    end = -((-(np.arange(out) + 1) * size) // out)
    k = int((end - start).max()) if out else 0
    pos = start[:, None] + np.arange(k)[None, :]
    return pos, pos < end[:, None]


def _adaptive_avg(x, output_size, n):
    out = x
    for i, o in enumerate(_tuple(output_size, n)):
        axis = x.ndim - n + i
        size = x.shape[axis]
        pos, ok = _adaptive_taps(size, o)
        matrix = np.zeros((o, size), np.float64)
        for r in range(o):
            matrix[r, pos[r][ok[r]]] = 1.0 / ok[r].sum()
        out = jnp.moveaxis(jnp.tensordot(out, jnp.asarray(matrix, x.dtype), axes=([axis], [1])),
                           -1, axis)
    return out


def _adaptive_max(x, output_size, n):
    taps = [_adaptive_taps(x.shape[x.ndim - n + i], o) for i, o in enumerate(_tuple(output_size, n))]
    values, flat, valid = _windows(x, taps)
    values = jnp.where(jnp.asarray(valid), values, jnp.asarray(_lowest(x.dtype), x.dtype))
    best = index_of_max(values, axis=-1)
    out = jnp.take_along_axis(values, best[..., None], axis=-1)[..., 0]
    indices = jnp.take_along_axis(jnp.broadcast_to(jnp.asarray(flat), values.shape), best[..., None], axis=-1)[..., 0]
    return out, indices.astype(jnp.int64)


for _n in (1, 2, 3):
    lowering(f"aten::_adaptive_avg_pool{_n}d", f"aten::adaptive_avg_pool{_n}d")(
        (lambda n: lambda x, output_size: _adaptive_avg(x, output_size, n))(_n))
    lowering(f"aten::_adaptive_avg_pool{_n}d_backward")(
        (lambda n: lambda grad_output, x: jax.vjp(
            lambda t: _adaptive_avg(t, grad_output.shape[-n:], n), x)[1](grad_output)[0])(_n))
    lowering(f"aten::adaptive_max_pool{_n}d")((lambda n: lambda x, output_size: _adaptive_max(x, output_size, n))(_n))
    lowering(f"aten::adaptive_max_pool{_n}d_backward")(
        (lambda n: lambda grad_output, x, indices: _scatter_to_input(grad_output, x, indices, n))(_n))


# ------------------------------------------------------------- resampling


def _source_scale(size, out, align_corners, scale):
    if align_corners:
        return (size - 1) / (out - 1) if out > 1 else 0.0
    return 1.0 / scale if scale is not None and scale > 0 else size / out


def _interp_matrix(size, out, mode, align_corners=False, scale=None):
    """[out, size] matrix mapping an input axis to the resampled axis."""
    m = np.zeros((out, size), np.float64)
    r = _source_scale(size, out, align_corners, scale)
    for o in range(out):
        if mode == "nearest":
            m[o, min(int(math.floor(o * r)), size - 1)] = 1
        elif mode == "nearest-exact":
            m[o, min(int(math.floor((o + 0.5) * r)), size - 1)] = 1
        else:  # linear
            src = o * r if align_corners else max((o + 0.5) * r - 0.5, 0.0)
            i0 = min(int(math.floor(src)), size - 1)
            i1 = min(i0 + 1, size - 1)
            lam = src - i0
            m[o, i0] += 1 - lam
            m[o, i1] += lam
    return m


def _resample(x, output_size, mode, align_corners, scales):
    n = len(output_size)
    for i, o in enumerate(output_size):
        axis = x.ndim - n + i
        scale = scales[i] if scales else None
        matrix = jnp.asarray(_interp_matrix(x.shape[axis], o, mode, align_corners, scale), x.dtype)
        x = jnp.moveaxis(jnp.tensordot(x, matrix, axes=([axis], [1])), -1, axis)
    return x


def _output_size(x, output_size, scale_factors, n):
    if output_size is not None:
        return list(output_size)
    return [int(math.floor(x.shape[x.ndim - n + i] * f)) for i, f in enumerate(scale_factors)]


def _resample_lowering(n, mode, linear):
    def lower(x, output_size, *rest):
        if linear:
            align_corners, scales = rest[0], [s for s in rest[1:]] if len(rest) > 1 else None
        else:
            align_corners, scales = False, [s for s in rest] if rest else None
        if scales is not None and len(scales) == 1 and isinstance(scales[0], (list, tuple)):  # .vec
            scales = list(scales[0])
        if output_size is None:
            size = _output_size(x, None, scales, n)
        else:
            size = list(output_size)
        return _resample(x, size, mode, align_corners, scales if scales and all(s is not None for s in scales)
                         else None)

    return lower


def _resample_backward_lowering(n, mode, linear):
    forward = _resample_lowering(n, mode, linear)

    def lower(grad_output, output_size, input_size, *rest):
        x = jnp.zeros(tuple(input_size), grad_output.dtype)
        _, pullback = jax.vjp(lambda t: forward(t, output_size, *rest), x)
        return pullback(grad_output)[0]

    return lower


for _n, _dims in ((1, "1d"), (2, "2d"), (3, "3d")):
    for _mode, _name in (("nearest", "upsample_nearest"), ("nearest-exact", "_upsample_nearest_exact")):
        lowering(f"aten::{_name}{_dims}", f"aten::{_name}{_dims}.vec")(_resample_lowering(_n, _mode, False))
        lowering(f"aten::{_name}{_dims}_backward")(_resample_backward_lowering(_n, _mode, False))
for _n, _name in ((1, "upsample_linear1d"), (2, "upsample_bilinear2d"), (3, "upsample_trilinear3d")):
    lowering(f"aten::{_name}", f"aten::{_name}.vec")(_resample_lowering(_n, "linear", True))
    lowering(f"aten::{_name}_backward")(_resample_backward_lowering(_n, "linear", True))


@lowering("aten::pixel_shuffle")
def pixel_shuffle(x, upscale_factor):
    r = upscale_factor
    *lead, c, h, w = x.shape
    x = x.reshape(tuple(lead) + (c // (r * r), r, r, h, w))
    k = len(lead)
    x = jnp.transpose(x, tuple(range(k)) + (k, k + 3, k + 1, k + 4, k + 2))
    return x.reshape(tuple(lead) + (c // (r * r), h * r, w * r))


@lowering("aten::pixel_unshuffle")
def pixel_unshuffle(x, downscale_factor):
    r = downscale_factor
    *lead, c, h, w = x.shape
    x = x.reshape(tuple(lead) + (c, h // r, r, w // r, r))
    k = len(lead)
    x = jnp.transpose(x, tuple(range(k)) + (k, k + 2, k + 4, k + 1, k + 3))
    return x.reshape(tuple(lead) + (c * r * r, h // r, w // r))


# ------------------------------------------------------------------ attention


def _attention_weights(query, key, attn_mask, is_causal, scale, enable_gqa=False, keys=None):
    """The scores; ``keys`` (the key's shape but its last dim), where the
    key is read padded: True at its logical positions, the others masked."""
    scale = 1 / math.sqrt(query.shape[-1]) if scale is None else scale
    if enable_gqa and key.shape[-3] != query.shape[-3]:
        repeat = query.shape[-3] // key.shape[-3]
        key = jnp.repeat(key, repeat, axis=-3)
        keys = None if keys is None else jnp.repeat(keys, repeat, axis=-2)
    scores = _matmul(query, jnp.swapaxes(key, -1, -2)) * scale
    L, S = query.shape[-2], key.shape[-2]
    if is_causal:
        scores = jnp.where(jnp.tril(jnp.ones((L, S), bool)), scores, -jnp.inf)
    if attn_mask is not None:
        scores = jnp.where(attn_mask, scores, -jnp.inf) if attn_mask.dtype == jnp.bool_ else scores + attn_mask
    if keys is not None:
        scores = jnp.where(keys[..., None, :], scores, -jnp.inf)
    return scores


@lowering("aten::scaled_dot_product_attention", "aten::_scaled_dot_product_attention_math", needs_rng=True)
def scaled_dot_product_attention(rng, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                                 dropout_mask=None, *, scale=None, enable_gqa=False):
    """Reached undecomposed in inference mode (autograd decomposes it
    otherwise), where dropout still applies as torch's math kernel applies
    it: to the attention weights, the kept ones scaled by 1 / (1 - p)."""
    keep = dropout_mask
    if dropout_p > 0 and keep is None:
        shape = query.shape[:-1] + (key.shape[-2],)
        keep = draw(lambda k, s: jax.random.bernoulli(k, 1 - dropout_p, s), rng, shape)
    return _attend(query, key, value, attn_mask, keep, dropout_p, is_causal, scale, enable_gqa)


def _attend(query, key, value, attn_mask, keep, dropout_p, is_causal, scale, enable_gqa, keys=None):
    """torch's math formulation of attention; dropout keeps the weights
    where ``keep`` holds, scaled by 1 / (1 - p)."""
    scores = _attention_weights(query, key, attn_mask, is_causal, scale, enable_gqa, keys)
    masked_rows = jnp.all(scores == -jnp.inf, axis=-1, keepdims=True)
    weights = jnp.where(masked_rows, 0, jax.nn.softmax(scores, axis=-1)).astype(query.dtype)
    if dropout_p > 0:
        weights = jnp.where(keep, weights / (1 - dropout_p), 0).astype(query.dtype)
    if enable_gqa and value.shape[-3] != query.shape[-3]:
        value = jnp.repeat(value, query.shape[-3] // value.shape[-3], axis=-3)
    return _matmul(weights, value)


@lowering("pjrt_host::attention")
def attention(query, key, value, attn_mask, keep, dropout_p, is_causal, scale, enable_gqa):
    """scaled_dot_product_attention as one op (``_boot._autograd_kernels``):
    the dropout mask drawn before, so that the backward sees it.  Over a
    key and value padded along their length (dynamic dimensions: a growing
    key/value cache), the key positions past the logical length are
    masked; the rule (``_dynamic_dims``) fills the padding with zeros."""
    return _attend(query, key, value, attn_mask, keep, dropout_p, is_causal, scale, enable_gqa,
                   _logical_keys(1))


@lowering("pjrt_host::attention_keep", needs_rng=True)
def attention_keep(rng, query, key, p):
    """Dropout's mask over attention's weights (the query's shape but its
    last dim, then the key's length): True with probability ``1 - p``, as
    ``bernoulli_`` draws it.  Over a padded query or key (dynamic
    dimensions; the rule keeps their head dims exact and every dim padded
    at its end) each logical element takes the value of its flat logical
    index in the exact draw, so a seed drops the same weights with buckets
    and without."""
    shape = tuple(query.shape[:-1]) + (key.shape[-2],)

    def make(k, s):
        return jax.random.bernoulli(k, 1 - p, s)

    inside_q, inside_k = logical_elements(0), logical_elements(1)
    if inside_q is None and inside_k is None:
        return draw(make, rng, shape)
    sizes = [_logical_size(inside_q, query.shape, d) for d in range(query.ndim - 1)]
    sizes.append(_logical_size(inside_k, key.shape, key.ndim - 2))
    flat = jnp.zeros(shape, jnp.int32)
    for d, n in enumerate(sizes):
        flat = flat * n + jax.lax.broadcasted_iota(jnp.int32, shape, d)
    total = math.prod(shape)
    return make(rng, (total,))[jnp.clip(flat, 0, total - 1)]


def _logical_size(inside, shape, dim):
    """The logical size of ``dim`` of an argument of ``shape`` whose logical
    elements are ``inside`` (padded at the end of each dim; None: exact)."""
    if inside is None:
        return shape[dim]
    index = tuple(slice(None) if d == dim else 0 for d in range(inside.ndim))
    return jnp.sum(inside[index], dtype=jnp.int32)


@lowering("pjrt_host::attention_backward")
def attention_backward(grad_out, query, key, value, attn_mask, keep, dropout_p, is_causal, scale, enable_gqa):
    """The gradients of :func:`attention` for query, key and value, as one op."""
    keys = _logical_keys(2)
    _, pullback = jax.vjp(lambda q, k, v: _attend(q, k, v, attn_mask, keep, dropout_p, is_causal, scale,
                                                  enable_gqa, keys), query, key, value)
    return pullback(grad_out.astype(query.dtype))


def _logical_keys(position):
    """Where the key (the op's argument at ``position``) is read padded:
    True at its logical positions along its length (its last dim, the head
    dim, is exact by the rule); else None."""
    inside = logical_elements(position)
    return None if inside is None else inside[..., 0]


@lowering("aten::_scaled_dot_product_flash_attention_for_cpu")
def sdpa_flash_cpu(query, key, value, dropout_p=0.0, is_causal=False, *, attn_mask=None, scale=None):
    if dropout_p > 0:  # its backward could not know which weights were dropped
        raise NotImplementedError("_scaled_dot_product_flash_attention_for_cpu with dropout_p > 0 has no lowering; "
                                  "scaled_dot_product_attention runs dropout on the device")
    scores = _attention_weights(query, key, attn_mask, is_causal, scale)
    logsumexp = jax.nn.logsumexp(scores, axis=-1)
    out = _matmul(jax.nn.softmax(scores, axis=-1), value)
    return out, logsumexp


@lowering("aten::_scaled_dot_product_flash_attention_for_cpu_backward")
def sdpa_flash_cpu_backward(grad_out, query, key, value, out, logsumexp, dropout_p, is_causal, *, attn_mask=None,
                            scale=None):
    def forward(q, k, v):
        return _matmul(jax.nn.softmax(_attention_weights(q, k, attn_mask, is_causal, scale), axis=-1), v)

    _, pullback = jax.vjp(forward, query, key, value)
    return pullback(grad_out.astype(query.dtype))


# ------------------------------------------------------------ im2col / col2im


def _im2col(x, kernel_size, dilation, padding, stride):
    k, d, p, s = (_tuple(v, 2) for v in (kernel_size, dilation, padding, stride))
    taps = [_window_indices(x.shape[x.ndim - 2 + i], k[i], s[i], p[i], d[i], False) for i in range(2)]
    # _windows orders taps (out_h, out_w, k_h * k_w); im2col wants (C * k_h * k_w, out_h * out_w).
    values, _, valid = _windows(x, taps)
    values = jnp.where(jnp.asarray(valid), values, jnp.zeros((), x.dtype))
    lead = x.shape[:-3]
    c = x.shape[-3]
    oh, ow, kk = values.shape[-3:]
    values = values.reshape(lead + (c, oh * ow, kk))
    return jnp.swapaxes(values, -1, -2).reshape(lead + (c * kk, oh * ow))


@lowering("aten::im2col")
def im2col(x, kernel_size, dilation, padding, stride):
    return _im2col(x, kernel_size, dilation, padding, stride)


@lowering("aten::col2im")
def col2im(columns, output_size, kernel_size, dilation, padding, stride):
    lead = columns.shape[:-2]
    c = columns.shape[-2] // math.prod(_tuple(kernel_size, 2))
    x = jnp.zeros(lead + (c,) + tuple(output_size), columns.dtype)
    _, pullback = jax.vjp(lambda t: _im2col(t, kernel_size, dilation, padding, stride), x)
    return pullback(columns)[0]


@lowering("aten::_pdist_forward")
def pdist(x, p=2):
    n = x.shape[0]
    rows, cols = np.triu_indices(n, 1)
    return cdist(x, x, p)[rows, cols]


@lowering("aten::_pdist_backward")
def pdist_backward(grad, x, p, dist):
    """Each pair's gradient reaches both its rows, with opposite signs: the
    condensed gradient and distances spread over the upper triangle, and
    cdist's closed forms applied from either side."""
    n = x.shape[0]
    rows, cols = np.triu_indices(n, 1)
    g = jnp.zeros((n, n), grad.dtype).at[rows, cols].set(grad)
    d = jnp.zeros((n, n), dist.dtype).at[rows, cols].set(dist)
    return (jnp.sum(_cdist_grad_terms(g, x, x, p, d), axis=-2)
            + jnp.sum(_cdist_grad_terms(g.T, x, x, p, d.T), axis=-2)).astype(x.dtype)


@lowering("aten::_trilinear")
def trilinear(i1, i2, i3, expand1, expand2, expand3, sumdim, unroll_dim=1):
    def expanded(t, dims):
        for d in sorted(dims):
            t = jnp.expand_dims(t, d)
        return t

    # torch sums i1 * i2 over the summed dims where i3 is broadcast first,
    # then the rest with i3: two products, the first rounded to the
    # inputs' dtype between them (as_stored) -- what it gives 16-bit inputs.
    first = tuple(d for d in sumdim if d in expand3)
    pair = expanded(i1, expand1) * expanded(i2, expand2)
    pair = as_stored(jnp.sum(pair, axis=first, keepdims=True) if first else pair)
    product = pair * expanded(i3, expand3)
    rest = tuple(d for d in sumdim if d not in expand3)
    if rest:
        product = jnp.sum(product, axis=rest, keepdims=True)
    return jnp.squeeze(product, axis=tuple(sumdim)) if sumdim else product


# ------------------------------------------------------- fused RNN cells
# torch.nn.LSTM / GRU use these on every device but CPU.  The workspace is
# what the backward needs: LSTM's activated gates [i, f, g, o]; GRU's
# [r, z, n, hidden_n, hx].


@lowering("aten::_thnn_fused_lstm_cell")
def lstm_cell(input_gates, hidden_gates, cx, input_bias=None, hidden_bias=None):
    gates = input_gates + hidden_gates
    if input_bias is not None:
        gates = gates + input_bias + hidden_bias
    i, f, g, o = jnp.split(gates, 4, axis=-1)
    i, f, g, o = jax.nn.sigmoid(i), jax.nn.sigmoid(f), jnp.tanh(g), jax.nn.sigmoid(o)
    cy = f * cx + i * g
    hy = o * jnp.tanh(cy)
    return hy, cy, jnp.concatenate([i, f, g, o], axis=-1)


def _lstm_cell_gate_grads(grad_hy, grad_cy, cx, cy, workspace):
    i, f, g, o = jnp.split(workspace, 4, axis=-1)
    tanh_cy = jnp.tanh(cy)
    grad_hy = jnp.zeros_like(cy) if grad_hy is None else grad_hy
    grad_c = grad_hy * o * (1 - tanh_cy * tanh_cy) + (0 if grad_cy is None else grad_cy)
    grad_gates = jnp.concatenate([grad_c * g * i * (1 - i), grad_c * cx * f * (1 - f), grad_c * i * (1 - g * g),
                                  grad_hy * tanh_cy * o * (1 - o)], axis=-1)
    return grad_gates, grad_c * f


@lowering("aten::_thnn_fused_lstm_cell_backward_impl")
def lstm_cell_backward_impl(grad_hy, grad_cy, cx, cy, workspace, has_bias):
    grad_gates, grad_cx = _lstm_cell_gate_grads(grad_hy, grad_cy, cx, cy, workspace)
    return grad_gates, grad_cx, (jnp.sum(grad_gates, axis=0) if has_bias else None)


@lowering("aten::_thnn_fused_lstm_cell_backward")
def lstm_cell_backward(grad_hy, grad_cy, cx, cy, workspace, has_bias):
    grad_gates, grad_cx = _lstm_cell_gate_grads(grad_hy, grad_cy, cx, cy, workspace)
    grad_bias = jnp.sum(grad_gates, axis=0) if has_bias else None
    return grad_gates, grad_gates, grad_cx, grad_bias, grad_bias


@lowering("aten::_thnn_fused_gru_cell")
def gru_cell(input_gates, hidden_gates, hx, input_bias=None, hidden_bias=None):
    if input_bias is not None:
        input_gates = input_gates + input_bias
        hidden_gates = hidden_gates + hidden_bias
    ir, iz, in_ = jnp.split(input_gates, 3, axis=-1)
    hr, hz, hn = jnp.split(hidden_gates, 3, axis=-1)
    r = jax.nn.sigmoid(ir + hr)
    z = jax.nn.sigmoid(iz + hz)
    n = jnp.tanh(in_ + r * hn)
    hy = (1 - z) * n + z * hx
    return hy, jnp.concatenate([r, z, n, hn, hx], axis=-1)


@lowering("aten::_thnn_fused_gru_cell_backward")
def gru_cell_backward(grad_hy, workspace, has_bias):
    r, z, n, hn, hx = jnp.split(workspace, 5, axis=-1)
    grad_n = grad_hy * (1 - z) * (1 - n * n)
    grad_z = grad_hy * (hx - n) * z * (1 - z)
    grad_r = grad_n * hn * r * (1 - r)
    grad_input_gates = jnp.concatenate([grad_r, grad_z, grad_n], axis=-1)
    grad_hidden_gates = jnp.concatenate([grad_r, grad_z, grad_n * r], axis=-1)
    grad_hx = grad_hy * z
    if has_bias:
        return (grad_input_gates, grad_hidden_gates, grad_hx, jnp.sum(grad_input_gates, axis=0),
                jnp.sum(grad_hidden_gates, axis=0))
    return grad_input_gates, grad_hidden_gates, grad_hx, None, None
