"""Helpers shared by the lowerings: torch's type promotion, dims, dtypes.

jnp promotes differently from torch (``int64 + 2.5`` is float64 in jnp with
x64, float32 in torch; ``uint8 + int8`` ...), so every lowering that mixes
operands asks :func:`result_type` for torch's answer and casts explicitly.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch

from ._dtypes import jax_dtype, torch_dtype
from ._invoke import REDUCED_FLOATS, current_context, stored_dtype

__all__ = [
    "as_float", "broadcast_shapes_or_raise", "canonical_dim", "canonical_dims", "cast", "dense_gather_factor", "draw",
    "float_dtype", "index_of_max", "index_of_min", "linspace_values", "arange_values", "logical_elements", "mask_as",
    "optional_jax_dtype", "promote", "result_type", "take", "torch_dtype_of", "to_jax",
]


def optional_jax_dtype(dtype: torch.dtype | None) -> Any:
    """jax dtype for a torch dtype (None stays None)."""
    return None if dtype is None else jax_dtype(dtype)


def torch_dtype_of(x: Any) -> torch.dtype:
    """torch dtype of a jax array, or of a Python scalar as torch wraps it."""
    if isinstance(x, bool):
        return torch.bool
    if isinstance(x, int):
        return torch.int64
    if isinstance(x, float):
        return torch.get_default_dtype()
    if isinstance(x, complex):
        return torch.complex128 if torch.get_default_dtype() == torch.float64 else torch.complex64
    return torch_dtype(x.dtype)


def _to_complex(dtype: torch.dtype) -> torch.dtype:
    return {torch.float64: torch.complex128, torch.float16: torch.complex32}.get(dtype, torch.complex64)


def _combine(higher: torch.dtype | None, lower: torch.dtype | None) -> torch.dtype | None:
    # c10's combine_categories: a higher tier (dim > 0-dim > Python scalar)
    # wins unless a lower tier is of a higher *category* (bool < int < float < complex).
    if higher is None:
        return lower
    if lower is None:
        return higher
    if higher.is_complex:
        return higher
    if lower.is_complex:
        return _to_complex(higher) if higher.is_floating_point else lower
    if higher.is_floating_point:
        return higher
    if higher == torch.bool or lower.is_floating_point:
        return torch.promote_types(higher, lower)
    return higher


def result_type(*operands: Any) -> torch.dtype:
    """torch.result_type over any number of operands: jax arrays (dim > 0 or
    0-dim) and Python scalars, with torch's tiering.  None is ignored."""
    tiers: list[torch.dtype | None] = [None, None, None]  # dim, zero-dim, scalar
    for x in operands:
        if x is None:
            continue
        if isinstance(x, (bool, int, float, complex)):
            tier = 2
        else:
            tier = 0 if jnp.ndim(x) > 0 else 1
        d = torch_dtype_of(x)
        tiers[tier] = d if tiers[tier] is None else torch.promote_types(tiers[tier], d)
    out = _combine(tiers[0], _combine(tiers[1], tiers[2]))
    assert out is not None, "result_type needs at least one operand"
    return out


