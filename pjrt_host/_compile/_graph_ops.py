"""Graph-form lowerings: ATen ops that the eager device runs with its own
kernels (factories, ``_to_copy``, ``copy_``, random factories) rather than
through the lowering table, and the symbolic-size ops an FX graph carries.

In a graph they are ordinary traceable jax code.  Each handler gets the
node's arguments with tensors replaced by jax values, and ``out``: the
(shape, jax dtype) torch's fake tensor gives for the node's result, and
``key``: a jax PRNG key (random handlers only).  Shapes and dtypes always
come from ``out``, so the argument conventions of each overload (``size``
positional or not, ``dtype=None`` meaning the default dtype) are torch's
business, already settled when the graph was traced.
"""

from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

from .._lowerings._util import arange_values, linspace_values
from . import _device, _handles

__all__ = ["GraphOp", "HANDLERS", "NO_OP", "OPAQUE", "SYMBOLIC"]


class GraphOp(NamedTuple):
    fn: Callable[..., Any]
    random: bool = False


class Out(NamedTuple):
    shape: tuple[int, ...]
    dtype: Any


HANDLERS: dict[str, GraphOp] = {}


def _reg(*names: str, random: bool = False) -> Callable[[Callable], Callable]:
    def deco(fn: Callable) -> Callable:
        for name in names:
            HANDLERS[name] = GraphOp(fn, random)
        return fn

    return deco


# ------------------------------------------------------------ factories

@_reg("aten::empty.memory_format", "aten::empty_strided", "aten::empty_permuted", "aten::new_empty",
      "aten::new_empty_strided", "aten::empty_like", "aten::zeros", "aten::new_zeros", "aten::zeros_like")
def _zeros(out: Out, key: Any, *args: Any, **kwargs: Any) -> Any:
    # torch leaves empty tensors uninitialised; zeros are one valid value.
    return jnp.zeros(out.shape, out.dtype)


@_reg("aten::ones", "aten::new_ones", "aten::ones_like")
def _ones(out: Out, key: Any, *args: Any, **kwargs: Any) -> Any:
    return jnp.ones(out.shape, out.dtype)


@_reg("aten::full")
def _full(out: Out, key: Any, size: Any, fill_value: Any, **kwargs: Any) -> Any:
    return jnp.full(out.shape, fill_value, out.dtype)


@_reg("aten::new_full")
def _new_full(out: Out, key: Any, self: Any, size: Any, fill_value: Any, **kwargs: Any) -> Any:
    return jnp.full(out.shape, fill_value, out.dtype)


@_reg("aten::full_like")
def _full_like(out: Out, key: Any, self: Any, fill_value: Any, **kwargs: Any) -> Any:
    return jnp.full(out.shape, fill_value, out.dtype)


@_reg("aten::scalar_tensor")
def _scalar_tensor(out: Out, key: Any, value: Any, **kwargs: Any) -> Any:
    return jnp.asarray(value).astype(out.dtype).reshape(())


def _range_values(start: Any, step: Any, out: Out) -> Any:
    return arange_values(start, step, out.shape[0], out.dtype)


@_reg("aten::arange")
def _arange(out: Out, key: Any, end: Any, **kwargs: Any) -> Any:
    return _range_values(0, 1, out)


@_reg("aten::arange.start")
def _arange_start(out: Out, key: Any, start: Any, end: Any, **kwargs: Any) -> Any:
    return _range_values(start, 1, out)


@_reg("aten::arange.start_step")
def _arange_start_step(out: Out, key: Any, start: Any, end: Any, step: Any = 1, **kwargs: Any) -> Any:
    return _range_values(start, step, out)


@_reg("aten::linspace")
def _linspace(out: Out, key: Any, start: Any, end: Any, steps: int, **kwargs: Any) -> Any:
    return linspace_values(start, end, steps, out.dtype)


@_reg("aten::eye", "aten::eye.m")
def _eye(out: Out, key: Any, n: int, m: int | None = None, **kwargs: Any) -> Any:
    return jnp.eye(out.shape[0], out.shape[1], dtype=out.dtype)


# ------------------------------------------------------------ random factories

@_reg("aten::rand", "aten::rand_like", random=True)
def _rand(out: Out, key: Any, *args: Any, **kwargs: Any) -> Any:
    return jax.random.uniform(key, out.shape, _float_for(out.dtype)).astype(out.dtype)


