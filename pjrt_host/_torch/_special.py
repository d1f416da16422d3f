"""Ops the dispatcher handles itself, because they are about the tensor and
its storage rather than math: copies between devices, ``_to_copy``, reading
a scalar, cloning (free: jax arrays are immutable), lifting constants."""

from __future__ import annotations

import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import torch

from .._lowerings._dtypes import jax_dtype
from . import DEVICE_NAME, _conversion, _device_module, _device_table, _dispatch, _tensor
from ._tensor import JaxTensor, Storage, make

__all__ = ["HANDLERS"]


def _target_index(device: torch.device) -> int:
    return _device_module.current_device() if device.index is None else device.index


def to_copy(func: Any, args: tuple, kwargs: dict) -> Any:
    self = args[0]
    dtype = kwargs.get("dtype") or self.dtype
    device = kwargs.get("device")
    device = self.device if device is None else torch.device(device)
    if not isinstance(self, JaxTensor):
        # A torch tensor coming to the device (torch.tensor(data, device='jax')).
        index = _target_index(device)
        dtype = _dispatch.device_dtype(dtype)
        return _dispatch.wrap_array(_conversion.to_jax_array(self, index, dtype), index, dtype)
    if device.type != DEVICE_NAME:
        return _conversion.to_torch(self, device, dtype)
    index = _target_index(device)
    dtype = _dispatch.device_dtype(dtype)
    arr = _dispatch.read(self)
    if arr.dtype != jax_dtype(dtype):
        arr = _cast(arr, dtype)
    if index != self._st.index:
        arr = jax.device_put(arr, _device_table.device(index))
    return _dispatch.wrap_array(arr, index, dtype)


_cast_cache: dict[Any, Any] = {}


def _cast(arr: Any, dtype: torch.dtype) -> Any:
    fn = _cast_cache.get(dtype)
    if fn is None:
        jd = jax_dtype(dtype)
        fn = _cast_cache[dtype] = jax.jit(lambda a: a.astype(jd))
    return fn(arr)


def copy_(func: Any, args: tuple, kwargs: dict) -> Any:
    dst, src = args[0], args[1]
    if not isinstance(dst, JaxTensor):
        # A torch tensor (CPU, ...) receiving a 'jax' tensor's values.
        value = _conversion.to_torch(src, dst.device)
        return dst.copy_(value)
    index = dst._st.index
    if isinstance(src, JaxTensor):
        value = _dispatch.read(src)
        if src._st.index != index:
            value = jax.device_put(value, _device_table.device(index))
    elif isinstance(src, torch.Tensor):
        value = _conversion.to_jax_array(src, index, _dispatch.device_dtype(src.dtype))
    else:
        value = jnp.asarray(src)
    shape = tuple(dst.shape)
    if tuple(value.shape) != shape:
        try:
            np.broadcast_shapes(tuple(value.shape), shape)
        except ValueError:
            raise RuntimeError(
                f"The size of tensor a ({shape[-1] if shape else 1}) must match the size of tensor b "
                f"({value.shape[-1] if value.shape else 1}) at non-singleton dimension") from None
        if dst._vw is None:
            value = jnp.broadcast_to(value, shape)
    _dispatch.write(dst, value)
    return dst


def local_scalar_dense(func: Any, args: tuple, kwargs: dict) -> Any:
    value = np.asarray(_dispatch.read(args[0])).item()
    dtype = args[0].dtype
    if dtype == torch.bool:
        return bool(value)
    if dtype.is_floating_point:
        return float(value)
    if dtype.is_complex:
        return complex(value)
    return int(value)


def clone(func: Any, args: tuple, kwargs: dict) -> Any:
    self = args[0]
    st = self._st
    if self._vw is None:
        # jax arrays never change: the clone shares the array until one of
        # the two is written (a write replaces the storage's array).
        return make(Storage(st.array, st.shape, st.jdtype, st.index), tuple(self.shape), self.dtype)
    return _dispatch.wrap_array(_dispatch.read(self), st.index, self.dtype)


def lift_fresh(func: Any, args: tuple, kwargs: dict) -> Any:
    return args[0]


def is_pinned(func: Any, args: tuple, kwargs: dict) -> Any:
    return False


