"""'jax' tensors as the 'pjrt' backend handles them: which tensors are
its, and their values read and written in place (views included)."""

from __future__ import annotations

from typing import Any

import torch

from .._devices import DEVICE_NAME

__all__ = ["is_jax", "read", "write"]


def is_jax(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.device.type == DEVICE_NAME


def read(t: torch.Tensor) -> Any:
    """The tensor's values as a jax array on its device."""
    from .. import _tensor

    return _tensor.read(t.detach())


def write(t: torch.Tensor, value: Any) -> None:
    """Put ``value`` into ``t`` (into the elements a view covers)."""
    from .. import _tensor

    _tensor.write(t.detach() if t.requires_grad else t, value)
