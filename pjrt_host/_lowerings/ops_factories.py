"""Factories, random factories, copies and casts: one implementation for
eager ops and for traced graphs.

A factory (``zeros``, ``arange``, ``randn``, ``*_like``, ``new_*``) is
registered with ``factory=True``: it gets a :class:`~._invoke.Result` first
(after the key of a random one), the shape and jax dtype torch's meta kernel
gives -- eager's ``_torch._factories`` and the graph interpreter both have
it -- so the argument conventions of each overload (``size`` positional or
not, ``dtype=None`` meaning the default dtype) are torch's business, settled
before the lowering runs.  Every other argument a factory takes (``device``,
``layout``, ``pin_memory``, ``generator`` ...) decides nothing here.

Eager keeps only what is about storage: where the result lives, ``empty``
made lazily, small random draws made in power-of-two buckets
(``per_element``) and cut.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from . import lowering
from ._util import arange_values, cast, draw, linspace_values

__all__: list[str] = []


def factory(*names: str, random: bool = False, per_element: bool = False):
    return lowering(*names, factory=True, needs_rng=random, per_element=per_element, opmath=False)


# ------------------------------------------------------------ from nothing

@factory("aten::empty.memory_format", "aten::empty_strided", "aten::empty_permuted", "aten::new_empty",
         "aten::new_empty_strided", "aten::empty_like", "aten::zeros", "aten::new_zeros", "aten::zeros_like")
def zeros(result, *args, **kwargs):
    # torch leaves empty tensors uninitialised; zeros are one valid value.
    return jnp.zeros(result.shape, result.dtype)


@factory("aten::ones", "aten::new_ones", "aten::ones_like")
def ones(result, *args, **kwargs):
    return jnp.ones(result.shape, result.dtype)


@factory("aten::full")
def full(result, size, fill_value, **kwargs):
    return jnp.full(result.shape, fill_value, result.dtype)


@factory("aten::new_full")
def new_full(result, self, size, fill_value, **kwargs):
    return jnp.full(result.shape, fill_value, result.dtype)


@factory("aten::full_like")
def full_like(result, self, fill_value, **kwargs):
    return jnp.full(result.shape, fill_value, result.dtype)


@factory("aten::scalar_tensor")
def scalar_tensor(result, s, **kwargs):
    return jnp.asarray(s).astype(result.dtype).reshape(())


@factory("aten::arange")
def arange(result, end, **kwargs):
    return arange_values(0, 1, result.shape[0], result.dtype)


@factory("aten::arange.start")
def arange_start(result, start, end, **kwargs):
    return arange_values(start, 1, result.shape[0], result.dtype)


@factory("aten::arange.start_step")
def arange_start_step(result, start, end, step=1, **kwargs):
    return arange_values(start, step, result.shape[0], result.dtype)


@factory("aten::linspace")
def linspace(result, start, end, steps, **kwargs):
    return linspace_values(start, end, steps, result.dtype)


@factory("aten::eye", "aten::eye.m")
def eye(result, n, m=None, **kwargs):
    return jnp.eye(result.shape[0], result.shape[1], dtype=result.dtype)


# ------------------------------------------------------------ random factories

@factory("aten::rand", "aten::rand.generator", "aten::rand_like", random=True, per_element=True)
def rand(key, result, *args, **kwargs):
    if jnp.issubdtype(result.dtype, jnp.complexfloating):
        # torch: the real and imaginary parts each uniform in [0, 1).
        part = jnp.finfo(result.dtype).dtype
        real, imag = draw(lambda k, s: jax.random.uniform(k, s, part), key, (2, *result.shape))
        return jax.lax.complex(real, imag).astype(result.dtype)
    return draw(lambda k, s: jax.random.uniform(k, s, result.dtype), key, result.shape)


@factory("aten::randn", "aten::randn.generator", "aten::randn_like", random=True, per_element=True)
def randn(key, result, *args, **kwargs):
    # A complex dtype: jax draws each part with variance 1/2, as torch does.
    return draw(lambda k, s: jax.random.normal(k, s, result.dtype), key, result.shape)


@factory("aten::randint", "aten::randint.generator", random=True, per_element=True)
def randint(key, result, high, size, **kwargs):
    return draw(lambda k, s: jax.random.randint(k, s, 0, high, jnp.int64), key, result.shape).astype(result.dtype)


@factory("aten::randint.low", "aten::randint.low_generator", random=True, per_element=True)
def randint_low(key, result, low, high, size, **kwargs):
    return draw(lambda k, s: jax.random.randint(k, s, low, high, jnp.int64), key, result.shape).astype(result.dtype)


@factory("aten::randperm", "aten::randperm.generator", random=True)
def randperm(key, result, n, **kwargs):
    return jax.random.permutation(key, result.shape[0]).astype(result.dtype)


# ------------------------------------------------------------ copies and casts
#
# Device moves are storage business (eager's ``_to_copy`` storage op; a
# graph's edges): here a copy or a cast is the values in the new dtype, which
# the caller's result dtype settles when ``dtype`` is None.

def _cast(x, dtype):
    return jnp.asarray(x) if dtype is None else cast(x, dtype)


@lowering("aten::_to_copy", opmath=False)
def to_copy(x, *, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False, memory_format=None):
    return _cast(x, dtype)


@lowering("aten::to.dtype", opmath=False)
def to_dtype(x, dtype, non_blocking=False, copy=False, memory_format=None):
    return _cast(x, dtype)


@lowering("aten::to.dtype_layout", opmath=False)
def to_dtype_layout(x, *, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False, copy=False,
                    memory_format=None):
    return _cast(x, dtype)


@lowering("aten::to.device", opmath=False)
def to_device(x, device, dtype, non_blocking=False, copy=False, memory_format=None):
    return _cast(x, dtype)


@lowering("prims::convert_element_type", opmath=False)
def convert_element_type(x, dtype):
    return _cast(x, dtype)