def resize_(func: Any, args: tuple, kwargs: dict) -> Any:
    """torch's resize_ within the tensor's storage (same or fewer elements):
    a contiguous reinterpretation of the same values, as on CPU.  Growing a
    'jax' tensor in place is not supported (torch's metadata of a tensor
    without torch storage cannot grow past it)."""
    self, size = args[0], tuple(args[1])
    if tuple(self.shape) == size:
        return self
    offset = self.storage_offset()
    if offset + math.prod(size) > self._st.numel:
        raise NotImplementedError(
            f"pjrt_host: growing a 'jax' tensor in place (resize_ from {tuple(self.shape)} to {size}) is not "
            "supported; make a new tensor instead (e.g. pass no out= argument)")
    strides = _tensor.contiguous_strides(size)
    return _dispatch.run_inplace_view(torch.ops.aten.as_strided_.default, (self, size, strides, offset), {})


def record_stream(func: Any, args: tuple, kwargs: dict) -> Any:
    return None


def set_(func: Any, args: tuple, kwargs: dict) -> Any:
    self = args[0]
    if len(args) >= 2 and isinstance(args[1], JaxTensor) and len(args) == 2:
        src = args[1]
        if tuple(src.shape) == tuple(self.shape) and src.dtype == self.dtype:
            self._st = src._st
            self._vw = src._vw
            return self
    raise NotImplementedError("pjrt_host: tensor.set_() is only supported between 'jax' tensors of one shape")


HANDLERS: dict[str, Callable[[Any, tuple, dict], Any]] = {
    "aten::_to_copy": to_copy,
    "aten::copy_": copy_,
    "aten::_local_scalar_dense": local_scalar_dense,
    "aten::item": local_scalar_dense,  # reached directly in inference mode
    "aten::clone": clone,
    "aten::lift_fresh": lift_fresh,
    "aten::is_pinned": is_pinned,
    "aten::resize_": resize_,
    "aten::record_stream": record_stream,
    "aten::set_.source_Tensor": set_,
}


# ---------------------------------------------------------------- *_like / new_*

_LIKE = {
    "aten::zeros_like": lambda shape, a, kw: torch.zeros(shape, **kw),
    "aten::ones_like": lambda shape, a, kw: torch.ones(shape, **kw),
    "aten::empty_like": lambda shape, a, kw: torch.empty(shape, **kw),
    "aten::full_like": lambda shape, a, kw: torch.full(shape, a[1], **kw),
    "aten::rand_like": lambda shape, a, kw: torch.rand(shape, **kw),
    "aten::randn_like": lambda shape, a, kw: torch.randn(shape, **kw),
    "aten::new_empty": lambda shape, a, kw: torch.empty(shape, **kw),
    "aten::new_empty_strided": lambda shape, a, kw: torch.empty(shape, **kw),
    "aten::new_zeros": lambda shape, a, kw: torch.zeros(shape, **kw),
    "aten::new_ones": lambda shape, a, kw: torch.ones(shape, **kw),
    "aten::new_full": lambda shape, a, kw: torch.full(shape, a[2], **kw),
}


def _like(func: Any, args: tuple, kwargs: dict) -> Any:
    self = args[0]
    name = func.name()
    device = kwargs.get("device")
    device = self.device if device is None else torch.device(device)
    mkw = {k: v for k, v in kwargs.items() if k not in ("device", "pin_memory", "memory_format", "generator")}
    margs = (_dispatch._meta_view_of(self),) + tuple(args[1:])
    meta = func(*margs, device="meta", **mkw)
    kw = {"dtype": meta.dtype, "device": device}
    if "generator" in kwargs:
        kw["generator"] = kwargs["generator"]
    return _LIKE[name](tuple(meta.shape), args, kw)


for _name in _LIKE:
    HANDLERS[_name] = _like


# ---------------------------------------------------------------- batch norm

_bn_plain: dict[Any, Any] = {}


def native_batch_norm(func: Any, args: tuple, kwargs: dict) -> Any:
    # native_batch_norm updates running_mean / running_var in training, but
    # its schema does not say so (no alias annotation): its lowering is
    # functional, so the update is done here, as torch CPU does it.
    bound = dict(zip(("input", "weight", "bias", "running_mean", "running_var", "training", "momentum", "eps"),
                     args))
    bound.update(kwargs)
    rm, rv = bound.get("running_mean"), bound.get("running_var")
    if not bound.get("training") or rm is None or rv is None:
        handler = _bn_plain.get(func)
        if handler is None:
            handler = _bn_plain[func] = _dispatch._make_handler_generic(func)
        return handler(args, kwargs)
    functional = torch.ops.aten._native_batch_norm_legit_functional.default
    out, mean, rstd, new_rm, new_rv = functional(
        bound["input"], bound.get("weight"), bound.get("bias"), rm, rv, True, bound["momentum"], bound["eps"])
    with torch.no_grad():
        rm.copy_(new_rm)
        rv.copy_(new_rv)
    return out, mean, rstd


HANDLERS["aten::native_batch_norm"] = native_batch_norm