@_reg("aten::randn", "aten::randn_like", random=True)
def _randn(out: Out, key: Any, *args: Any, **kwargs: Any) -> Any:
    return jax.random.normal(key, out.shape, _float_for(out.dtype)).astype(out.dtype)


@_reg("aten::randint", random=True)
def _randint(out: Out, key: Any, high: int, size: Any, **kwargs: Any) -> Any:
    return jax.random.randint(key, out.shape, 0, high, jnp.int64).astype(out.dtype)


@_reg("aten::randint.low", random=True)
def _randint_low(out: Out, key: Any, low: int, high: int, size: Any, **kwargs: Any) -> Any:
    return jax.random.randint(key, out.shape, low, high, jnp.int64).astype(out.dtype)


@_reg("aten::randperm", random=True)
def _randperm(out: Out, key: Any, n: int, **kwargs: Any) -> Any:
    return jax.random.permutation(key, n).astype(out.dtype)


def _float_for(dtype: Any) -> Any:
    return dtype if jnp.issubdtype(dtype, jnp.floating) else jnp.float32


# ------------------------------------------------------------ copies and casts

@_reg("aten::_to_copy", "aten::to.dtype", "aten::to.dtype_layout", "aten::to.device")
def _to_copy(out: Out, key: Any, self: Any, *args: Any, **kwargs: Any) -> Any:
    # Device moves are decided at the graph's edges: inside one compiled
    # function every value lives on the plugin's device.
    return jnp.asarray(self).astype(out.dtype).reshape(out.shape)


@_reg("prims::convert_element_type")
def _convert(out: Out, key: Any, self: Any, dtype: Any) -> Any:
    return jnp.asarray(self).astype(out.dtype)


@_reg("aten::copy", "aten::copy_")
def _copy(out: Out, key: Any, self: Any, src: Any, non_blocking: bool = False) -> Any:
    return jnp.broadcast_to(jnp.asarray(src).astype(out.dtype), out.shape)


@_reg("aten::lift_fresh_copy")
def _lift_fresh_copy(out: Out, key: Any, self: Any) -> Any:
    return self


# ------------------------------------------------------------ sizes

def _sym_size(self: Any, dim: int) -> int:
    return int(self.shape[dim])


def _sym_numel(self: Any) -> int:
    return int(math.prod(self.shape))


def _sym_storage_offset(self: Any) -> int:
    return 0


def _sym_stride(self: Any, dim: int) -> int:
    # Values inside a compiled function are contiguous.
    stride = 1
    for s in self.shape[dim + 1:]:
        stride *= int(s)
    return stride


#: Ops on sizes: evaluated in Python at trace time (sizes are static in jax).
SYMBOLIC: dict[str, Callable[..., Any]] = {
    "aten::sym_size.int": _sym_size,
    "aten::sym_numel": _sym_numel,
    "aten::sym_storage_offset": _sym_storage_offset,
    "aten::sym_stride.int": _sym_stride,
}

#: Checks the tracer already proved or that constrain symbolic sizes: nothing to compute.
NO_OP = frozenset({
    "aten::_assert_async", "aten::_assert_async.msg", "aten::_assert_scalar", "aten::sym_constrain_range",
    "aten::sym_constrain_range_for_size", "aten::_functional_sym_constrain_range",
    "aten::_functional_sym_constrain_range_for_size", "aten::_assert_tensor_metadata",
    "aten::record_stream",
})


# ------------------------------------------------------------ sharding


@_reg("pjrt_host::sharding_constraint")
def _sharding_constraint(out: Out, key: Any, x: Any, mesh: str, spec: str) -> Any:
    # pjrt_host.spmd.mark_sharding / with_sharding_constraint inside a compiled function.
    return jax.lax.with_sharding_constraint(x, _device.constraint_sharding(mesh, spec))


# ------------------------------------------------------------ this package's own ops

#: Ops whose arguments are passed as they are (no ``out``, no key): a JAX
#: function called from torch (:mod:`._jax_ops`), by its handle.
OPAQUE: dict[str, Callable[..., Any]] = {
    "pjrt_host::call_jax": lambda args, handle: _handles.get(handle).flat(list(args)),
    "pjrt_host::call_jax_vjp": lambda args, cts, handle: _handles.get(handle).vjp(list(args), list(cts)),
}