def float_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype an int-to-float op (sin, sqrt, true division) computes in."""
    if dtype.is_floating_point or dtype.is_complex:
        return dtype
    return torch.get_default_dtype()


def cast(x: Any, dtype: torch.dtype) -> jax.Array:
    """x (array or Python scalar) as a jax array of torch dtype ``dtype``.
    A Python integer wraps into a narrower integer dtype as C++'s cast
    wraps it (``uint8_tensor + (-1)`` adds 255, ``uint8_tensor < 300``
    compares with 44, as torch's kernels do); jax refuses it instead."""
    jd = jax_dtype(dtype)
    if isinstance(x, (bool, int, float, complex)):
        if type(x) is int and jnp.issubdtype(jd, jnp.integer) and not jnp.iinfo(jd).min <= x <= jnp.iinfo(jd).max:
            return jnp.asarray(np.asarray(x, np.int64 if x < 0 else np.uint64).astype(jd))
        return jnp.asarray(x, dtype=jd)
    if x.dtype == jd:
        return x
    if x.dtype == jnp.bool_ and (jnp.issubdtype(jd, jnp.floating) or jnp.issubdtype(jd, jnp.complexfloating)):
        # XLA rewrites convert(mask) * y and convert(mask) / y into selects
        # that lose IEEE's 0 * inf and 0 / 0 (NaN; -0.0 for 0 * -y) wherever
        # the cast and the arithmetic meet in one program (a mask's .float()
        # then a division, fused): a select of constants it leaves alone
        return mask_as(x, jd)
    return x.astype(jd)


def mask_as(mask: jax.Array, dtype: Any) -> jax.Array:
    """A bool array as jax ``dtype``: for floats a select of constants, as
    :func:`cast` makes it (a mask's convert, meeting a division in one
    program, would lose IEEE's 0 / 0), else a plain convert."""
    if jnp.issubdtype(dtype, jnp.floating) or jnp.issubdtype(dtype, jnp.complexfloating):
        return jnp.where(mask, jnp.ones((), dtype), jnp.zeros((), dtype))
    return mask.astype(dtype)


def promote(*operands: Any, scalars_in_opmath: bool = False) -> tuple[torch.dtype, list[jax.Array]]:
    """(torch result dtype, operands cast to it).

    Under opmath (16-bit inputs widened to float32, :func:`stored_dtype`),
    Python-number operands are rounded to the stored dtype first, as torch's
    TensorIterator casts a wrapped number to the common dtype before the
    kernel widens it (``bf16 + 1e-3`` adds bfloat16(1e-3)).  torch's mul and
    true division keep the number's float32 value instead
    (``scalars_in_opmath``)."""
    dtype = result_type(*operands)
    if not scalars_in_opmath and dtype == torch.float32 and stored_dtype() is not None:
        return dtype, [as_stored(cast(x, dtype)) if isinstance(x, (int, float)) or jnp.ndim(x) == 0
                       else cast(x, dtype) for x in operands]
    return dtype, [cast(x, dtype) for x in operands]


def as_float(x: Any) -> jax.Array:
    """x in the dtype an int-to-float op returns."""
    return cast(x, float_dtype(torch_dtype_of(x)))


def to_jax(x: Any) -> Any:
    """Python scalars to arrays of torch's dtype for them; arrays unchanged."""
    return cast(x, torch_dtype_of(x)) if isinstance(x, (bool, int, float, complex)) else x


def canonical_dim(dim: int, ndim: int) -> int:
    """A possibly negative dim as 0..ndim-1 (a 0-dim tensor accepts 0 and -1)."""
    n = max(ndim, 1)
    if not -n <= dim < n:
        raise IndexError(f"Dimension out of range (expected to be in range of [{-n}, {n - 1}], but got {dim})")
    return dim % n


def canonical_dims(dims: int | Sequence[int] | None, ndim: int) -> tuple[int, ...]:
    """dims as a sorted tuple of non-negative ints; None or [] means all."""
    if dims is None:
        return tuple(range(ndim))
    if isinstance(dims, int):
        dims = [dims]
    if len(dims) == 0:
        return tuple(range(ndim))
    return tuple(sorted({canonical_dim(d, ndim) for d in dims} - ({0} if ndim == 0 else set())))


def dense_gather_factor() -> int:
    """The plugin's dense_gather_factor, as the caller's
    :class:`~pjrt_host._lowerings.LoweringContext` gives it (0: never)."""
    return current_context().dense_gather_factor


def take(x: jax.Array, index: jax.Array, axis: int) -> jax.Array:
    """``x`` indexed along ``axis`` by integer ``index`` (any shape, already
    non-negative): ``out[..., i, ...] = x[..., index[i], ...]``.

    When the plugin asks for it (index count within ``dense_gather_factor``
    times the gathered dimension) the gather is a one-hot matmul."""
    factor = dense_gather_factor()
    size = x.shape[axis]
    if size == 0 and index.size > 0:  # torch's message, not jax's ("non-empty jnp.take() from an empty axis")
        raise IndexError(f"index is out of bounds for dimension with size 0")
    if factor > 0 and index.size <= factor * size and size > 0 and jnp.issubdtype(x.dtype, jnp.floating):
        onehot = (index.reshape(-1)[:, None] == jnp.arange(size, dtype=index.dtype)[None, :]).astype(x.dtype)
        moved = jnp.moveaxis(x, axis, 0).reshape(size, -1)
        out = jnp.matmul(onehot, moved, precision=jax.lax.Precision.HIGHEST)
        out = out.reshape(index.shape + tuple(np.delete(np.array(x.shape, dtype=np.int64), axis).tolist()))
        return jnp.moveaxis(out, tuple(range(index.ndim)), tuple(range(axis, axis + index.ndim)))
    return jnp.take(x, index, axis=axis, mode="clip")


def linspace_values(start: Any, end: Any, steps: int, dtype: Any) -> jax.Array:
    """``torch.linspace(start, end, steps)`` in jax dtype ``dtype``; start and
    end may be Python numbers or (traced) 0-dim arrays.  torch's kernel: the
    bounds are first converted to the result dtype; the first half counts up
    from start, the second down from end (both ends exact), in the result
    dtype (in float64 for integer results, then truncated); one step is start."""
    integral = jnp.issubdtype(dtype, jnp.integer)
    acc = jnp.float64 if integral else dtype
    start = jnp.asarray(start).astype(dtype).astype(acc)
    end = jnp.asarray(end).astype(dtype).astype(acc)
    if steps == 1:
        return jnp.broadcast_to(start, (1,)).astype(dtype)
    i = jnp.arange(steps).astype(acc)
    # XLA turns a division by a constant into a multiplication by its
    # reciprocal (-49 * (1/49) != -1); the barrier keeps torch's true division.
    step = (end - start) / jax.lax.optimization_barrier(jnp.asarray(steps - 1, acc))
    vals = jnp.where(i < steps // 2, start + step * i, end - step * (steps - 1 - i))
    return (jnp.trunc(vals) if integral else vals).astype(dtype)


def arange_values(start: Any, step: Any, n: int, dtype: Any) -> jax.Array:
    """``n`` values of ``torch.arange(start, ..., step)`` in jax dtype
    ``dtype``: torch's kernel converts start and step to an integer result
    dtype first (``arange(2.1, -2.9, -1.0, dtype=int64)`` is 2, 1, 0, -1),
    and accumulates floats in double."""
    if jnp.issubdtype(dtype, jnp.integer):
        start, step = (jnp.asarray(v).astype(jnp.int64) for v in (start, step))  # truncates, as C++ casts
        return (start + jnp.arange(n, dtype=jnp.int64) * step).astype(dtype)
    return (start + jnp.arange(n, dtype=jnp.float64) * step).astype(dtype)


def draw(make: Any, key: Any, shape: Sequence[int]) -> jax.Array:
    """``make(key, shape)``, a jax random draw of ``shape``, made over a
    flat counter and reshaped when the program runs on one device
    (``LoweringContext.one_device``).  jax's counter-based draws give
    element i the same value either way, so results do not change; XLA:CPU
    compiles the draw of several dimensions 2-5x slower than the flat one
    (0.2 against 1.1 s for a (4, 4, 64, 64) dropout mask).  A program
    partitioned over a mesh keeps the shaped draw, which its partitioner
    splits without replicating it."""
    shape = tuple(shape)
    ctx = current_context()
    for padded_shape, positions in ctx.draw_positions:
        if padded_shape == shape:
            # a padded array: each position takes the draw of its logical
            # element (element i of a flat draw depends on i alone)
            n = math.prod(shape)
            return make(key, (n,))[jnp.clip(positions(), 0, n - 1)]
    if len(shape) > 1 and ctx.one_device:
        return make(key, (math.prod(shape),)).reshape(shape)
    return make(key, shape)


def logical_elements(position: int) -> jax.Array | None:
    """The mask of the logical elements of the running op's argument at
    ``position``, when it is read padded (dynamic dimensions: its shape is
    its bucket's); None when it is read at its own sizes."""
    for at, mask in current_context().logical:
        if at == position:
            return mask()
    return None


def widened(x: jax.Array) -> jax.Array:
    """``x`` in float32 if it is a 16-bit float (exact), else as it is."""
    return x.astype(jnp.float32) if x.dtype in REDUCED_FLOATS else x


def as_stored(x: jax.Array) -> jax.Array:
    """``x`` rounded to the dtype the op's 16-bit inputs had (and back to
    x's dtype), where torch keeps an intermediate in the input dtype and
    computes on with it; ``x`` itself otherwise."""
    dtype = stored_dtype()
    if dtype is None:
        return x
    # reduce_precision, not astype there and back: XLA may drop such a
    # round trip (xla_allow_excess_precision, on by default: XLA:GPU does).
    info = jnp.finfo(dtype)
    rounded = jax.lax.reduce_precision(x, exponent_bits=info.nexp, mantissa_bits=info.nmant)
    if float(info.tiny) <= float(jnp.finfo(x.dtype).tiny):
        return rounded
    # reduce_precision flushes the 16-bit subnormals (float16's below 6.1e-5);
    # those are whole multiples of the smallest one, rounded half to even.
    step = float(info.smallest_subnormal)
    return jnp.where(jnp.abs(x) < float(info.tiny), jnp.round(x / step) * step, rounded)


def broadcast_shapes_or_raise(a: tuple, b: tuple) -> tuple:
    """The broadcast of two shapes, or torch's RuntimeError naming the last
    dimension where they cannot broadcast, as torch's ``infer_size`` walks
    them (jax's ValueError is not torch's)."""
    ndim = max(len(a), len(b))
    pa, pb = (1,) * (ndim - len(a)) + tuple(a), (1,) * (ndim - len(b)) + tuple(b)
    for i in reversed(range(ndim)):
        x, y = pa[i], pb[i]
        if x != y and x != 1 and y != 1:
            raise RuntimeError(f"The size of tensor a ({x}) must match the size of tensor b ({y}) at non-singleton "
                               f"dimension {i}")
    return tuple(max(x, y) if 0 not in (x, y) else 0 for x, y in zip(pa, pb))


def index_of_max(x: jax.Array, axis: int | None = None) -> jax.Array:
    """``jnp.argmax`` (the first largest; NaN counts as largest) with an
    int32 index (cast it for torch's int64).  An int64 index -- jnp's under
    pjrt_host's 64-bit scope -- is traced as int64 but lowered as int32
    inside a caller's ``jax.jit`` with 64-bit types off, which fails MLIR's
    verifier (``jax.jit(call_torch(torch.argmax))``)."""
    return _index_of(jax.lax.argmax, x, axis)


def index_of_min(x: jax.Array, axis: int | None = None) -> jax.Array:
    """``jnp.argmin`` with an int32 index (see :func:`index_of_max`)."""
    return _index_of(jax.lax.argmin, x, axis)


def _index_of(op: Any, x: jax.Array, axis: int | None) -> jax.Array:
    if axis is None:
        return op(jnp.ravel(x), 0, jnp.int32)
    return op(x, axis % x.ndim, jnp.int32)
