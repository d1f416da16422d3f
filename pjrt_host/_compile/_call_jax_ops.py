"""The torch ops ``pjrt_host::call_jax`` and ``pjrt_host::call_jax_vjp``.

They carry a :mod:`._handles` number naming the JAX function, so that
``call_jax`` is one node of a traced torch graph: fake tensors get their
shapes from ``jax.eval_shape``, autograd's backward is ``call_jax_vjp``, the
graph interpreter runs both as the jax function itself (see
:mod:`._graph_ops`), and a graph run op by op runs them eagerly here.
Defined on first use of ``call_jax`` inside a trace.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

import jax
import torch

from .._lowerings._dtypes import torch_dtype
from .. import _program_cache
from . import _door, _handles

__all__ = ["call"]


def _specs(tensors: list) -> list:
    return [jax.ShapeDtypeStruct(tuple(t.shape), _door.jax_dtype_of(t.dtype)) for t in tensors]


def _device_of(tensors: list) -> torch.device:
    for t in tensors:
        return t.device
    return _door.torch_device(_door.current_index())


@torch.library.custom_op("pjrt_host::call_jax", mutates_args=())
def call_jax_op(args: list[torch.Tensor], handle: int) -> list[torch.Tensor]:
    return _eager(_jitted(handle, "fwd"), args, [])


@call_jax_op.register_fake
def _call_jax_fake(args: list[torch.Tensor], handle: int) -> list[torch.Tensor]:
    out = jax.eval_shape(_handles.get(handle).flat, _specs(args))
    device = _device_of(args)
    return [torch.empty(tuple(o.shape), dtype=torch_dtype(o.dtype), device=device) for o in out]


@torch.library.custom_op("pjrt_host::call_jax_vjp", mutates_args=())
def call_jax_vjp_op(args: list[torch.Tensor], cotangents: list[torch.Tensor], handle: int) -> list[torch.Tensor]:
    return _eager(_jitted(handle, "vjp"), args, cotangents)


@call_jax_vjp_op.register_fake
def _call_jax_vjp_fake(args: list[torch.Tensor], cotangents: list[torch.Tensor], handle: int) -> list[torch.Tensor]:
    return [torch.empty_like(a) for a in args]


def _setup(ctx: Any, inputs: tuple, output: Any) -> None:
    args, handle = inputs
    ctx.save_for_backward(*args)
    ctx.handle = handle
    ctx.outs = [(tuple(o.shape), o.dtype) for o in output]


def _backward(ctx: Any, grads: list) -> Any:
    args = list(ctx.saved_tensors)
    cts = []
    for g, (shape, dtype) in zip(grads, ctx.outs):
        if not (dtype.is_floating_point or dtype.is_complex):
            continue
        cts.append(g if g is not None else torch.zeros(shape, dtype=dtype, device=_device_of(args)))
    result = call_jax_vjp_op(args, cts, ctx.handle)
    return [g if a.requires_grad else None for g, a in zip(result, args)], None


call_jax_op.register_autograd(_backward, setup_context=_setup)


_jit_lock = threading.Lock()
_jits: dict[tuple[int, str], Any] = {}


def _jitted(handle: int, what: str) -> Callable:
    fn = _jits.get((handle, what))
    if fn is None:
        call = _handles.get(handle)
        fn = _program_cache.jit(call.flat if what == "fwd" else call.vjp)
        with _jit_lock:
            _jits[(handle, what)] = fn
    return fn


def _eager(fn: Callable, args: list, cotangents: list) -> list:
    """Run the op on real 'jax' tensors (a graph run op by op)."""
    index = _door.device_index(args[0]) if args else _door.current_index()
    arrays = [_door.read(a) for a in args]
    if cotangents:
        outs = fn(arrays, [_door.read(c) for c in cotangents])
    else:
        outs = fn(arrays)
    return [_door.wrap(o, index, torch_dtype(o.dtype)) for o in outs]


def call(fn: Callable, args: tuple, kwargs: dict) -> Any:
    """``fn(*args, **kwargs)`` as one ``pjrt_host::call_jax`` op."""
    leaves, treedef = jax.tree_util.tree_flatten((args, kwargs))
    tensors = []
    statics = []
    for pos, leaf in enumerate(leaves):
        if isinstance(leaf, torch.Tensor):
            tensors.append(leaf)
        else:
            statics.append((pos, leaf))
    handle = _handles.handle_for(fn, treedef, tuple(statics))
    outs = call_jax_op(tensors, handle)
    return jax.tree_util.tree_unflatten(_handles.get(handle).out_treedef, list(outs))
