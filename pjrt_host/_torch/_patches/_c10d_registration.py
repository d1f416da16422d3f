"""The 'pjrt' backend's registration with torch.distributed."""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from .._devices import DEVICE_NAME
from .._c10d._group import BACKEND_NAME, ProcessGroupJax

__all__ = ["register"]

_registered = False


def register() -> None:
    """Register the backend for the 'jax' device and make it the device's
    default (``init_process_group()`` with no backend).  Cheap: nothing of
    jax is imported until a group meets on 'jax' tensors.  Idempotent."""
    global _registered
    if _registered:
        return
    dist.Backend.register_backend(BACKEND_NAME, _create, extended_api=True, devices=[DEVICE_NAME, "cpu"])
    dist.Backend.default_device_backend_map[DEVICE_NAME] = BACKEND_NAME
    _registered = True


def _create(options: Any, backend_options: Any) -> ProcessGroupJax:
    return ProcessGroupJax(options.store, options.group_rank, options.group_size, options.timeout,
                           list(options.global_ranks_in_group or range(options.group_size)))
