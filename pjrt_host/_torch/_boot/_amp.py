"""``torch.jax.amp``: torch.cuda.amp's names for the 'jax' device.

``torch.cuda.amp.autocast`` / ``GradScaler`` / ``custom_fwd`` /
``custom_bwd`` are deprecated aliases of ``torch.amp``'s with device
'cuda'; these are the same aliases with device 'jax', deprecated the same
way (a FutureWarning naming the ``torch.amp`` call to use), so code written
for ``torch.cuda.amp`` runs with the device name changed.  Registered as
``torch.jax.amp`` (attribute and module, so ``from torch.jax.amp import
autocast`` works) at autoload; imports nothing but torch.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

import torch

from .._devices import DEVICE_NAME

__all__ = ["GradScaler", "amp_definitely_not_available", "autocast", "custom_bwd", "custom_fwd"]


def _deprecated(old: str, new: str) -> None:
    warnings.warn(f"`torch.{DEVICE_NAME}.amp.{old}` is deprecated. Please use `{new}` instead.", FutureWarning,
                  stacklevel=3)


class autocast(torch.amp.autocast_mode.autocast):
    """``torch.amp.autocast('jax', ...)`` with torch.cuda.amp.autocast's
    signature and defaults (float16).  Deprecated as torch.cuda.amp's is."""

    def __init__(self, enabled: bool = True, dtype: torch.dtype = torch.float16, cache_enabled: bool = True) -> None:
        _deprecated("autocast(args...)", f"torch.amp.autocast('{DEVICE_NAME}', args...)")
        super().__init__(DEVICE_NAME, enabled=enabled, dtype=dtype, cache_enabled=cache_enabled)


class GradScaler(torch.amp.GradScaler):
    """``torch.amp.GradScaler('jax', ...)`` with torch.cuda.amp.GradScaler's
    signature.  Deprecated as torch.cuda.amp's is."""

    def __init__(self, init_scale: float = 2.0 ** 16, growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 2000, enabled: bool = True) -> None:
        _deprecated("GradScaler(args...)", f"torch.amp.GradScaler('{DEVICE_NAME}', args...)")
        super().__init__(DEVICE_NAME, init_scale=init_scale, growth_factor=growth_factor,
                         backoff_factor=backoff_factor, growth_interval=growth_interval, enabled=enabled)


def custom_fwd(fwd: Any = None, *, cast_inputs: Any = None) -> Any:
    """``torch.amp.custom_fwd(..., device_type='jax')``.  Deprecated."""
    _deprecated("custom_fwd(args...)", f"torch.amp.custom_fwd(args..., device_type='{DEVICE_NAME}')")
    return functools.partial(torch.amp.custom_fwd, device_type=DEVICE_NAME)(fwd=fwd, cast_inputs=cast_inputs)


def custom_bwd(bwd: Any) -> Any:
    """``torch.amp.custom_bwd(..., device_type='jax')``.  Deprecated."""
    _deprecated("custom_bwd(args...)", f"torch.amp.custom_bwd(args..., device_type='{DEVICE_NAME}')")
    return functools.partial(torch.amp.custom_bwd, device_type=DEVICE_NAME)(bwd)


def amp_definitely_not_available() -> bool:
    """True when there is no 'jax' device here (torch.cuda.amp's helper)."""
    return not getattr(torch, DEVICE_NAME).is_available()
