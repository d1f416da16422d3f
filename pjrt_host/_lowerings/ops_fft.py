"""FFT lowerings: torch.fft's three primitives, r2c, c2r and c2c.

torch passes the normalisation as an int: 0 none, 1 by 1/sqrt(n), 2 by 1/n
(n the product of the transformed sizes, of the signal for c2r).  jnp's
transforms are asked for no scaling of their own (``norm="forward"`` on an
inverse, ``"backward"`` on a forward transform) and the scale is applied here.
"""

from __future__ import annotations

import math

import jax.numpy as jnp

from . import lowering
from ._util import canonical_dim


def _scale(x, n, normalization):
    if normalization == 1:
        return x / jnp.asarray(math.sqrt(n), x.real.dtype)
    if normalization == 2:
        return x / jnp.asarray(n, x.real.dtype)
    return x


def _refuse_empty(op, x):
    """torch CPU refuses a transform of an empty tensor (any dim 0, batch
    dims included; an ``n=`` that pads it first is not empty): its MKL
    plan fails, and cuFFT has no plan of size 0 either.  jnp would return
    an empty result."""
    if x.size == 0:
        raise RuntimeError(
            "MKL FFT error: Intel oneMKL DFTI ERROR: Inconsistent configuration parameters (torch CPU's words; "
            f"pjrt_host: aten::{op} of an empty tensor of shape {tuple(x.shape)} is refused as on CPU: give every "
            "dimension at least one element, or pad the transformed ones with n= / s=)")


def _axes(x, dim):
    return tuple(canonical_dim(d, x.ndim) for d in dim)  # in torch's order: r2c halves the last


@lowering("aten::_fft_r2c")
def fft_r2c(x, dim, normalization, onesided):
    _refuse_empty("_fft_r2c", x)
    axes = _axes(x, dim)
    n = math.prod(x.shape[a] for a in axes)
    out = jnp.fft.rfftn(x, axes=axes) if onesided else jnp.fft.fftn(x, axes=axes)
    return _scale(out, n, normalization)


@lowering("aten::_fft_c2c")
def fft_c2c(x, dim, normalization, forward):
    _refuse_empty("_fft_c2c", x)
    axes = _axes(x, dim)
    if not axes:
        return x
    n = math.prod(x.shape[a] for a in axes)
    out = jnp.fft.fftn(x, axes=axes) if forward else jnp.fft.ifftn(x, axes=axes, norm="forward")
    return _scale(out, n, normalization)


@lowering("aten::_fft_c2r")
def fft_c2r(x, dim, normalization, last_dim_size):
    _refuse_empty("_fft_c2r", x)
    axes = _axes(x, dim)
    sizes = [x.shape[a] for a in axes[:-1]] + [last_dim_size]
    out = jnp.fft.irfftn(x, s=sizes, axes=axes, norm="forward")
    return _scale(out, math.prod(sizes), normalization)
