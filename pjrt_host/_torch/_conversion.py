"""Moving values between torch devices and the 'jax' device.

Every transfer makes exactly one copy: a torch tensor is mutable and a jax
array is not, so neither may alias the other.  When the plugin lists the
torch device in ``zero_copy_torch_devices``, the copy is a torch clone on
that device and the clone is handed over through DLPack (no host round
trip); otherwise the data goes through host memory once.

Through host memory a tensor becomes a numpy array of jax's dtype over its
bytes, never a conversion of values, so every dtype both hold moves
bit-exactly (NaN payloads, negative zero, subnormals).  Where torch's numpy
bridge gives jax's dtype, it is used as it is; where it has none (bfloat16,
the float8s: numpy lacks them, jax takes them from ml_dtypes), the tensor
is read as uint8 and the bytes re-read as the jax dtype (and back).
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
import torch

from .. import _runtime
from . import _padding
from .._lowerings._dtypes import jax_dtype, torch_dtype
from ._devices import jax_device
from ._sync import names_failed_collectives, run_deferred_checks
from ._tensor import JaxTensor, read

__all__ = ["host_array", "to_jax_array", "to_torch", "zero_copy_devices"]

_zero_copy: tuple[str, ...] | None = None


def zero_copy_devices() -> tuple[str, ...]:
    """torch device types the plugin exchanges arrays with through DLPack."""
    global _zero_copy
    if _zero_copy is None:
        _zero_copy = tuple(getattr(_runtime.plugin(), "zero_copy_torch_devices", ()) or ())
    return _zero_copy


def to_jax_array(t: torch.Tensor, index: int, dtype: torch.dtype | None = None, padded: tuple | None = None) -> Any:
    """A jax array on device ``index`` with the values of torch tensor ``t``
    (cast to ``dtype`` if given), made with one copy; laid out as
    ``padded`` (per dim its components, ``_padding``) where given -- on
    the host, on its way, for a host tensor."""
    given = t
    t = t.detach()
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    if dtype is not None and dtype != t.dtype:
        t = t.to(dtype)
    target = jax_device(index)
    if t.device.type != "cpu" and t.device.type in zero_copy_devices():
        try:
            _wait_at_exit()
            arr = jax.dlpack.from_dlpack(t.clone(memory_format=torch.contiguous_format))
            if arr.devices() != {target}:
                arr = jax.device_put(arr, target)
            return arr if padded is None else _padding.pad_as(arr, padded)
        except Exception:
            pass  # e.g. a dtype DLPack does not carry: the host path below
    host = t.cpu() if t.device.type != "cpu" else t
    value = host_array(host)
    if padded is not None:
        return jax.device_put(_padding.host_padded(value, padded), target)  # (a fresh copy: the device may keep it)
    if _keeps_host_memory(target):
        storage = given.untyped_storage()
        if 0 <= value.ctypes.data - storage.data_ptr() < storage.nbytes():
            value = value.copy()  # the one copy; the device keeps it, not the tensor's memory
    return jax.device_put(value, target, may_alias=False)


_waits_at_exit = False


def _wait_at_exit() -> None:
    """Once a torch tensor has been imported through DLPack: wait at exit,
    while Python still runs, for every live array of the plugin's devices, so
    that no program still reading an import ends during the interpreter's
    shutdown (module docstring)."""
    global _waits_at_exit
    if not _waits_at_exit:
        import atexit

        _waits_at_exit = True
        atexit.register(_wait_for_device_work)


def _wait_for_device_work() -> None:
    try:
        client = jax_device(0).client
        if len({d.process_index for d in client.devices()}) > 1:
            return  # a job's peer may be gone: a collective waited for would never end
        pending = [a for a in client.live_arrays() if not a.is_deleted()]
        jax.block_until_ready(pending)
    except Exception:  # at exit nothing is to be raised: a failed program has nothing left to say
        pass


# jax device -> whether device_put of a numpy array leaves the array using
# the numpy array's memory.  jaxlib's CPU client does that for a 64-byte
# aligned buffer (torch's CPU allocations are), may_alias=False
# notwithstanding (jax applies it to jax arrays only), so a write to the
# torch tensor afterwards would change the 'jax' one.  Learnt once per
# device by trying it.
_keeps: dict[Any, bool] = {}


def _keeps_host_memory(device: Any) -> bool:
    found = _keeps.get(device)
    if found is None:
        page = np.zeros(2 * 4096, np.uint8)
        start = -page.ctypes.data % 4096
        probe = page[start:start + 4096]
        arr = jax.device_put(probe, device, may_alias=False)
        arr.block_until_ready()
        probe[:] = 1
        found = _keeps[device] = bool(np.asarray(arr).any())
        del arr
    return found


# torch dtype -> (jax's numpy dtype, whether torch's numpy bridge gives
# exactly that dtype); learnt once per dtype by asking both libraries.
_host_dtypes: dict[torch.dtype, tuple[np.dtype, bool]] = {}


def _host_dtype(dtype: torch.dtype) -> tuple[np.dtype, bool]:
    found = _host_dtypes.get(dtype)
    if found is None:
        target = np.dtype(jax_dtype(dtype))  # the error naming a dtype jax cannot hold
        try:
            bridged = torch.empty(0, dtype=dtype).numpy().dtype == target
            bridged = bridged and torch.from_numpy(np.empty(0, target)).dtype == dtype
        except (TypeError, RuntimeError):
            bridged = False
        found = _host_dtypes[dtype] = (target, bridged)
    return found


def host_array(host: torch.Tensor) -> np.ndarray:
    """A numpy array of the jax dtype over the bytes of CPU tensor ``host``
    (no copy when it is contiguous)."""
    target, bridged = _host_dtype(host.dtype)
    if bridged:
        return host.contiguous().numpy()
    # 1-d with stride 1 (a 0-d array cannot change its item size; a size-1
    # dimension of a contiguous tensor may have any stride)
    flat = host.contiguous().as_strided((host.numel(),), (1,))
    return flat.view(torch.uint8).numpy().view(target).reshape(tuple(host.shape))


def _host_tensor(host: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """A CPU tensor of ``dtype`` (the torch dtype of ``host``'s jax dtype)
    with a copy of the bytes of numpy array ``host``."""
    if _host_dtype(dtype)[1]:
        return torch.from_numpy(np.array(host, copy=True))
    if host.size == 0:  # torch.from_numpy gives an empty array stride 0, which view(dtype) refuses
        return torch.empty(host.shape, dtype=dtype)
    flat = np.ascontiguousarray(host).reshape(-1)
    return torch.from_numpy(flat.view(np.uint8).copy()).view(dtype).reshape(host.shape)


#: A view of a padded storage of at most this many bytes is read to the
#: host whole and cut there (no program per size); of a larger one, only
#: the view's values are computed on the device and moved.
HOST_CUT_BYTES = 16 << 20


@names_failed_collectives
def to_torch(t: JaxTensor, device: torch.device, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A torch tensor on ``device`` (not 'jax') with the values of ``t``."""
    storage = t._storage
    view = t._view
    if storage.padded is not None and device.type == "cpu" and type(storage.place) is int and (
            view is None or (view.elem is None and storage.computed().nbytes <= HOST_CUT_BYTES)):
        # cut on the host, where it costs no program per size (a view of
        # it, generate()'s new tokens out[0, n:], read through its logical
        # strides there)
        run_deferred_checks()
        out = _host_tensor(_padding.host_cut(np.asarray(storage.computed()), storage.padded, storage.shape),
                           torch_dtype(storage._array.dtype))
        if view is not None:
            out = out.as_strided(tuple(t.shape), t.stride(), t.storage_offset()).clone()
        if out.dtype != t.dtype:
            out = out.to(t.dtype)
        return out if dtype is None else out.to(dtype)
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
    out = _host_tensor(np.asarray(arr), torch_dtype(arr.dtype))
    if out.dtype != t.dtype:
        out = out.to(t.dtype)
    if device.type != "cpu":
        out = out.to(device)
    return out if dtype is None else out.to(dtype)
