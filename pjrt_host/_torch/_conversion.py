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

from .. import _runtime
from .._lowerings._dtypes import jax_dtype
from ._devices import jax_device
from ._tensor import JaxTensor, read, run_deferred_checks

__all__ = ["to_jax_array", "to_torch", "zero_copy_devices"]

_zero_copy: tuple[str, ...] | None = None


def zero_copy_devices() -> tuple[str, ...]:
    """torch device types the plugin exchanges arrays with through DLPack."""
    global _zero_copy
    if _zero_copy is None:
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
    target = jax_device(index)
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
    run_deferred_checks()  # a synchronisation point: errors found on the device surface here
    if device.type in zero_copy_devices():
        # Wait first: a result whose computation failed (out of memory) then
        # raises here, where exporting it through DLPack would abort the
        # process (jaxlib checks the buffer is concrete).
        arr.block_until_ready()
        try:
            out = torch.from_dlpack(arr)
            if out.device != device and device.index is not None:
                out = out.to(device)
            out = out.clone()
            return out if dtype is None else out.to(dtype)
        except Exception:
            pass
    if type(t._storage.place) is not int and not arr.is_fully_addressable:
        # Sharded over several processes' devices: every process gathers the whole.
        from jax.experimental import multihost_utils

        arr = multihost_utils.process_allgather(arr, tiled=True)
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
