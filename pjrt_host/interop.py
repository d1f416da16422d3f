"""PyTorch and JAX in one program, on the same device and the same arrays.

* :func:`jax_view` / :func:`torch_view`: 'jax' tensors <-> ``jax.Array``
  (no copy of device data), torch dtypes <-> jnp dtypes, functions wrapped
  so that a torch function takes and returns jax values (:func:`call_torch`)
  and a JAX function takes and returns torch tensors (:func:`call_jax`);
  pytrees of these are mapped element by element.
* :func:`call_jax`: a JAX function (a Pallas kernel, a jax library call) on
  'jax' tensors, as one cached jitted call and one torch autograd node whose
  backward is ``jax.vjp``'s.
* :func:`call_torch`: a torch function on jax values, traceable by JAX
  (``jax.jit``, ``jax.grad``, ``jax.vmap``).
* :func:`jax_jit`: a torch function as one ``jax.jit``, its outputs torch
  autograd nodes (the same as :func:`pjrt_host.assume_pure`).
* :func:`extract_jax`: an ``nn.Module`` as ``(params, fn)``, a pure JAX
  function of its parameters and buffers.

See docs/interop.md for when to use which and what "pure" means.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import jax
import torch

from ._jax_settings import x64_api as _x64_api
from ._compile import _door
from ._compile._as_jax import TorchAsJax
from ._compile._call_jax import cache_clear as call_jax_cache_clear
from ._compile._call_jax import cache_info as call_jax_cache_info
from ._compile._call_jax import call_jax
from ._compile._pure import CacheInfo, PureFunction, PurityError, assume_pure
from ._lowerings._dtypes import jax_dtype as _jax_dtype
from ._lowerings._dtypes import torch_dtype as _torch_dtype

__all__ = [
    "CacheInfo", "PurityError", "assume_pure", "call_jax", "call_jax_cache_clear", "call_jax_cache_info",
    "call_torch", "extract_jax", "jax_jit", "jax_view", "torch_view",
]


# ---------------------------------------------------------------- views


def _is_tensor(x: Any) -> bool:
    return isinstance(x, torch.Tensor)


def _jax_view_leaf(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        if type(x) is _door.JaxTensor:
            return _door.read(x)
        raise TypeError(
            f"pjrt_host.interop.jax_view: a tensor on {x.device} (shape {tuple(x.shape)}, {x.dtype}) has no jax "
            f"array; only '{_door.DEVICE_NAME}' tensors do. Move it first: t.to('{_door.DEVICE_NAME}').")
    if isinstance(x, torch.dtype):
        return _jax_dtype(_door.device_dtype(x))
    if isinstance(x, torch.nn.Module) or isinstance(x, type):
        return x
    if callable(x):
        return _torch_fn_as_jax(x)
    return x


@_x64_api
def jax_view(tree: Any) -> Any:
    """The JAX view of a pytree: each 'jax' tensor as its ``jax.Array`` (the
    same device buffer for a tensor that is its whole storage; a view's
    values are gathered into a new array), each torch dtype as the jnp
    dtype, each torch function as a JAX function (:func:`call_torch`).
    ``nn.Module`` objects are left as they are (see :func:`extract_jax`)."""
    return jax.tree_util.tree_map(_jax_view_leaf, tree, is_leaf=_is_tensor)


def _torch_view_leaf(x: Any) -> Any:
    if isinstance(x, jax.Array):
        return _array_to_tensor(x)
    if _is_jax_dtype(x):
        return _torch_dtype(jax.numpy.dtype(x))
    if callable(x) and not isinstance(x, (type, torch.nn.Module)):
        return _jax_fn_as_torch(x)
    return x


def _is_jax_dtype(x: Any) -> bool:
    """A numpy dtype, or a jnp scalar type (``jnp.float32``)."""
    import numpy as np

    return isinstance(x, np.dtype) or (not isinstance(x, jax.Array) and isinstance(getattr(x, "dtype", None), np.dtype)
                                       and callable(x) and not hasattr(x, "__code__"))


@_x64_api
def torch_view(tree: Any) -> Any:
    """The torch view of a pytree: each ``jax.Array`` as a 'jax' tensor over
    the same buffer (an array on a device that is not the selected plugin's
    is copied to the current 'jax' device), each jnp dtype as the torch
    dtype, each JAX function as a torch function (:func:`call_jax`)."""
    return jax.tree_util.tree_map(_torch_view_leaf, tree)


def _array_to_tensor(a: jax.Array) -> torch.Tensor:
    if isinstance(a, jax.core.Tracer):
        raise TypeError("pjrt_host.interop.torch_view: got a JAX tracer (a value inside jax.jit/grad/vmap); torch "
                        "tensors hold concrete arrays. Use call_torch to run torch code inside a JAX transformation.")
    index = _door.index_of_array(a)
    if index is None:
        index = _door.current_index()
        a = jax.device_put(a, _door.jax_device(index))
    return _door.wrap(a, index, _torch_dtype(a.dtype))


def _jax_fn_as_torch(fn: Callable) -> Callable:
    @functools.wraps(fn)
    def torch_fn(*args: Any, **kwargs: Any) -> Any:
        return call_jax(fn, *args, **kwargs)

    return torch_fn


def _torch_fn_as_jax(fn: Callable) -> Callable:
    converted = TorchAsJax(fn, _name(fn))

    @functools.wraps(fn)
    def jax_fn(*args: Any, **kwargs: Any) -> Any:
        return converted(args, kwargs)

    return jax_fn


def _name(fn: Any) -> str:
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__name__


# ---------------------------------------------------------------- calls

_call_torch_cache: dict[Any, TorchAsJax] = {}


@_x64_api
def call_torch(fn: Callable, *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)``, a torch function, on JAX values: usable
    inside ``jax.jit``, ``jax.grad``, ``jax.vmap``.  Traced once per
    argument signature (the trace is cached per ``fn``)."""
    converted = _call_torch_cache.get(fn)
    if converted is None:
        converted = _call_torch_cache[fn] = TorchAsJax(fn, _name(fn))
    return converted(args, kwargs)


