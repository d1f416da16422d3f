"""What an FX graph holds besides ATen ops with lowerings: the ops on
symbolic sizes, checks with nothing to compute, this package's own ops
(``call_jax``, ``sharding_constraint``).

Factories, random factories, copies and casts are lowerings like every
other op (``_lowerings.ops_factories``), shared with eager; nothing here
draws random numbers.  A handler here gets ``out`` (the (shape, jax dtype)
torch's fake tensor gives for the node's result), then the node's arguments
with tensors replaced by jax values.
"""

from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple

import jax

from . import _door, _handles

__all__ = ["GraphOp", "HANDLERS", "NO_OP", "OPAQUE", "SYMBOLIC"]


class GraphOp(NamedTuple):
    fn: Callable[..., Any]


class Out(NamedTuple):
    shape: tuple[int, ...]
    dtype: Any


HANDLERS: dict[str, GraphOp] = {}


def _reg(*names: str) -> Callable[[Callable], Callable]:
    def deco(fn: Callable) -> Callable:
        for name in names:
            HANDLERS[name] = GraphOp(fn)
        return fn

    return deco


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
def _sharding_constraint(out: Out, x: Any, mesh: str, spec: str) -> Any:
    # pjrt_host.spmd.mark_sharding / with_sharding_constraint inside a compiled function.
    return jax.lax.with_sharding_constraint(x, _door.constraint_sharding(mesh, spec))


# ------------------------------------------------------------ this package's own ops

#: Ops whose arguments are passed as they are (no ``out``): a JAX
#: function called from torch (:mod:`._call_jax_ops`), by its handle.
OPAQUE: dict[str, Callable[..., Any]] = {
    "pjrt_host::call_jax": lambda args, handle: _handles.get(handle).flat(list(args)),
    "pjrt_host::call_jax_vjp": lambda args, cts, handle: _handles.get(handle).vjp(list(args), list(cts)),
}
