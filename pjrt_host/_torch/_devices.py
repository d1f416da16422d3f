"""'jax:N' <-> the selected plugin's N-th jax device, and the current device.

The bottom of the torch device's layers: every other module asks here which
device an argument means (:func:`device_index`, the one normaliser, as
torch's ``_normalization_device`` is for its built-in backends) and which
jax device an index is (:func:`jax_device`, which creates the client on
first use).  Importing this module is cheap (no jax): ``torch.jax`` and
autoload use it.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import torch

from .. import _jax_settings, _runtime
from . import DEVICE_NAME

__all__ = [
    "DEVICE_NAME", "count", "current_index", "device_index", "device_mismatch", "jax_device", "set_current_index",
    "sharding", "torch_device",
]

_local = threading.local()
_torch_devices: dict[int, torch.device] = {}
_shardings: dict[int, Any] = {}


def current_index() -> int:
    """Index of the device that device='jax' (no index) means in this thread."""
    return getattr(_local, "index", 0)


def set_current_index(index: int) -> None:
    _local.index = index


def device_index(device: Any) -> int:
    """The index that ``device`` (None, an int, 'jax', 'jax:N' or a
    torch.device of type 'jax') means; None and 'jax' mean the current one."""
    if device is None:
        return current_index()
    if isinstance(device, int):
        return device
    if isinstance(device, str):
        device = torch.device(device)
    if isinstance(device, torch.device):
        if device.type != DEVICE_NAME:
            raise ValueError(f"Expected a '{DEVICE_NAME}' device, but got: {device}")
        return current_index() if device.index is None else device.index
    raise TypeError(f"Expected an int, str or torch.device, got {type(device).__name__}")


def torch_device(index: int) -> torch.device:
    dev = _torch_devices.get(index)
    if dev is None:
        dev = _torch_devices[index] = torch.device(DEVICE_NAME, index)
    return dev


_jax_devices: list[Any] | None = None
_forked_count: int | None = None  # in a fork() child: how many devices the parent had


def _all() -> list[Any]:
    global _jax_devices
    if _jax_devices is None:
        devs = _runtime.devices()  # creates the client; raises in a fork() child of a process with one
        _jax_settings.enable_x64()  # torch keeps int64 and float64 as they are: jax must too
        _jax_devices = devs
    return _jax_devices


def count() -> int:
    """Number of the selected plugin's devices (creates the client).  In a
    fork() child it is the parent's count, as torch.cuda.device_count() is
    there; using a device raises."""
    if _forked_count is not None and _runtime.in_bad_fork():
        return _forked_count
    return len(_all())


def _after_fork_in_child() -> None:
    # The parent's jax devices belong to a client the child cannot use: ask
    # the runtime again, which raises its fork() error.
    global _jax_devices, _forked_count
    if _jax_devices is not None:
        _forked_count = len(_jax_devices)
    _jax_devices = None
    _shardings.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)


def jax_device(index: int) -> Any:
    devs = _all()
    if not 0 <= index < len(devs):
        raise RuntimeError(
            f"Invalid device '{DEVICE_NAME}:{index}': the selected plugin has {len(devs)} device(s) "
            f"({DEVICE_NAME}:0 ... {DEVICE_NAME}:{len(devs) - 1})")
    return devs[index]


def sharding(index: int) -> Any:
    """The jax sharding that places an array on device ``index``."""
    s = _shardings.get(index)
    if s is None:
        import jax

        s = _shardings[index] = jax.sharding.SingleDeviceSharding(jax_device(index))
    return s


def device_mismatch(a: Any, b: Any) -> RuntimeError:
    """torch's own error for operands on two devices (a, b: torch devices)."""
    return RuntimeError(
        f"Expected all tensors to be on the same device, but found at least two devices, {a} and {b}!")
