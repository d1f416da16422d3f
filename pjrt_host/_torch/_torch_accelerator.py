"""``torch.accelerator`` answers for the 'jax' device.

torch's device-generic API asks the accelerator's C++ allocator for memory
figures (``Allocator for jax is not a DeviceAllocator``: an internal assert)
and its C++ device guard for synchronisation.  A Python backend can
register neither, so while 'jax' is torch's current accelerator these
functions of ``torch.accelerator`` answer from ``torch.jax`` instead, with
torch's signatures; with any other accelerator they are torch's own,
untouched (the wrappers call the originals).

Installed once at autoload (no jax import); listed in
``_patches.INVENTORY``.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import torch

from ._boot import _torch_jax
from ._devices import DEVICE_NAME

__all__ = ["FUNCTIONS", "wrap"]


def _ours() -> bool:
    acc = torch._C._accelerator_getAccelerator()
    return acc is not None and acc.type == DEVICE_NAME


def _index(device: Any) -> Any:
    if device is None:
        return None
    if isinstance(device, int):
        return device
    device = torch.device(device)
    if device.type != DEVICE_NAME:
        raise ValueError(f"{device} doesn't match the current accelerator {DEVICE_NAME}.")
    return device.index if device.index is not None else None


def _memory_info(device: Any = None) -> tuple[int, int]:
    return _torch_jax.mem_get_info(_index(device))


def _empty_cache() -> None:
    _torch_jax.empty_cache()


def _reset_accumulated(device: Any = None) -> None:
    pass  # the device keeps no accumulated counters beyond the peak


def _synchronize(device: Any = None) -> None:
    _torch_jax.synchronize(_index(device))


def _with_index(fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
    return lambda device=None: fn(_index(device))


#: torch.accelerator function -> what answers it on 'jax'.
FUNCTIONS: dict[str, Callable[..., Any]] = {
    "memory_allocated": _with_index(_torch_jax.memory_allocated),
    "max_memory_allocated": _with_index(_torch_jax.max_memory_allocated),
    "memory_reserved": _with_index(_torch_jax.memory_reserved),
    "max_memory_reserved": _with_index(_torch_jax.max_memory_reserved),
    "memory_stats": _with_index(_torch_jax.memory_stats),
    "reset_peak_memory_stats": _with_index(_torch_jax.reset_peak_memory_stats),
    "reset_accumulated_memory_stats": _reset_accumulated,
    "get_memory_info": _memory_info,
    "empty_cache": _empty_cache,
    "synchronize": _synchronize,
}
# current_stream / set_stream stay torch's: dynamo calls current_stream while
# tracing and needs torch's own Stream type back (torch.jax.current_stream()
# gives the one whose synchronize() waits).


def wrap(name: str) -> Callable[[Any], Any]:
    """The maker of the wrapper of ``torch.accelerator.<name>`` (one of
    :data:`FUNCTIONS`): ours for 'jax', torch's original otherwise
    (``_patches`` installs it, in ``torch.accelerator.memory`` too)."""
    ours = FUNCTIONS[name]

    def make(original: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if _ours():
                return ours(*args, **kwargs)
            return original(*args, **kwargs)

        return functools.wraps(original)(wrapper)

    return make
