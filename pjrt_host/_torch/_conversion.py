"""Moving values between torch devices and the 'jax' device.

Every transfer makes exactly one copy: a torch tensor is mutable and a jax
array is not, so neither may alias the other.  When the plugin lists the
torch device in ``zero_copy_torch_devices``, the copy is a torch clone on
that device and the clone is handed over through DLPack (no host round
trip); otherwise the data goes through host memory once.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
import torch

from .._lowerings._dtypes import jax_dtype
from . import _device_table
from ._tensor import JaxTensor

__all__ = ["read", "to_jax_array", "to_torch", "to_numpy"]


def read(t: JaxTensor) -> Any:
    from . import _dispatch

    return _dispatch.read(t)


_zero_copy: tuple[str, ...] | None = None


def zero_copy_devices() -> tuple[str, ...]:
    global _zero_copy
    if _zero_copy is None:
        from .. import _runtime

        _zero_copy = tuple(getattr(_runtime.plugin(), "zero_copy_torch_devices", ()) or ())
    return _zero_copy


def to_jax_array(t: torch.Tensor, index: int, dtype: torch.dtype | None = None) -> Any:
    """A jax array on device ``index`` with the values of torch tensor ``t``
    (cast to ``dtype`` if given), made with one copy."""
    t = t.detach()
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    if dtype is not None and dtype != t.dtype:
        t = t.to(dtype)
    target = _device_table.device(index)
    if t.device.type in zero_copy_devices():
        try:
            arr = jax.dlpack.from_dlpack(t.clone(memory_format=torch.contiguous_format))
            if arr.devices() != {target}:
                arr = jax.device_put(arr, target)
            return arr
        except Exception:
            pass  # e.g. a dtype DLPack does not carry: the host path below
    host = t.cpu() if t.device.type != "cpu" else t
    host = host.contiguous()
    if host.dtype == torch.bfloat16:
        np_value = host.view(torch.int16).numpy().view(jax_dtype(torch.bfloat16))
    else:
        np_value = host.numpy()
    return jax.device_put(np_value, target, may_alias=False)


def to_torch(t: JaxTensor, device: torch.device, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A torch tensor on ``device`` (not 'jax') with the values of ``t``."""
    arr = read(t)
    if device.type in zero_copy_devices():
        try:
            out = torch.from_dlpack(arr)
            if out.device != device and device.index is not None:
                out = out.to(device)
            out = out.clone()
            return out if dtype is None else out.to(dtype)
        except Exception:
            pass
    host = np.asarray(arr)
    if t.dtype == torch.bfloat16:
        out = torch.from_numpy(host.view(np.int16).copy()).view(torch.bfloat16)
    else:
        out = torch.from_numpy(np.array(host, copy=True))
    if out.dtype != t.dtype:
        out = out.to(t.dtype)
    if device.type != "cpu":
        out = out.to(device)
    return out if dtype is None else out.to(dtype)


def to_numpy(t: JaxTensor) -> np.ndarray:
    if t.dtype == torch.bfloat16:
        return t.cpu().numpy()  # raises torch's own TypeError
    return np.array(read(t), copy=True)


def _wrap_result(array: Any, like: JaxTensor) -> JaxTensor:
    """A 'jax' tensor holding ``array`` (a collective's result) on ``like``'s
    device."""
    from .._lowerings._dtypes import torch_dtype
    from ._tensor import Storage, make

    shape = tuple(array.shape)
    return make(Storage(array, shape, array.dtype, like._st.index), shape, torch_dtype(array.dtype))


def _register_with_collectives() -> None:
    # pjrt_host.distributed's collectives take 'jax' tensors as they are.
    from .. import _collectives

    _collectives.register_array_type(JaxTensor, to_jax=read, from_jax=_wrap_result)


_register_with_collectives()