@_x64_api
def jax_jit(fn: Callable, kwargs_for_jax_jit: dict | None = None) -> PureFunction:
    """``fn``, a torch function, as one ``jax.jit`` per argument signature;
    its outputs are torch autograd nodes (trainable with torch.optim).  The
    same as :func:`pjrt_host.assume_pure`; non-tensor arguments are static
    automatically, so ``static_argnums`` is not needed."""
    if kwargs_for_jax_jit:
        raise TypeError(f"pjrt_host.interop.jax_jit: jax.jit options are not supported "
                        f"({', '.join(sorted(kwargs_for_jax_jit))}): non-tensor arguments are already static, and "
                        f"arguments written in place are written back rather than donated.")
    return assume_pure(fn)


@_x64_api
def extract_jax(module: torch.nn.Module) -> tuple[dict[str, jax.Array], Callable]:
    """``(params, fn)``: ``params`` maps each parameter and buffer name (tied
    weights once) to its ``jax.Array`` (no copy); ``fn(params, *args,
    rng=None, **kwargs)`` is the module's forward as a pure JAX function, for
    ``jax.jit``, ``jax.grad``, ``jax.vmap`` and optax.  Train-mode buffer
    updates (BatchNorm) cannot be returned by a pure function and are
    refused; ``rng`` (a key or a seed) feeds dropout and other random ops."""
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"pjrt_host.interop.extract_jax: expected an nn.Module, got {type(module).__name__}")
    state = dict(module.named_parameters())
    state.update(module.named_buffers())
    params = {k: _jax_view_leaf(v) for k, v in state.items()}
    name = type(module).__qualname__

    def functional(state: dict, training: tuple, *args: Any, **kwargs: Any) -> Any:
        from torch.nn.utils.stateless import _reparametrize_module

        with _reparametrize_module(module, state, tie_weights=True):
            return module(*args, **kwargs)

    converted = TorchAsJax(functional, name, what="extract_jax")
    converted.mutation_message = lambda where: (  # type: ignore[method-assign]
        f"pjrt_host.interop.extract_jax({name}): the module writes in place into {where.replace('argument 0', 'its state')} "
        f"(a BatchNorm's running statistics in train mode); a pure JAX function cannot return that write. Call "
        f"module.eval() before extract_jax, or train it with pjrt_host.assume_pure(module), which writes buffers back.")

    def fn(params: dict, *args: Any, rng: Any = None, **kwargs: Any) -> Any:
        training = tuple(m.training for m in module.modules())
        return converted((params, training) + args, kwargs, rng)

    fn.__name__ = f"{name}_jax"
    return params, fn
